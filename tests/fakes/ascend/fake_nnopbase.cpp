// Fake libnnopbase.so: tensor and scalar descriptors (see fake_acl.h). Descriptors are copied into
// the executor when an op is prepared, so destroying them right after the launch (as the plugin
// does, and as CANN allows) is safe.
#include <cstring>

#include "fake_acl.h"

extern "C" {

FAKE_ACL_EXPORT aclTensor* aclCreateTensor(const int64_t* view_dims, uint64_t n_dims,
                                           aclDataType dtype, const int64_t* stride, int64_t offset,
                                           aclFormat format, const int64_t* storage_dims,
                                           uint64_t n_storage, void* data) {
  if (format != ACL_FORMAT_ND || (n_dims > 0 && (!view_dims || !stride))) return nullptr;
  auto* t = new aclTensor();
  t->dims.assign(view_dims, view_dims + n_dims);
  t->strides.assign(stride, stride + n_dims);
  t->offset = offset;
  t->dtype = dtype;
  t->data = data;
  t->storage_elems = 1;
  for (uint64_t i = 0; i < n_storage; ++i) t->storage_elems *= storage_dims[i];
  return t;
}

FAKE_ACL_EXPORT aclnnStatus aclDestroyTensor(const aclTensor* tensor) {
  delete tensor;
  return 0;
}

FAKE_ACL_EXPORT aclScalar* aclCreateScalar(void* value, aclDataType dtype) {
  auto* s = new aclScalar();
  s->dtype = dtype;
  if (dtype == ACL_FLOAT) {
    float v;
    std::memcpy(&v, value, sizeof v);
    s->value = v;
  } else if (dtype == ACL_INT32) {
    int32_t v;
    std::memcpy(&v, value, sizeof v);
    s->value = v;
  } else {
    delete s;
    return nullptr;
  }
  return s;
}

FAKE_ACL_EXPORT aclnnStatus aclDestroyScalar(const aclScalar* scalar) {
  delete scalar;
  return 0;
}

}  // extern "C"

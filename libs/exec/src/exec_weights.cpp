// Reading and replacing initializers between runs (Executor::set_weight / weight), what a training
// loop needs to hand the optimizer's updated weights back.
//
// Before the first run a weight is still the decoded host copy in Impl::weights; afterwards its
// slot holds it (and the host copy is dropped), unless offload keeps it in the host pool. A new
// value goes where the weight currently lives; a slot's version is bumped so that cached nodes
// reading it (exec_prepare.cpp, "Constant folding across runs") recompute.
#include <fmt/core.h>

#include <cstring>

#include "exec_internal.h"

namespace hp::exec {

std::pair<int, HostTensor*> find_weight(Executor::Impl& im, const std::string& name) {
  auto it = im.tensor_ids.find(name);
  if (it == im.tensor_ids.end()) return {-1, nullptr};
  for (auto& [id, h] : im.weights)
    if (id == it->second) return {id, &h};
  return {-1, nullptr};
}

namespace {

/// A weight the executor does not hold (exec_gather.cpp): its value is the source's.
Error lent(const std::string& name) {
  return Error(Errc::bad_input,
               "the weight comes from the executor's weight source, which holds its value", name);
}

}  // namespace

Status Executor::set_weight(const std::string& name, const HostTensor& value) {
  Impl& im = *impl_;
  auto [id, host] = find_weight(im, name);
  if (id < 0) return Error(Errc::bad_input, "the model has no initializer of this name", name);
  if (gathered_weight(im, id)) return lent(name);
  if (value.dtype != host->dtype || value.dims != host->dims)
    return Error(
        Errc::bad_input,
        fmt::format("new value is {}{}, the initializer is {}{}", dtype_label(value.dtype),
                    dims_label(value.dims), dtype_label(host->dtype), dims_label(host->dims)),
        name);
  if (value.data.size() != static_cast<std::size_t>(value.numel() * dtype_size(value.dtype)))
    return Error(Errc::bad_input, "new value's data does not match its dims", name);
  if (!im.weights_loaded || offload_keeps_on_host(im, id)) {
    host->data = value.data;
  } else {
    Slot& s = im.slots[static_cast<std::size_t>(id)];
    if (s.ptr[0] && s.bytes == value.data.size() && !s.ptr[1]) {
      if (s.bytes) std::memcpy(s.ptr[0], value.data.data(), s.bytes);
    } else {
      HP_TRY(im.load_tensor(id, value));  // drops a device replica: copied again when read
    }
  }
  ++im.slots[static_cast<std::size_t>(id)].version;
  im.slots[static_cast<std::size_t>(id)].weight_key = 0;  // no longer constant: never packed again
  return {};
}

float* Executor::host_weight(const std::string& name) {
  Impl& im = *impl_;
  auto [id, host] = find_weight(im, name);
  // Slot 0 is the cpu backend, whose device memory is host memory; a weight with a replica on the
  // primary device (slot 1) would be read from there.
  if (id < 0 || host->dtype != HP_F32 || !im.weights_loaded || offload_keeps_on_host(im, id) ||
      gathered_weight(im, id))
    return nullptr;
  Slot& s = im.slots[static_cast<std::size_t>(id)];
  if (!s.ptr[0] || s.ptr[1] || s.bytes != static_cast<std::size_t>(host->numel()) * sizeof(float))
    return nullptr;
  return static_cast<float*>(s.ptr[0]);
}

Status Executor::weight_written(const std::string& name) {
  Impl& im = *impl_;
  auto [id, host] = find_weight(im, name);
  if (id < 0) return Error(Errc::bad_input, "the model has no initializer of this name", name);
  ++im.slots[static_cast<std::size_t>(id)].version;
  im.slots[static_cast<std::size_t>(id)].weight_key = 0;  // no longer constant: never packed again
  return {};
}

Expected<HostTensor> Executor::weight(const std::string& name) {
  Impl& im = *impl_;
  auto [id, host] = find_weight(im, name);
  if (id < 0) return Error(Errc::bad_input, "the model has no initializer of this name", name);
  if (gathered_weight(im, id)) return lent(name);
  if (!im.weights_loaded || offload_keeps_on_host(im, id)) return *host;
  HP_ASSIGN_OR_RETURN(HostTensor h, im.to_host(id));
  h.name = name;
  return h;
}

}  // namespace hp::exec

// See hp/model/axes.h for what counts as a batch and a sequence axis.
#include "hp/model/axes.h"

#include <onnx/onnx_pb.h>

#include <set>

namespace hp::model {

InputAxes input_axes(const Model& m) {
  InputAxes a;
  const auto& g = m.proto->graph();
  std::set<std::string> inits;
  for (const auto& t : g.initializer()) inits.insert(t.name());
  bool all_static = true;
  std::int64_t first_static = 0;
  for (const auto& in : g.input()) {
    if (inits.count(in.name()) || !in.type().has_tensor_type()) continue;
    const auto& tt = in.type().tensor_type();
    const auto& shape = tt.shape();
    if (shape.dim_size() == 0) continue;
    const auto& d0 = shape.dim(0);
    if (d0.has_dim_value()) {
      if (first_static == 0) first_static = d0.dim_value();
    } else {
      all_static = false;
      if (a.batch_dim.empty() && d0.has_dim_param()) a.batch_dim = d0.dim_param();
    }
    const bool integer =
        tt.elem_type() == onnx::TensorProto::INT64 || tt.elem_type() == onnx::TensorProto::INT32;
    const bool seq_like = (shape.dim_size() == 2 && integer) || shape.dim_size() == 3;
    if (!a.sequence && seq_like) {
      a.sequence = true;
      a.seq_input = in.name();
      const auto& d1 = shape.dim(1);
      if (d1.has_dim_value())
        a.static_seq = d1.dim_value();
      else if (d1.has_dim_param())
        a.seq_dim = d1.dim_param();
    }
  }
  if (all_static) a.static_batch = first_static;
  return a;
}

}  // namespace hp::model

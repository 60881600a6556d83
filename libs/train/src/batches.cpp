// BatchSource (batches.h).
#include "batches.h"

#include <fmt/core.h>
#include <onnx/onnx_pb.h>

namespace hp::train::detail {

void bind_input_dims(const onnx::GraphProto& g, const std::string& name,
                     const std::vector<std::int64_t>& dims, model::DimBindings& out) {
  for (const auto& v : g.input()) {
    if (v.name() != name || !v.type().tensor_type().has_shape()) continue;
    const auto& shape = v.type().tensor_type().shape();
    for (int k = 0; k < shape.dim_size() && k < static_cast<int>(dims.size()); ++k)
      if (!shape.dim(k).dim_param().empty())
        out.emplace(shape.dim(k).dim_param(), dims[static_cast<std::size_t>(k)]);
  }
}

model::DimBindings dims_of_tensors(const model::Model& forward,
                                   const std::vector<exec::HostTensor>& given) {
  const auto ios = exec::model_io(forward).inputs;
  model::DimBindings out;
  for (std::size_t k = 0; k < given.size(); ++k) {
    std::string name = given[k].name;
    if (name.empty() && k < ios.size()) name = ios[k].name;
    bind_input_dims(forward.proto->graph(), name, given[k].dims, out);
  }
  return out;
}

Expected<std::vector<exec::HostTensor>> slice_rows(std::vector<exec::HostTensor> batch,
                                                   std::int64_t rows, int part, int parts) {
  if (parts <= 1) return batch;
  if (rows <= 0 || rows % parts != 0)
    return Error(Errc::bad_input,
                 fmt::format("the global batch of {} rows does not split over {} data-parallel "
                             "ranks",
                             rows, parts),
                 "", "make the batch a multiple of dp");
  for (auto& t : batch) {
    if (t.dims.empty() || t.dims[0] != rows) continue;
    const std::size_t bytes = t.data.size() / static_cast<std::size_t>(parts);
    std::vector<unsigned char> mine(
        t.data.begin() + static_cast<std::ptrdiff_t>(bytes * part),
        t.data.begin() + static_cast<std::ptrdiff_t>(bytes * (part + 1)));
    t.data = std::move(mine);
    t.dims[0] = rows / parts;
  }
  return batch;
}

std::int64_t label_count(const exec::HostTensor& labels, LossKind loss) {
  if (loss != LossKind::cross_entropy) return labels.numel();
  std::int64_t n = 0;
  if (labels.dtype == HP_I64) {
    for (std::int64_t i = 0; i < labels.numel(); ++i) n += labels.as<std::int64_t>()[i] != -100;
  } else if (labels.dtype == HP_I32) {
    for (std::int64_t i = 0; i < labels.numel(); ++i) n += labels.as<std::int32_t>()[i] != -100;
  } else {
    n = labels.numel();
  }
  return n;
}

Expected<std::vector<exec::HostTensor>> read_input_dir(const TrainOptions& o) {
  if (o.inputs_dir.empty()) return std::vector<exec::HostTensor>{};
  HP_ASSIGN_OR_RETURN(auto given, exec::read_tensor_dir(o.inputs_dir, "input"));
  if (given.empty())
    return Error(Errc::bad_input, "no input_0.pb in the directory", o.inputs_dir.string());
  return given;
}

model::DimBindings data_dims(const TrainOptions& o, const model::Model& forward,
                             const std::vector<exec::HostTensor>& batch) {
  if (o.data_file.empty()) return dims_of_tensors(forward, batch);
  model::DimBindings dims;
  const auto ios = exec::model_io(forward).inputs;
  if (!ios.empty()) bind_input_dims(forward.proto->graph(), ios[0].name, {o.batch, o.seq}, dims);
  return dims;
}

Expected<BatchSource> BatchSource::open(const TrainOptions& o, const exec::Executor& ex,
                                        const std::string& labels,
                                        std::vector<exec::HostTensor> batch) {
  BatchSource s;
  std::vector<exec::GraphIO> ins;
  for (const auto& in : ex.inputs())
    if (in.name != kLossScaleInput) ins.push_back(in);
  if (!o.inputs_dir.empty()) {
    HP_ASSIGN_OR_RETURN(s.fixed_, exec::bind_inputs(ins, std::move(batch), o.inputs_dir.string()));
    s.tokens_ = s.fixed_.back().numel();
    return s;
  }
  // A token stream feeds a model with one integer input [batch, seq]; the labels are the next
  // tokens.
  if (ins.size() != 2)
    return Error(Errc::bad_input,
                 fmt::format("--data feeds models with one token-id input; this one has {} inputs",
                             ins.size() - 1),
                 o.model.string());
  if (ins[0].onnx_type != 7)  // INT64: what exporters give token ids
    return Error(Errc::bad_input,
                 fmt::format("--data needs an int64 token-id input; '{}' is {}", ins[0].name,
                             exec::dtype_label(ins[0].dtype)),
                 o.model.string());
  if (o.batch <= 0 || o.seq <= 0)
    return Error(Errc::bad_input,
                 "--data needs the batch and sequence length ([workload] global_batch and seq)");
  HP_ASSIGN_OR_RETURN(auto stream, TokenStream::open(o.data_file, o.token_bytes, o.seq));
  s.stream_ = std::move(stream);
  s.batch_ = o.batch;
  s.seq_ = o.seq;
  s.seed_ = o.seed;
  s.input_ = ins[0].name;
  s.labels_ = labels;
  s.tokens_ = o.batch * o.seq;
  return s;
}

Expected<std::vector<exec::HostTensor>> BatchSource::batch(std::int64_t position) const {
  if (!stream_) return fixed_;
  HP_ASSIGN_OR_RETURN(
      auto b, token_batch(*stream_, batch_, seq_, seed_, position, vocab_, input_, labels_));
  return b;
}

}  // namespace hp::train::detail

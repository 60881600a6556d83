// BatchSource (batches.h).
#include "batches.h"

#include <fmt/core.h>
#include <onnx/onnx_pb.h>

#include <set>

namespace hp::train::detail {

namespace {

/// Binds the dim_params of graph input `v` to `dims` (what the data has).
void bind_dims(const onnx::ValueInfoProto& v, const std::vector<std::int64_t>& dims,
               model::DimBindings& out) {
  if (!v.type().has_tensor_type() || !v.type().tensor_type().has_shape()) return;
  const auto& shape = v.type().tensor_type().shape();
  for (int k = 0; k < shape.dim_size() && k < static_cast<int>(dims.size()); ++k)
    if (shape.dim(k).has_dim_param() && !shape.dim(k).dim_param().empty())
      out.emplace(shape.dim(k).dim_param(), dims[static_cast<std::size_t>(k)]);
}

}  // namespace

Expected<model::DimBindings> data_dims(const TrainOptions& o, const model::Model& forward) {
  const auto& g = forward.proto->graph();
  std::set<std::string> inits;
  for (const auto& t : g.initializer()) inits.insert(t.name());
  std::vector<const onnx::ValueInfoProto*> ins;
  for (const auto& v : g.input())
    if (!inits.count(v.name())) ins.push_back(&v);
  model::DimBindings dims;
  if (!o.data_file.empty()) {
    if (!ins.empty()) bind_dims(*ins[0], {o.batch, o.seq}, dims);
    return dims;
  }
  if (o.inputs_dir.empty()) return dims;
  HP_ASSIGN_OR_RETURN(auto given, exec::read_tensor_dir(o.inputs_dir, "input"));
  for (std::size_t k = 0; k < given.size(); ++k) {
    const onnx::ValueInfoProto* v = nullptr;
    for (const auto* in : ins)
      if (in->name() == given[k].name) v = in;
    if (!v && given[k].name.empty() && k < ins.size()) v = ins[k];
    if (v) bind_dims(*v, given[k].dims, dims);
  }
  return dims;
}

Expected<BatchSource> BatchSource::open(const TrainOptions& o, const exec::Executor& ex,
                                        const std::string& labels) {
  BatchSource s;
  const auto& ins = ex.inputs();
  if (o.inputs_dir.empty() == o.data_file.empty())
    return Error(Errc::usage,
                 "give exactly one of --inputs DIR (one batch) and --data FILE (a "
                 "token stream)");
  if (!o.inputs_dir.empty()) {
    HP_ASSIGN_OR_RETURN(auto given, exec::read_tensor_dir(o.inputs_dir, "input"));
    if (given.empty())
      return Error(Errc::bad_input, "no input_0.pb in the directory", o.inputs_dir.string());
    HP_ASSIGN_OR_RETURN(s.fixed_, exec::bind_inputs(ins, std::move(given), o.inputs_dir.string()));
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

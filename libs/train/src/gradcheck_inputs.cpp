// The inputs of a gradient check (gradcheck_inputs.h).
//
// Generated shapes: a symbolic dim is 2 on the first axis (the batch) and 5 elsewhere, the same
// symbol the same value across inputs, so "batch" and "seq" shared by several inputs agree. Token
// ids must index the embedding they feed, so an integer input is generated only when a Gather reads
// it as the indices of an initializer table (through Identity aliases): uniform in [0, rows).
#include <fmt/core.h>
#include <onnx/onnx_pb.h>

#include <cstring>
#include <map>

#include "batches.h"
#include "gradcheck_inputs.h"
#include "hp/plugin/hp_plugin.h"

namespace hp::train::detail {

namespace {

/// Rows of the initializer table a Gather reads `input` from as indices; 0 when none does.
std::int64_t table_rows(const onnx::GraphProto& g, const std::string& input) {
  std::map<std::string, std::string> alias;  // Identity output -> its input
  for (const auto& n : g.node())
    if (n.op_type() == "Identity" && n.input_size() == 1 && n.output_size() == 1)
      alias[n.output(0)] = n.input(0);
  for (const auto& n : g.node()) {
    if (n.op_type() != "Gather" || n.input_size() < 2 || n.input(1) != input) continue;
    std::string table = n.input(0);
    for (int hops = 0; hops < 16 && alias.count(table); ++hops) table = alias[table];
    for (const auto& t : g.initializer())
      if (t.name() == table && t.dims_size() >= 1) {
        std::int64_t axis = 0;
        for (const auto& a : n.attribute())
          if (a.name() == "axis") axis = a.i();
        if (axis < 0) axis += t.dims_size();
        if (axis >= 0 && axis < t.dims_size()) return t.dims(static_cast<int>(axis));
      }
  }
  return 0;
}

/// The dims of graph input `name` with symbolic dims chosen (see the file comment).
std::vector<std::int64_t> choose_dims(const onnx::GraphProto& g, const exec::GraphIO& io,
                                      std::map<std::string, std::int64_t>& symbols) {
  std::vector<std::int64_t> dims = io.dims;
  const onnx::TensorShapeProto* shape = nullptr;
  for (const auto& v : g.input())
    if (v.name() == io.name && v.type().has_tensor_type() && v.type().tensor_type().has_shape())
      shape = &v.type().tensor_type().shape();
  for (std::size_t k = 0; k < dims.size(); ++k) {
    if (dims[k] >= 0) continue;
    const std::int64_t dflt = k == 0 ? 2 : 5;
    std::string sym;
    if (shape && static_cast<int>(k) < shape->dim_size())
      sym = shape->dim(static_cast<int>(k)).dim_param();
    dims[k] = sym.empty() ? dflt : symbols.emplace(sym, dflt).first->second;
  }
  return dims;
}

exec::HostTensor make(const std::string& name, int dtype, std::vector<std::int64_t> dims) {
  exec::HostTensor t;
  t.name = name;
  t.dtype = dtype;
  t.dims = std::move(dims);
  t.data.resize(static_cast<std::size_t>(t.numel() * exec::dtype_size(dtype)));
  return t;
}

Expected<exec::HostTensor> generate(const onnx::GraphProto& g, const exec::GraphIO& io,
                                    std::map<std::string, std::int64_t>& symbols, Normal& rng) {
  if (!io.has_shape)
    return Error(Errc::bad_input,
                 fmt::format("input '{}' has no declared shape to generate values at", io.name),
                 io.name, "give the inputs with --inputs DIR (input_K.pb files)");
  exec::HostTensor t = make(io.name, io.dtype, choose_dims(g, io, symbols));
  if (io.dtype == HP_F64) {
    for (std::int64_t i = 0; i < t.numel(); ++i) t.as<double>()[i] = rng();
    return t;
  }
  if (io.dtype == HP_I64 || io.dtype == HP_I32) {
    const std::int64_t rows = table_rows(g, io.name);
    if (rows < 1)
      return Error(Errc::bad_input,
                   fmt::format("cannot generate integer input '{}': no Gather reads it as the "
                               "indices of an initializer table (token ids)",
                               io.name),
                   io.name, "give the inputs with --inputs DIR (input_K.pb files)");
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      const std::int64_t v = rng.below(rows);
      if (io.dtype == HP_I64)
        t.as<std::int64_t>()[i] = v;
      else
        t.as<std::int32_t>()[i] = static_cast<std::int32_t>(v);
    }
    return t;
  }
  return Error(
      Errc::bad_input,
      fmt::format("cannot generate input '{}' of type {}", io.name, exec::dtype_label(io.dtype)),
      io.name, "give the inputs with --inputs DIR (input_K.pb files)");
}

/// float32 tensors read from files become float64, as the model does.
void widen(exec::HostTensor& t) {
  if (t.dtype != HP_F32) return;
  exec::HostTensor w = make(t.name, HP_F64, t.dims);
  for (std::int64_t i = 0; i < t.numel(); ++i) w.as<double>()[i] = t.as<float>()[i];
  t = std::move(w);
}

/// Labels at the logits' shape on `data` (one run of the float64 forward model).
Expected<exec::HostTensor> make_labels(const model::Model& fwd64, const exec::ExecOptions& b,
                                       const std::vector<exec::HostTensor>& data,
                                       const GradSpec& spec, Normal& rng) {
  HP_ASSIGN_OR_RETURN(auto fx, exec::Executor::create(fwd64, b));
  HP_ASSIGN_OR_RETURN(auto outs, fx->run(data));
  const exec::HostTensor* y = nullptr;
  for (std::size_t i = 0; i < fx->outputs().size(); ++i)
    if (fx->outputs()[i].name == spec.logits) y = &outs[i];
  if (!y || y->dims.empty())
    return Error(Errc::bad_input,
                 fmt::format("the logits '{}' are not a tensor of rank >= 1", spec.logits),
                 fwd64.path.string());
  if (spec.loss == LossKind::mse) {
    exec::HostTensor t = make(spec.labels, HP_F64, y->dims);
    for (std::int64_t i = 0; i < t.numel(); ++i) t.as<double>()[i] = rng();
    return t;
  }
  const std::int64_t classes = y->dims.back();
  exec::HostTensor t =
      make(spec.labels, HP_I64, std::vector<std::int64_t>(y->dims.begin(), y->dims.end() - 1));
  for (std::int64_t i = 0; i < t.numel(); ++i) t.as<std::int64_t>()[i] = rng.below(classes);
  return t;
}

}  // namespace

Expected<model::DimBindings> gradcheck_dims(const model::Model& fwd64,
                                            const std::filesystem::path& dir) {
  const auto& g = fwd64.proto->graph();
  const std::vector<exec::GraphIO> ios = exec::model_io(fwd64).inputs;
  model::DimBindings out;
  if (dir.empty()) {
    std::map<std::string, std::int64_t> symbols;
    for (const auto& io : ios) bind_input_dims(g, io.name, choose_dims(g, io, symbols), out);
    return out;
  }
  HP_ASSIGN_OR_RETURN(auto given, exec::read_tensor_dir(dir, "input"));
  return dims_of_tensors(fwd64, given);
}

Expected<CheckInputs> gradcheck_inputs(const model::Model& fwd64,
                                       const std::vector<exec::GraphIO>& all,
                                       const exec::ExecOptions& backends,
                                       const std::filesystem::path& dir, const GradSpec& spec,
                                       std::uint64_t seed) {
  if (all.empty() || all.back().name != spec.labels)
    return Error(Errc::internal, "the gradient model's last input is not the labels");
  const std::vector<exec::GraphIO> data_ios(all.begin(), all.end() - 1);
  Normal rng(seed);
  CheckInputs out;
  if (!dir.empty()) {
    HP_ASSIGN_OR_RETURN(auto given, exec::read_tensor_dir(dir, "input"));
    for (auto& t : given) widen(t);
    bool has_labels = given.size() == all.size();
    for (const auto& t : given) has_labels = has_labels || t.name == spec.labels;
    if (has_labels) {
      HP_ASSIGN_OR_RETURN(out.tensors, exec::bind_inputs(all, std::move(given), dir.string()));
      return out;
    }
    HP_ASSIGN_OR_RETURN(out.tensors, exec::bind_inputs(data_ios, std::move(given), dir.string()));
  } else {
    std::map<std::string, std::int64_t> symbols;
    for (const auto& io : data_ios) {
      HP_ASSIGN_OR_RETURN(auto t, generate(fwd64.proto->graph(), io, symbols, rng));
      out.tensors.push_back(std::move(t));
    }
  }
  out.generated = true;
  HP_ASSIGN_OR_RETURN(auto labels, make_labels(fwd64, backends, out.tensors, spec, rng));
  out.tensors.push_back(std::move(labels));
  return out;
}

}  // namespace hp::train::detail

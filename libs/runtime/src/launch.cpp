// hp launch MODEL.onnx and hp verify MODEL.onnx: open the backends, load the model with its weights,
// prepare the executor (which lists unsupported ops before any work), bind the input files, run, and
// write or compare the outputs.
#include "hp/runtime/launch.h"

#include <fmt/core.h>

#include <cmath>

#include "hp/plugin/registry.h"

namespace hp::runtime {

Expected<Backends> open_backends(const std::string& name, int threads,
                                 const std::vector<std::filesystem::path>& plugin_paths) {
  if (threads < 0) return Error(Errc::usage, "--threads must be at least 1");
  plugin::SearchOptions so;
  so.plugin_paths = plugin_paths;
  if (threads > 0) so.open_options.push_back(fmt::format("threads={}", threads));
  auto reg = plugin::discover(so);
  if (!reg) return std::move(reg).error();
  Backends b;
  b.cpu = reg->find("cpu");
  if (!b.cpu)
    return Error(Errc::unavailable, "the cpu backend plugin was not found or did not load", "",
                 "'hp devices -v' shows where hp looked");
  if (name.empty()) {
    auto loaded = reg->loaded();
    b.primary = loaded.empty() ? b.cpu : loaded.front();
    return b;
  }
  b.primary = reg->find(name);
  if (!b.primary) {
    const plugin::PluginRecord* rec = reg->record(name);
    return Error(Errc::unavailable,
                 rec ? fmt::format("backend '{}' is unavailable: {}", name, rec->reason)
                     : fmt::format("backend '{}' was not found", name),
                 "", "'hp devices' lists the backends found and why any was rejected");
  }
  return b;
}

namespace {

struct Prepared {
  Backends backends;
  std::unique_ptr<Executor> exec;
  std::vector<HostTensor> inputs;
};

Expected<Prepared> prepare(const std::filesystem::path& model_path, const std::filesystem::path& inputs,
                           const std::string& backend, int threads, const std::vector<std::filesystem::path>& paths) {
  Prepared p;
  auto b = open_backends(backend, threads, paths);
  if (!b) return std::move(b).error();
  p.backends = *b;
  model::LoadOptions lo;
  lo.mode = model::LoadMode::require_data;
  auto m = model::load_model(model_path, lo);
  if (!m) return std::move(m).error();
  auto ex = Executor::create(*m, {p.backends.primary, p.backends.cpu, nullptr});
  if (!ex) return std::move(ex).error();
  p.exec = std::move(*ex);
  auto given = read_tensor_dir(inputs, "input");
  if (!given) return std::move(given).error();
  auto bound = bind_inputs(p.exec->inputs(), std::move(*given), inputs.string());
  if (!bound) return std::move(bound).error();
  p.inputs = std::move(*bound);
  return p;
}

std::string stats_line(const ExecStats& s, const std::string& backend) {
  return fmt::format("ran {} nodes on {} ({} on the cpu fallback) in {:.3f} s; peak tensor memory {:.2f} MiB "
                     "(weights {:.2f} MiB)\n",
                     s.nodes, backend, s.nodes_on_fallback, s.seconds, static_cast<double>(s.peak_bytes) / (1 << 20),
                     static_cast<double>(s.weight_bytes) / (1 << 20));
}

}  // namespace

Expected<LaunchReport> launch(const LaunchOptions& o) {
  if (o.target.extension() != ".onnx")
    return Error(Errc::not_implemented, "'hp launch RECIPE.toml' is not implemented yet", o.target.string(),
                 "multi-rank launches arrive with issue #6; 'hp launch MODEL.onnx' runs one rank");
  if (o.inputs.empty() || o.outputs.empty())
    return Error(Errc::usage, "'hp launch MODEL.onnx' needs --inputs DIR and --outputs DIR");
  if (o.dry_run) return Error(Errc::not_implemented, "--dry-run applies to recipes (issue #6)");
  auto p = prepare(o.target, o.inputs, o.backend, o.threads, o.plugin_paths);
  if (!p) return std::move(p).error();
  auto outs = p->exec->run(p->inputs);
  if (!outs) return std::move(outs).error();
  HP_TRY(write_tensor_dir(o.outputs, *outs));
  LaunchReport r;
  r.stats = p->exec->stats();
  r.summary = stats_line(r.stats, p->backends.primary->name()) +
              fmt::format("wrote {} output{} to {}\n", outs->size(), outs->size() == 1 ? "" : "s", o.outputs.string());
  return r;
}

OutputCheck compare_tensors(const HostTensor& got, const HostTensor& want, double rtol, double atol) {
  OutputCheck c;
  c.name = want.name.empty() ? got.name : want.name;
  if (got.dtype != want.dtype) {
    c.problem = fmt::format("dtype {} but expected {}", dtype_label(got.dtype), dtype_label(want.dtype));
    return c;
  }
  if (got.dims != want.dims) {
    c.problem = fmt::format("shape {} but expected {}", dims_label(got.dims), dims_label(want.dims));
    return c;
  }
  const std::int64_t n = want.numel();
  auto value = [](const HostTensor& t, std::int64_t i) -> double {
    switch (t.dtype) {
      case HP_F32: return t.as<float>()[i];
      case HP_F64: return t.as<double>()[i];
      case HP_I32: return t.as<std::int32_t>()[i];
      case HP_I64: return static_cast<double>(t.as<std::int64_t>()[i]);
      default: return t.as<std::uint8_t>()[i];
    }
  };
  const bool exact = got.dtype != HP_F32 && got.dtype != HP_F64;
  for (std::int64_t i = 0; i < n; ++i) {
    const double g = value(got, i), w = value(want, i);
    if (std::isnan(g) && std::isnan(w)) continue;
    if (std::isinf(w) && g == w) continue;
    const double d = std::fabs(g - w);
    if (std::isnan(d)) {
      ++c.bad;
      c.max_abs = INFINITY;
      continue;
    }
    c.max_abs = std::max(c.max_abs, d);
    if (w != 0) c.max_rel = std::max(c.max_rel, d / std::fabs(w));
    if (exact ? d != 0 : d > atol + rtol * std::fabs(w)) ++c.bad;
  }
  return c;
}

bool ModelVerifyReport::ok() const {
  for (const auto& o : outputs)
    if (!o.ok()) return false;
  return true;
}

std::string ModelVerifyReport::format() const {
  std::string s;
  for (const auto& o : outputs) {
    if (!o.problem.empty())
      s += fmt::format("{}: MISMATCH: {}\n", o.name, o.problem);
    else
      s += fmt::format("{}: max abs error {:.3g}, max rel error {:.3g}: {}\n", o.name, o.max_abs, o.max_rel,
                       o.ok() ? "ok" : fmt::format("MISMATCH ({} elements out of tolerance)", o.bad));
  }
  s += stats_line(stats, backend);
  return s;
}

Expected<ModelVerifyReport> verify_model(const ModelVerifyOptions& o) {
  if (o.inputs.empty() || o.expected.empty())
    return Error(Errc::usage, "'hp verify MODEL.onnx' needs --inputs DIR and --expected DIR");
  if (!(o.rtol >= 0) || !(o.atol >= 0)) return Error(Errc::usage, "--rtol and --atol must be non-negative");
  auto want = read_tensor_dir(o.expected, "output");
  if (!want) return std::move(want).error();
  auto p = prepare(o.model, o.inputs, o.backend, o.threads, o.plugin_paths);
  if (!p) return std::move(p).error();
  if (want->size() != p->exec->outputs().size())
    return Error(Errc::bad_input,
                 fmt::format("the graph has {} outputs, {} holds {} output_K.pb files", p->exec->outputs().size(),
                             o.expected.string(), want->size()));
  auto got = p->exec->run(p->inputs);
  if (!got) return std::move(got).error();
  ModelVerifyReport r;
  r.stats = p->exec->stats();
  r.backend = p->backends.primary->name();
  for (std::size_t k = 0; k < got->size(); ++k) {
    (*want)[k].name = (*got)[k].name;
    r.outputs.push_back(compare_tensors((*got)[k], (*want)[k], o.rtol, o.atol));
  }
  return r;
}

}  // namespace hp::runtime

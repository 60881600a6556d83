// check_gradients (gradcheck.h): the float64 gradient model against central differences.
//
// Steps, in order:
//   1. the gradient model as training builds it (build_grad_graph), from the forward model already
//      rewritten by to_float64, so that the constants the rules emit are double too (to_float64 of
//      the gradient model then finds nothing left to do, except in a model check_grad_graph is
//      handed directly; the float64 forward also gives the logits' shape for generated labels);
//   2. the inputs: read (float32 tensors widened to float64) or generated (gradcheck_inputs.cpp);
//   3. one run at theta: the loss and every gradient g;
//   4. per direction: d normal per element over every trainable tensor, scaled to unit 2-norm as a
//      whole; the losses at theta + h d and theta - h d (two runs with the weights moved through
//      Executor::set_weight), compared with <g, d>;
//   5. theta written back, so the executor ends as it began.
// The random numbers are splitmix64 + Box-Muller (gradcheck_inputs.h), the same on every platform
// for a seed.
#include <fmt/core.h>
#include <onnx/onnx_pb.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "gradcheck_inputs.h"
#include "hp/exec/backends.h"
#include "hp/exec/executor.h"
#include "hp/plugin/hp_plugin.h"
#include "hp/train/gradcheck.h"

namespace hp::train {

namespace {

double dot(const exec::HostTensor& a, const std::vector<double>& b) {
  double s = 0;
  const double* p = a.as<double>();
  for (std::size_t i = 0; i < b.size(); ++i) s += p[i] * b[i];
  return s;
}

/// theta + s * d for one tensor.
exec::HostTensor moved(const exec::HostTensor& theta, const std::vector<double>& d, double s) {
  exec::HostTensor t = theta;
  double* p = t.as<double>();
  for (std::size_t i = 0; i < d.size(); ++i) p[i] += s * d[i];
  return t;
}

struct Checker {
  const GradCheckOptions& o;
  const GradGraph& gg;
  std::unique_ptr<exec::Executor> ex;
  std::vector<exec::HostTensor> inputs;
  std::vector<exec::HostTensor> theta;  ///< per gg.params

  Expected<double> loss_at(const std::string& what) {
    HP_ASSIGN_OR_RETURN(auto outs, ex->run(inputs));
    const double l = outs.at(0).as<double>()[0];
    if (!std::isfinite(l))
      return Error(Errc::runtime, fmt::format("the loss is {} at {}", l, what), o.model.string(),
                   "check the inputs (token ids inside the vocabulary, finite values)");
    return l;
  }

  Status set_all(const std::vector<std::vector<double>>& d, double s) {
    for (std::size_t k = 0; k < theta.size(); ++k)
      HP_TRY(ex->set_weight(gg.params[k], s == 0 ? theta[k] : moved(theta[k], d[k], s)));
    return {};
  }

  /// Direction `k` (1-based in messages): d drawn from `rng`, <g, d> against the central
  /// difference with step `h`, relative to max(|a|, |n|, floor).
  Expected<DirectionCheck> direction(int k, const std::vector<const exec::HostTensor*>& g,
                                     detail::Normal& rng, double h, double floor) {
    std::vector<std::vector<double>> d(theta.size());
    double n2 = 0;
    for (std::size_t p = 0; p < theta.size(); ++p) {
      d[p].resize(static_cast<std::size_t>(theta[p].numel()));
      for (double& v : d[p]) {
        v = rng();
        n2 += v * v;
      }
    }
    const double inv = 1 / std::sqrt(n2);
    DirectionCheck dc;
    for (std::size_t p = 0; p < d.size(); ++p) {
      for (double& v : d[p]) v *= inv;
      dc.analytic += dot(*g[p], d[p]);
    }
    HP_TRY(set_all(d, h));
    HP_ASSIGN_OR_RETURN(const double lp, loss_at(fmt::format("theta + h d{}", k)));
    HP_TRY(set_all(d, -h));
    HP_ASSIGN_OR_RETURN(const double lm, loss_at(fmt::format("theta - h d{}", k)));
    dc.numeric = (lp - lm) / (2 * h);
    const double scale = std::max({std::abs(dc.analytic), std::abs(dc.numeric), floor});
    dc.rel_error = scale > 0 ? std::abs(dc.analytic - dc.numeric) / scale : 0;
    dc.ok = dc.rel_error <= o.tolerance;
    return dc;
  }
};

std::string fmt_g(double v) { return fmt::format("{:.12e}", v); }

}  // namespace

bool GradCheckReport::ok() const {
  if (directions.empty()) return false;
  for (const auto& d : directions)
    if (!d.ok) return false;
  return true;
}

double GradCheckReport::worst() const {
  double w = 0;
  for (const auto& d : directions) w = std::max(w, d.rel_error);
  return w;
}

std::string GradCheckReport::text() const {
  std::string s = fmt::format(
      "gradient check of {} in float64{}\n  loss {:.12g} at {} parameters in {} tensors, |g| = "
      "{:.6g}, step h = {:.3g}\n",
      model, generated_inputs ? " (generated inputs)" : "", loss, parameters, params.size(),
      grad_norm, step);
  for (std::size_t i = 0; i < directions.size(); ++i) {
    const auto& d = directions[i];
    s += fmt::format("  direction {}: <g, d> {}  finite difference {}  relative error {:.2e}  {}\n",
                     i + 1, fmt_g(d.analytic), fmt_g(d.numeric), d.rel_error,
                     d.ok ? "ok" : "MISMATCH");
  }
  for (const auto& [name, why] : untrained) s += fmt::format("  untrained '{}': {}\n", name, why);
  for (const auto& [name, r] : tied)
    s += fmt::format("  tied '{}': read by {} nodes, one gradient\n", name, r);
  s += fmt::format("{}: worst relative error {:.2e} (tolerance {:.0e})\n",
                   ok() ? "gradients match" : "gradients differ", worst(), tolerance);
  return s;
}

std::string GradCheckReport::json() const {
  nlohmann::json dirs = nlohmann::json::array();
  for (const auto& d : directions)
    dirs.push_back({{"analytic", d.analytic},
                    {"numeric", d.numeric},
                    {"rel_error", d.rel_error},
                    {"ok", d.ok}});
  nlohmann::json j = {{"ok", ok()},
                      {"model", model},
                      {"loss", loss},
                      {"step", step},
                      {"tolerance", tolerance},
                      {"parameters", parameters},
                      {"grad_norm", grad_norm},
                      {"floor", floor},
                      {"params", params},
                      {"untrained", untrained},
                      {"tied", tied},
                      {"generated_inputs", generated_inputs},
                      {"directions", dirs},
                      {"worst_rel_error", worst()}};
  return j.dump();
}

Error GradCheckReport::mismatch() const {
  std::size_t k = 0;
  for (std::size_t i = 0; i < directions.size(); ++i)
    if (directions[i].rel_error > directions[k].rel_error) k = i;
  const auto& d = directions.empty() ? DirectionCheck{} : directions[k];
  return Error(Errc::mismatch,
               fmt::format("the gradients differ from finite differences: direction {} has <g, d> "
                           "{} and a finite difference {} (relative error {:.2e} > {:.0e})",
                           k + 1, fmt_g(d.analytic), fmt_g(d.numeric), d.rel_error, tolerance),
               model,
               "a gradient rule or an hp.train kernel is wrong for an op of this model (or --eps "
               "is far from 3e-6); hp verify --grad on a smaller model with the same ops narrows "
               "it down");
}

Expected<GradCheckReport> check_grad_graph(const model::Model& forward, const GradGraph& gg,
                                           const GradCheckOptions& o) {
  if (o.directions < 1) return Error(Errc::usage, "--directions must be at least 1");
  if (!(o.eps > 0) || !(o.tolerance > 0))
    return Error(Errc::usage, "the step and the tolerance must be positive");
  if (gg.params.empty())
    return Error(Errc::bad_input, "the model has no trainable tensor on a path to the loss",
                 forward.path.string(), "check --logits and --frozen");
  // 1. Both models in float64.
  HP_ASSIGN_OR_RETURN(model::Model fwd64, to_float64(forward));
  HP_ASSIGN_OR_RETURN(model::Model grad64, to_float64(gg.model));
  std::vector<std::filesystem::path> paths(o.plugin_paths.begin(), o.plugin_paths.end());
  HP_ASSIGN_OR_RETURN(auto b,
                      exec::open_backends(o.backend.empty() ? "cpu" : o.backend, o.threads, paths));
  // 2. Inputs (and labels).
  GradCheckReport r;
  r.model = forward.path.string();
  r.tolerance = o.tolerance;
  r.params = gg.params;
  r.untrained = gg.untrained;
  r.tied = gg.tied;
  Checker c{o, gg, nullptr, {}, {}};
  HP_ASSIGN_OR_RETURN(
      auto in, detail::gradcheck_inputs(fwd64, exec::model_io(grad64).inputs, {b.primary, b.cpu},
                                        o.inputs, o.grad, o.seed));
  c.inputs = std::move(in.tensors);
  r.generated_inputs = in.generated;
  HP_ASSIGN_OR_RETURN(c.ex, exec::Executor::create(grad64, {b.primary, b.cpu, nullptr}));
  // 3. Loss and gradients at theta.
  HP_ASSIGN_OR_RETURN(auto outs, c.ex->run(c.inputs));
  const auto& outputs = c.ex->outputs();
  auto output = [&](const std::string& name) -> const exec::HostTensor* {
    for (std::size_t i = 0; i < outputs.size(); ++i)
      if (outputs[i].name == name) return &outs[i];
    return nullptr;
  };
  const exec::HostTensor* loss = output(gg.loss);
  if (!loss || loss->dtype != HP_F64 || loss->numel() != 1)
    return Error(Errc::internal, "the float64 gradient model has no float64 scalar loss output");
  r.loss = loss->as<double>()[0];
  if (!std::isfinite(r.loss))
    return Error(Errc::runtime, fmt::format("the loss is {} at the model's weights", r.loss),
                 r.model, "check the inputs (token ids inside the vocabulary, finite values)");
  std::vector<const exec::HostTensor*> g;
  double theta_norm2 = 0, g_norm2 = 0;
  for (std::size_t k = 0; k < gg.params.size(); ++k) {
    const exec::HostTensor* gk = output(gg.grads[k]);
    HP_ASSIGN_OR_RETURN(auto t, c.ex->weight(gg.params[k]));
    if (!gk || gk->dtype != HP_F64 || gk->numel() != t.numel() || t.dtype != HP_F64)
      return Error(Errc::internal,
                   fmt::format("gradient '{}' does not match its parameter", gg.grads[k]),
                   gg.params[k]);
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      theta_norm2 += t.as<double>()[i] * t.as<double>()[i];
      g_norm2 += gk->as<double>()[i] * gk->as<double>()[i];
    }
    r.parameters += t.numel();
    g.push_back(gk);
    c.theta.push_back(std::move(t));
  }
  r.grad_norm = std::sqrt(g_norm2);
  r.floor = r.grad_norm / std::sqrt(static_cast<double>(r.parameters)) / 10;
  r.step = o.eps * std::max(1.0, std::sqrt(theta_norm2));
  // 4. Directions.
  detail::Normal rng(o.seed ^ 0x6772616463686b00ull);  // "gradchk": apart from the inputs' stream
  for (int k = 1; k <= o.directions; ++k) {
    HP_ASSIGN_OR_RETURN(auto dc, c.direction(k, g, rng, r.step, r.floor));
    r.directions.push_back(dc);
  }
  // 5. The weights as they were.
  HP_TRY(c.set_all({}, 0));
  return r;
}

Expected<GradCheckReport> check_gradients(const GradCheckOptions& o) {
  model::LoadOptions lo;
  lo.mode = model::LoadMode::require_data;
  HP_ASSIGN_OR_RETURN(auto forward, model::load_model(o.model, lo));
  GradCheckOptions opts = o;
  if (opts.grad.logits.empty()) {
    if (forward.proto->graph().output_size() == 0)
      return Error(Errc::bad_input, "the model has no graph output", o.model.string());
    opts.grad.logits = forward.proto->graph().output(0).name();
  }
  // The rules' own constants (Erf's 2/sqrt(pi), GELU's) take the forward's element type: built
  // from the float32 forward they would be float32 numbers, off by up to 6e-8 relative, which the
  // comparison would report as gradient error.
  HP_ASSIGN_OR_RETURN(auto fwd64, to_float64(forward));
  // Shape inference at the dims the check runs at tells the rules the ranks behind dynamic
  // reshapes, as training binds its data's dims.
  HP_ASSIGN_OR_RETURN(auto dims, detail::gradcheck_dims(fwd64, opts.inputs));
  for (const auto& [k, v] : dims) opts.grad.dims.emplace(k, v);
  HP_ASSIGN_OR_RETURN(auto gg, build_grad_graph(fwd64, opts.grad));
  return check_grad_graph(fwd64, gg, opts);
}

}  // namespace hp::train

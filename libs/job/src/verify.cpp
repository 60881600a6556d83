// verify(): hp verify's steps in order (verify.h), each reported once.
#include "hp/job/verify.h"

#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include <algorithm>

#include "hp/job/group_flow.h"
#include "hp/job/job.h"
#include "hp/model/model.h"
#include "hp/shard/shard.h"
#include "single_rank.h"

namespace hp::job {
using exec::compare_tensors;
using exec::read_tensor_dir;
namespace fs = std::filesystem;

namespace {

Expected<VerifyReport> verify_model_target(const VerifyOptions& o) {
  ModelVerifyOptions mo;
  mo.model = o.target;
  mo.inputs = o.inputs;
  mo.expected = o.expected;
  mo.rtol = o.rtol;
  mo.atol = o.atol;
  mo.backend = o.backend;
  mo.threads = o.threads;
  mo.plugin_paths = o.plugin_paths;
  VerifyReport rep;
  rep.model_mode = true;
  HP_ASSIGN_OR_RETURN(rep.model, verify_model(mo));
  return rep;
}

// Static checks, flows, then the run, stopping at the first step that fails.
void verify_recipe_target(const VerifyOptions& o, VerifyReport& rep) {
  auto doc = recipe::read_recipe(o.target);
  if (!doc) {
    rep.failure = std::move(doc).error();
    return;
  }
  recipe::VerifyOptions so;
  so.recipe = o.target;
  so.preset_dirs = o.preset_dirs;
  auto checks = recipe::check_recipe(*doc, so);
  if (!checks) {
    rep.failure = std::move(checks).error();
    return;
  }
  // The Job takes the cluster the static checks already loaded (at the recipe's node count), rather
  // than resolving and reading the cluster file a second time.
  auto job = make_job(std::move(*doc), o.target);
  if (job && !job->recipe.cluster.empty()) job->cluster = checks->cluster;
  // The flows are a static fact of the recipe and its modules: a failure there is the checks'
  // failure.
  if (job && job->kind == JobKind::flow_groups) {
    if (Status flows = check_group_flows(*job); !flows.ok()) {
      rep.failure = std::move(flows).error();
      return;
    }
  }
  // A sharded-model recipe is only runnable if its model loads and partitions at the recipe's
  // dims and degrees: --static checks that too (an empty file or a text file is not a model).
  // Training without tensor or pipeline parallelism runs the whole model on every rank (data and
  // expert parallelism partition it themselves), so hp shard's static derivation, which needs
  // every shape known, does not apply: a Mixtral-style export's NonZero rows are decided by the
  // data. The model must still load.
  const bool whole_model =
      job && job->recipe.train && job->recipe.parallel.tp <= 1 && job->recipe.parallel.pp <= 1;
  if (job && job->kind == JobKind::sharded_model) {
    Status usable;
    if (!whole_model) {
      usable = shard::check_shardable(job->recipe, o.target);
    } else if (auto loaded = model::load_model(job->model_path()); !loaded) {
      usable = std::move(loaded).error();
    }
    if (!usable.ok()) {
      rep.failure = std::move(usable).error();
      return;
    }
  }
  rep.checks = std::move(*checks);
  if (o.static_only) return;
  if (!job) {
    rep.failure = std::move(job).error();
    return;
  }
  RecipeRunOptions ro = o.run;
  ro.inputs = o.inputs;
  ro.rtol = o.rtol;
  ro.atol = o.atol;
  ro.backend = o.backend;
  ro.threads = o.threads;
  ro.plugin_paths = o.plugin_paths;
  auto run = verify_recipe_run(*job, ro);
  if (!run)
    rep.failure = std::move(run).error();
  else
    rep.run = std::move(*run);
}

}  // namespace

bool VerifyReport::ok() const {
  if (model_mode) return model.ok();
  return !failure && (!run || run->ok());
}

std::string VerifyReport::text() const {
  if (model_mode) return model.format();
  std::string s;
  if (checks) s += recipe::format_verify_summary(*checks);
  if (run) s += run->format();
  return s;
}

std::string VerifyReport::json() const {
  if (model_mode) {
    // The same fields as a recipe run's outputs ("run".outputs), with the largest errors on top.
    nlohmann::ordered_json j{{"ok", model.ok()},
                             {"model", recipe.string()},
                             {"backend", model.backend},
                             {"max_abs", 0.0},
                             {"max_rel", 0.0}};
    j["outputs"] = nlohmann::ordered_json::array();
    for (const auto& o : model.outputs) {
      j["max_abs"] = std::max(j["max_abs"].get<double>(), o.max_abs);
      j["max_rel"] = std::max(j["max_rel"].get<double>(), o.max_rel);
      j["outputs"].push_back({{"name", o.name},
                              {"max_abs", o.max_abs},
                              {"max_rel", o.max_rel},
                              {"bad", o.bad},
                              {"problem", o.problem},
                              {"ok", o.ok()}});
    }
    return j.dump();
  }
  if (!checks) return recipe::format_verify_json(recipe, *failure);
  const std::string static_json = recipe::format_verify_json(recipe, *checks);
  if (failure) return add_run_json(static_json, *failure);
  if (run) return add_run_json(static_json, *run);
  return static_json;  // --static
}

Error VerifyReport::mismatch() const {
  if (model_mode)
    return Error(Errc::mismatch, "outputs differ from the expected ones beyond the tolerance",
                 recipe.string(), "see the per-output errors above");
  // The first check off names where to look: the first diverging step, else the first weight.
  std::string first;
  if (run)
    for (const auto& c : run->outputs)
      if (!c.ok()) {
        first = c.name;
        break;
      }
  if (run && run->training)
    return Error(Errc::mismatch,
                 fmt::format("the training job diverges from one rank (first: {})", first),
                 recipe.string(), "see the per-step losses and per-weight errors above");
  return Error(Errc::mismatch,
               fmt::format("the sharded job's outputs differ from the unsharded model's beyond the "
                           "tolerance{}",
                           first.empty() ? "" : fmt::format(" (first: {})", first)),
               recipe.string(), "see the per-output errors above");
}

Expected<VerifyReport> verify(const VerifyOptions& o) {
  if (o.target.extension() == ".onnx") {
    HP_ASSIGN_OR_RETURN(auto rep, verify_model_target(o));
    rep.recipe = o.target;
    return rep;
  }
  if (!o.expected.empty())
    return Error(
        Errc::usage,
        "--expected applies to MODEL.onnx; a recipe's outputs are compared with its unsharded "
        "model's");
  VerifyReport rep;
  rep.recipe = o.target;
  verify_recipe_target(o, rep);
  return rep;
}

// ---- MODEL.onnx ---------------------------------------------------------------------------

bool ModelVerifyReport::ok() const { return exec::all_ok(outputs); }

std::string ModelVerifyReport::format() const {
  std::string s;
  for (const auto& o : outputs) s += "" + exec::format_check(o) + "\n";
  s += stats_line(stats, backend);
  return s;
}

Expected<ModelVerifyReport> verify_model(const ModelVerifyOptions& o) {
  if (o.inputs.empty() || o.expected.empty())
    return Error(Errc::usage, "'hp verify MODEL.onnx' needs --inputs DIR and --expected DIR");
  if (!(o.rtol >= 0) || !(o.atol >= 0))
    return Error(Errc::usage, "--rtol and --atol must be non-negative");
  HP_ASSIGN_OR_RETURN(auto want, read_tensor_dir(o.expected, "output"));
  auto p = prepare_single_rank(o.model, o.inputs, o.backend, o.threads, o.plugin_paths);
  if (!p) return std::move(p).error();
  if (want.size() != p->exec->outputs().size())
    return Error(Errc::bad_input,
                 fmt::format("the graph has {} outputs, {} holds {} output_K.pb files",
                             p->exec->outputs().size(), o.expected.string(), want.size()));
  auto got = p->exec->run(p->inputs);
  if (!got) return std::move(got).error();
  ModelVerifyReport r;
  r.stats = p->exec->stats();
  r.backend = p->backends.primary->name();
  for (std::size_t k = 0; k < got->size(); ++k) {
    (want)[k].name = (*got)[k].name;
    r.outputs.push_back(compare_tensors((*got)[k], (want)[k], o.rtol, o.atol));
  }
  return r;
}

}  // namespace hp::job

// hp launch of a recipe with [train] (hp/job/train_run.h): everything the command line and the
// recipe say about a training run is checked here, before hp::train::train() loads anything, so a
// mistyped path or a missing option fails in milliseconds with the option's name rather than after
// the gradient model is built.
#include "hp/job/train_run.h"

#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <system_error>

#include "hp/job/predict.h"
#include "hp/recipe/toml_writer.h"
#include "hp/train/checkpoint.h"

namespace hp::job {
namespace fs = std::filesystem;

namespace {

// The batch and sequence length of --data windows: what the plan was made for ([workload]), else
// the dims the recipe binds under their usual names.
std::pair<std::int64_t, std::int64_t> batch_and_seq(const recipe::Recipe& r) {
  std::int64_t batch = 0, seq = 0;
  if (r.workload) batch = r.workload->global_batch, seq = r.workload->seq;
  auto dim = [&](const char* name) {
    auto it = r.dims.find(name);
    return it == r.dims.end() ? std::int64_t{0} : it->second;
  };
  if (batch <= 0) batch = dim("batch");
  if (seq <= 0) seq = dim("seq");
  return {batch, seq};
}

// Every layer of every stage whose policy recomputes it, in order, once.
std::vector<std::int64_t> recomputed_blocks(const recipe::Recipe& r) {
  std::vector<std::int64_t> blocks;
  for (const auto& st : r.stages)
    for (auto layer : st.layers)
      if (st.recompute_of(layer) != recipe::Recompute::none) blocks.push_back(layer);
  std::sort(blocks.begin(), blocks.end());
  blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
  return blocks;
}

Status must_exist(const fs::path& p, bool directory, const char* option) {
  std::error_code ec;
  const bool ok = directory ? fs::is_directory(p, ec) : fs::is_regular_file(p, ec);
  if (ok) return {};
  return Error(Errc::bad_input,
               fmt::format("{} '{}' {}", option, p.string(),
                           fs::exists(p, ec) ? (directory ? "is not a directory" : "is not a file")
                                             : "does not exist"),
               p.string());
}

// What hp plan's cost model predicts for one training step of the recipe, to read beside the
// measured median above it; the reason when it cannot price the recipe.
std::string predicted_line(const Job& job) {
  if (!job.cluster) return "";
  auto s = predicted_step(job.recipe, job.base_dir, *job.cluster, true);
  if (!s) return fmt::format("plan's prediction: none ({})\n", s.error().what.message);
  // The parts a run measures too, exposed communication per kind; zero parts are left out.
  std::string parts = fmt::format("compute {:.4f} s", s->compute + s->recompute);
  for (auto [v, name] : {std::pair{s->bubble, "bubble"},
                         {s->tp_exposed, "tp"},
                         {s->ep_exposed, "ep"},
                         {s->pp_exposed, "pp"},
                         {s->dp_exposed, "dp sync"},
                         {s->opt_exposed, "ZeRO gathers"},
                         {s->optimizer_step, "optimizer"}})
    if (v > 0) parts += fmt::format(", {} {:.4f} s", name, v);
  return fmt::format(
      "plan's prediction: {:.4f} s per training step ({}; hp plan's cost model on '{}', fp32, "
      "{})\n",
      s->iteration, parts, job.recipe.cluster, job.recipe.train->optimizer);
}

// Each boundary's tensors, "[a, b] | [c]".
std::string boundaries(const std::vector<std::vector<std::string>>& cuts) {
  std::string out;
  for (const auto& c : cuts) out += (out.empty() ? "" : " | ") + recipe::toml_string_array(c);
  return out;
}

}  // namespace

std::string training_option_given(const LaunchOptions& o) {
  if (!o.data.empty()) return "--data";
  if (o.token_bytes != 0) return "--token-bytes";
  if (o.seed >= 0) return "--seed";
  if (!o.metrics.empty()) return "--metrics";
  if (!o.trace.empty()) return "--trace";
  if (!o.timeline.empty()) return "--timeline";
  if (!o.save_model.empty()) return "--save-model";
  if (!o.checkpoint_dir.empty()) return "--checkpoint";
  if (o.checkpoint_every != 0) return "--checkpoint-every";
  if (!o.resume_dir.empty()) return "--resume";
  if (o.log_every != 0) return "--log-every";
  return "";
}

Expected<train::TrainOptions> train_options(const Job& job, const LaunchOptions& o) {
  const recipe::Recipe& r = job.recipe;
  if (!r.train) return Error(Errc::internal, "train_options on a recipe without [train]");
  const recipe::Train& t = *r.train;
  const std::string where = job.where.at("train");
  const bool pipeline = r.parallel.pp > 1;
  const bool tensor = r.parallel.tp > 1;
  if (!r.groups.empty())
    return Error(Errc::not_implemented,
                 "training runs one model on dp, tp, pp and ep ranks: the recipe has [train] and "
                 "[[groups]]",
                 where, "remove [[groups]], or remove [train] to run the model forward");
  if (const auto& p = r.parallel; p.expert_parallel > 1) {
    if (p.tp > 1)
      return Error(Errc::not_implemented,
                   fmt::format("expert parallelism trains beside data and pipeline parallelism, "
                               "ZeRO and HSDP only for now: the recipe has expert_parallel = {} "
                               "and tp = {}",
                               p.expert_parallel, p.tp),
                   where, "set tp = 1, or expert_parallel = 1");
    if (p.shard_group > 0 && p.shard_group % p.expert_parallel != 0 &&
        p.expert_parallel % p.shard_group != 0)
      return Error(Errc::bad_input,
                   fmt::format("shard_group = {} must be a multiple or a divisor of "
                               "expert_parallel = {}: each expert's holders are sharded within "
                               "the shard groups",
                               p.shard_group, p.expert_parallel),
                   where);
    if (p.dp % p.expert_parallel != 0)
      return Error(Errc::bad_input,
                   fmt::format("expert_parallel = {} must divide dp = {}: the expert groups are "
                               "carved out of the data-parallel ranks",
                               p.expert_parallel, p.dp),
                   where);
  }

  // Options of a sharded forward job, and of the MPI job when one process trains
  // (--allow-run-as-root is harmless and scripts pass it everywhere in containers, so it is
  // accepted).
  const bool one = r.ranks() == 1;
  const std::pair<bool, const char*> distributed[] = {
      {!o.outputs.empty(), "--outputs"},          {!o.shard_dir.empty(), "--shard-dir"},
      {one && !o.hostfile.empty(), "--hostfile"}, {one && o.launcher != "mpirun", "--launcher"},
      {one && o.timeout_s > 0, "--timeout"},      {one && !o.run_dir.empty(), "--run-dir"},
      {one && o.simulate, "--simulate"}};
  for (const auto& [given, name] : distributed)
    if (given)
      return Error(
          Errc::usage,
          fmt::format("{} does not apply to a training recipe{}", name, one ? " of one rank" : ""),
          job.recipe_path.string(),
          "use --save-model, --checkpoint and --metrics for what training writes");

  if (o.inputs.empty() == o.data.empty())
    return Error(
        Errc::usage,
        o.inputs.empty() ? "training needs data: pass --data FILE (a token stream) or --inputs DIR "
                           "(one batch)"
                         : "pass one of --data FILE and --inputs DIR, not both",
        job.recipe_path.string(),
        fmt::format("--inputs DIR holds the model's inputs and '{}' as .pb tensors; --data "
                    "FILE is a flat file of uint16 (--token-bytes 4: uint32) token ids",
                    t.labels));
  if (o.token_bytes != 0 && o.token_bytes != 2 && o.token_bytes != 4)
    return Error(Errc::usage, fmt::format("--token-bytes must be 2 or 4, got {}", o.token_bytes));
  if (o.token_bytes != 0 && o.data.empty())
    return Error(Errc::usage, "--token-bytes applies to --data");
  if (o.steps < 0) return Error(Errc::usage, "--steps must be at least 1");
  if (o.checkpoint_every < 0)
    return Error(Errc::usage, "--checkpoint-every must be at least 0 (0: only at the end)");
  if (o.checkpoint_every > 0 && o.checkpoint_dir.empty())
    return Error(Errc::usage, "--checkpoint-every needs --checkpoint DIR");
  if (o.log_every < 0) return Error(Errc::usage, "--log-every must be at least 1");

  train::TrainOptions to;
  to.model = job.model_path();
  HP_TRY(must_exist(to.model, false, "the recipe's model"));
  HP_ASSIGN_OR_RETURN(to.grad.loss, train::parse_loss(t.loss));
  to.grad.logits = t.logits;
  to.grad.labels = t.labels;
  to.grad.frozen = t.frozen;
  to.grad.recompute_blocks = recomputed_blocks(r);

  to.steps = o.steps > 0 ? o.steps : t.steps;
  train::OptimizerConfig& c = to.optimizer;
  HP_ASSIGN_OR_RETURN(c.kind, train::parse_optimizer_kind(t.optimizer));
  c.lr = t.lr;
  if (t.betas.size() == 2) c.beta1 = t.betas[0], c.beta2 = t.betas[1];
  c.eps = t.eps;
  c.weight_decay = t.weight_decay;
  c.momentum = t.momentum;
  c.clip_norm = t.clip_norm;
  HP_ASSIGN_OR_RETURN(c.schedule, train::parse_lr_schedule(t.lr_schedule));
  c.warmup_steps = t.warmup_steps;
  c.total_steps = t.steps;  // the schedule belongs to the recipe: a resumed run keeps its length
  c.min_lr = t.min_lr;

  if (!o.inputs.empty()) {
    HP_TRY(must_exist(o.inputs, true, "--inputs"));
    to.inputs_dir = o.inputs;
  } else {
    HP_TRY(must_exist(o.data, false, "--data"));
    to.data_file = o.data;
  }
  to.token_bytes = o.token_bytes != 0 ? o.token_bytes : 2;
  std::tie(to.batch, to.seq) = batch_and_seq(r);
  if (!to.data_file.empty() && (to.batch <= 0 || to.seq <= 0))
    return Error(Errc::bad_input,
                 "training on --data needs the batch and the sequence length, and the recipe "
                 "gives no " +
                     std::string(to.batch <= 0 ? "batch" : "sequence length"),
                 job.recipe_path.string(),
                 "set [workload] global_batch and seq (hp plan writes them), or [model] dims "
                 "batch and seq");
  to.seed = static_cast<std::uint64_t>(o.seed >= 0 ? o.seed : t.seed);

  to.metrics = o.metrics;
  to.trace = o.trace;
  to.save_model = o.save_model;
  to.checkpoint_dir = o.checkpoint_dir;
  to.checkpoint_every = o.checkpoint_every;
  to.force_checkpoint = o.force;
  // Checked now, before any step: the first checkpoint may be hours away.
  if (!to.checkpoint_dir.empty())
    HP_TRY(train::check_checkpoint_dir(to.checkpoint_dir, o.force,
                                       {job.recipe_path, to.model, o.data, o.inputs}));
  if (!o.resume_dir.empty()) HP_TRY(must_exist(o.resume_dir, true, "--resume"));
  to.resume_dir = o.resume_dir;

  to.backend = o.backend;
  to.threads = o.threads;
  for (const auto& p : o.plugin_paths) to.plugin_paths.push_back(p.string());
  to.log_every = o.log_every > 0 ? o.log_every : 1;
  to.sink = o.sink;
  if (pipeline) HP_TRY(pipeline_options(job, to));
  if (tensor && !pipeline) HP_TRY(tensor_parallel_options(job, to));
  return to;
}

std::string format_train_options(const train::TrainOptions& t) {
  const train::OptimizerConfig& c = t.optimizer;
  std::string s = fmt::format("training {} on {} for {} step(s)\n", t.model.string(),
                              t.backend.empty() ? "cpu" : t.backend, t.steps);
  s += fmt::format("  loss {} on '{}' against '{}'", train::loss_name(t.grad.loss), t.grad.logits,
                   t.grad.labels);
  if (!t.grad.frozen.empty())
    s += fmt::format("; frozen {}", recipe::toml_string_array(t.grad.frozen));
  s +=
      t.grad.recompute_blocks.empty()
          ? "; no block recomputed\n"
          : fmt::format("; blocks {} recomputed\n", recipe::format_ranges(t.grad.recompute_blocks));
  if (c.kind == train::OptimizerKind::adamw)
    s += fmt::format("  adamw lr {} betas ({}, {}) eps {} weight decay {}", c.lr, c.beta1, c.beta2,
                     c.eps, c.weight_decay);
  else
    s += fmt::format("  sgd lr {} momentum {} weight decay {}", c.lr, c.momentum, c.weight_decay);
  s += c.schedule == train::LrSchedule::cosine
           ? fmt::format(", cosine to {} after {} warm-up step(s)", c.min_lr, c.warmup_steps)
           : std::string(", constant");
  s += c.clip_norm > 0 ? fmt::format(", gradient norm clipped at {}\n", c.clip_norm)
                       : std::string(", no clipping\n");
  if (!t.data_file.empty())
    s += fmt::format("  data {} (uint{} tokens), batches of {} x {} drawn with seed {}\n",
                     t.data_file.string(), t.token_bytes * 8, t.batch, t.seq, t.seed);
  else
    s += fmt::format("  data: the one batch in {}\n", t.inputs_dir.string());
  if (!t.resume_dir.empty()) s += fmt::format("  resuming from {}\n", t.resume_dir.string());
  if (!t.checkpoint_dir.empty())
    s += t.checkpoint_every > 0
             ? fmt::format("  checkpoint to {} every {} step(s)\n", t.checkpoint_dir.string(),
                           t.checkpoint_every)
             : fmt::format("  checkpoint to {} at the end\n", t.checkpoint_dir.string());
  if (!t.metrics.empty()) s += fmt::format("  metrics to {}\n", t.metrics.string());
  if (!t.save_model.empty()) s += fmt::format("  trained model to {}\n", t.save_model.string());
  return s;
}

Expected<LaunchReport> launch_train(const Job& job, const LaunchOptions& given) {
  const recipe::Parallel& p = job.recipe.parallel;
  // --timeline reads the job's trace: without --trace, one beside the picture, removed after.
  LaunchOptions o = given;
  bool own_trace = false;
  if (!o.timeline.empty() && !o.worker) {
    if (p.pp <= 1)
      return Error(Errc::usage, "--timeline draws pipeline schedules: the recipe has pp = 1",
                   job.recipe_path.string(), "use --trace for a data-parallel job's steps");
    if (o.trace.empty()) {
      o.trace = o.timeline;
      o.trace += ".trace.json";
      own_trace = true;
      // It is removed afterwards: never a file hp did not write.
      if (std::filesystem::exists(o.trace))
        return Error(
            Errc::bad_input,
            fmt::format("--timeline writes its trace to {}, which exists", o.trace.string()), "",
            "remove it, or name the trace with --trace");
    }
  }
  HP_ASSIGN_OR_RETURN(train::TrainOptions to, train_options(job, o));
  LaunchReport r;
  if (o.dry_run) {
    r.summary = format_train_options(to);
    if (p.dp > 1)
      r.summary += fmt::format("  {} data-parallel ranks ({}), optimizer_shard {}{}\n", p.dp,
                               o.simulate ? "threads of this process" : "mpirun",
                               recipe::optimizer_shard_name(p.optimizer_shard),
                               p.shard_group > 0 && p.shard_group < p.dp
                                   ? fmt::format(", HSDP shard groups of {}", p.shard_group)
                                   : std::string());
    if (p.expert_parallel > 1)
      r.summary += fmt::format(
          "  expert parallelism: groups of {} data-parallel ranks share each layer's experts out "
          "({})\n",
          p.expert_parallel,
          p.routed_experts ? "each token sent to its top-k experts' ranks where the graph allows "
                             "it, else all-gathered; outputs exchanged back"
                           : "tokens all-gathered, outputs exchanged back");
    if (p.tp > 1)
      r.summary += fmt::format("  {} tensor-parallel ranks ({}), the partitions hp shard writes\n",
                               p.tp, o.simulate ? "threads of this process" : "mpirun");
    if (p.pp > 1)
      r.summary +=
          fmt::format("  {} pipeline stages ({}), {} schedule, {} micro-batches; boundaries {}\n",
                      p.pp, o.simulate ? "threads of this process" : "mpirun",
                      recipe::schedule_name(p.schedule), p.micro_batches, boundaries(to.pp.cuts));
    return r;
  }
  if (o.worker) return train_as_rank(job, std::move(to), o.run_dir);
  if (p.dp > 1 || p.pp > 1 || p.tp > 1) {
    HP_ASSIGN_OR_RETURN(r, o.simulate ? train_in_process(job, to) : train_over_mpi(job, o));
    r.summary += predicted_line(job);
    if (!o.timeline.empty()) {
      auto line = write_timeline(job, to, o.trace, o.timeline);
      if (own_trace) std::filesystem::remove(o.trace);
      if (!line) return std::move(line).error();
      r.summary += *line;
    }
    return r;
  }
  HP_ASSIGN_OR_RETURN(train::TrainReport rep, train::train(to));
  r.summary = rep.summary;
  if (r.summary.empty() && !rep.steps.empty())  // the trainer's own lines, else the essentials
    r.summary = fmt::format("trained steps {}-{}: loss {:.6g} -> {:.6g}, median step {:.4f} s\n",
                            rep.steps.front().step, rep.steps.back().step, rep.steps.front().loss,
                            rep.steps.back().loss, rep.median_step_seconds);
  if (!r.summary.empty() && r.summary.back() != '\n') r.summary += '\n';
  r.summary += predicted_line(job);
  nlohmann::ordered_json j{{"mode", "train"}, {"median_step_seconds", rep.median_step_seconds}};
  j["steps"] = nlohmann::ordered_json::array();
  for (const auto& m : rep.steps)
    j["steps"].push_back({{"step", m.step},
                          {"loss", m.loss},
                          {"grad_norm", m.grad_norm},
                          {"lr", m.lr},
                          {"seconds", m.seconds}});
  r.json = j.dump();
  return r;
}

}  // namespace hp::job

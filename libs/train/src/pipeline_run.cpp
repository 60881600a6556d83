// The training loop of a pipeline rank (trainer.h, detail::train_pipeline; hp/train/pipeline.h).
//
// Every rank reads the whole global batch (the --inputs batch, or each step's windows of the --data
// token stream, drawn as one rank draws them) and cuts it into the micro-batches along axis 0 (as
// batches.cpp's slice_rows cuts a data-parallel rank's rows); its stage runs its schedule's actions
// on them (pipeline_stage.h), then updates its own parameters with the whole model's gradient norm.
// The first stage's rank is the lead: it prints, writes the metrics, and for the saved model
// gathers the other stages' parameters into the one-rank order (the forward model's initializer
// order). Checkpoints are sharded (sharded_run.h): every rank writes its stage's pieces, and a
// resume at any layout reads the pieces its own stage needs.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>

#include "batches.h"
#include "metrics_file.h"
#include "pipeline_run.h"
#include "run_summary.h"

namespace hp::train::detail {

namespace {

// A global batch cut into the micro-batches (labels last, every tensor named).
Expected<std::vector<std::vector<exec::HostTensor>>> cut_micro(
    const std::vector<exec::HostTensor>& batch, int m, const std::filesystem::path& where) {
  const std::int64_t rows = batch.back().dims.empty() ? 0 : batch.back().dims[0];
  if (rows <= 0 || rows % m != 0)
    return Error(
        Errc::bad_input,
        fmt::format("the global batch of {} rows does not split into {} micro-batches", rows, m),
        where.string(), "make the batch a multiple of [parallel] micro_batches");
  std::vector<std::vector<exec::HostTensor>> out;
  for (int k = 0; k < m; ++k) {
    HP_ASSIGN_OR_RETURN(auto mb, slice_rows(batch, rows, k, m));
    out.push_back(std::move(mb));
  }
  return out;
}

}  // namespace

Status PipeRun::prepare() {
  if (o.inputs_dir.empty() == o.data_file.empty())
    return Error(Errc::usage,
                 "give exactly one of --inputs DIR (one batch) and --data FILE (a token stream)");
  model::LoadOptions lo;
  lo.mode = model::LoadMode::require_data;
  HP_ASSIGN_OR_RETURN(forward, model::load_model(o.model, lo));
  if (!o.data_file.empty()) {
    HP_TRY(open_stream());
  } else {
    HP_ASSIGN_OR_RETURN(auto given, read_input_dir(o));
    auto ios = exec::model_io(forward).inputs;
    exec::GraphIO labels;
    labels.name = o.grad.labels;
    labels.dtype = given.back().dtype;
    ios.push_back(labels);
    HP_ASSIGN_OR_RETURN(auto batch,
                        exec::bind_inputs(ios, std::move(given), o.inputs_dir.string()));
    for (std::size_t k = 0; k < batch.size(); ++k) batch[k].name = ios[k].name;
    HP_TRY(take(std::move(batch), o.inputs_dir));
  }
  const auto dims = dims_of_tensors(forward, micro[0]);
  HP_ASSIGN_OR_RETURN(stage, PipelineStage::create(o, forward, dims));
  if (!o.trace.empty()) stage->set_trace(&trace);
  for (const auto& n : stage->notes()) say(true, "hp: note: " + n);
  HP_ASSIGN_OR_RETURN(params, stage->read_params());
  if (o.tp.active()) {
    HP_ASSIGN_OR_RETURN(tps, TensorParallelSync::create(o.tp, stage->cuts(), params));
    tps->to_trained(params);
  }
  if (o.ep.active()) {
    HP_TRY(prepare_experts());
  } else if (o.dp.active()) {
    // Each stage's replicas reduce its gradients (and shard its optimizer); the clip norm adds
    // the pipeline's stages, a shared weight counted by its first stage; with tensor parallelism
    // also the other pipelines of this replica, whole weights counted by their first member.
    DataParallel group = o.dp;
    group.norm_group = o.pp.ranks;
    if (tps) group.norm_group = o.tp.replica;
    for (std::size_t k = 0; k < params.size(); ++k) {
      group.counted.push_back(stage->owns(params[k].name) &&
                              (!tps || tps->split(k) || o.tp.index() == 0));
      if (tps) group.divisor.push_back(tps->partial(k));  // ZeRO-3's fetches: the stored form
    }
    HP_ASSIGN_OR_RETURN(dp, DataParallelSync::create(group, params));
    // A gradient is reduced while the schedule goes on from the action that finished it: the last
    // stage's while the earlier ones still run their backwards (the cooldown's bubble).
    stage->set_gradient_hook(
        [d = dp.get()](std::size_t k, const exec::HostTensor& g) { d->gradient_ready(k, g); });
    if (!o.trace.empty()) dp->set_trace(&trace);
    // ZeRO-3: the stage's parameters held in shards over its replicas; every part's executor
    // borrows its buckets for each use (pipeline_gather.h).
    if (o.dp.zero >= 3 && dp->sharded()) {
      HP_TRY(dp->hold_parameters(params));
      const auto groups = dp->weight_groups(params);
      HP_ASSIGN_OR_RETURN(auto* source,
                          lend_through(cache, *dp, groups, params, o.dp.gather_per_step));
      HP_TRY(stage->lend(source, groups));
    }
  }
  std::int64_t n = 0;
  for (const auto& p : params) {
    if (!stage->owns(p.name)) continue;
    auto cut = stage->cuts().find(p.name);  // a split weight counts whole
    std::int64_t e = 1;
    for (auto d : cut == stage->cuts().end() ? p.dims : cut->second.shape) e *= d;
    n += e;
  }
  if (eps) {  // the other members' experts of the stage
    const auto& of = stage->experts_of();
    for (const auto& t : forward.proto->graph().initializer())
      for (std::size_t m = 0; m < of.size(); ++m)
        if (static_cast<int>(m) != o.ep.index() &&
            std::find(of[m].begin(), of[m].end(), t.name()) != of[m].end())
          n += std::accumulate(t.dims().begin(), t.dims().end(), std::int64_t{1},
                               std::multiplies<>());
  }
  HP_TRY(t().allreduce(o.pp.ranks, &n, &n, 1, HP_I64, comm::ReduceOp::sum));
  report.params = n;
  return {};
}

// Expert parallelism within the stages: the stage's replicas are the data-parallel group whose
// consecutive expert groups share out the experts of the stage's chunks (expert_parallel.h). The
// last stage weights each member's loss in its gradient model (PipelineStage::run_step), so every
// gradient of the stage arrives weighted and the sync sums: the shared weights over the replicas,
// the experts over the replicas holding them. The clip norm adds the pipeline's stages.
Status PipeRun::prepare_experts() {
  // The pipeline's expert layers (all, routed, summed), for the closing lines.
  for (int k = 0; k < 3; ++k) expert_layers[k] = stage->expert_layers()[k];
  HP_TRY(t().allreduce(o.pp.ranks, expert_layers.data(), expert_layers.data(), 3, HP_I64,
                       comm::ReduceOp::sum));
  if (expert_layers[0] == 0)
    return Error(Errc::bad_input,
                 "expert parallelism needs expert layers, and no stage of the model has one",
                 o.model.string(), "set [parallel] expert_parallel = 1");
  ExpertParallel ep = o.ep;
  ep.norm_group = o.pp.ranks;
  for (const auto& p : params) ep.counted.push_back(stage->owns(p.name));
  HP_ASSIGN_OR_RETURN(eps, ExpertParallelSync::create(ep, params, stage->experts_of()));
  stage->set_gradient_hook(
      [s = eps.get()](std::size_t k, const exec::HostTensor& g) { s->gradient_ready(k, g); });
  if (!o.trace.empty()) eps->set_trace(&trace);
  // ZeRO-3: the shared weights held in shards over the stage's replicas, each expert over the
  // replicas holding it; every part's executor borrows their buckets (pipeline_gather.h).
  if (o.ep.zero >= 3 && eps->sharded()) {
    HP_TRY(eps->hold(params));
    const auto groups = eps->held_groups();
    HP_ASSIGN_OR_RETURN(auto* source,
                        lend_through(cache, *eps, groups, params, o.ep.gather_per_step));
    HP_TRY(stage->lend(source, groups));
    HP_TRY(eps->same_shared_order(stage->gather_sequence(), o.model.string()));
  }
  return {};
}

Status PipeRun::open_stream() {
  const auto ios = exec::model_io(forward).inputs;
  if (ios.size() != 1 || ios[0].onnx_type != 7)  // INT64: what exporters give token ids
    return Error(Errc::bad_input, "--data feeds models with one int64 token-id input",
                 o.model.string());
  if (o.batch <= 0 || o.seq <= 0)
    return Error(Errc::bad_input,
                 "--data needs the batch and sequence length ([workload] global_batch and seq)");
  HP_ASSIGN_OR_RETURN(auto s, TokenStream::open(o.data_file, o.token_bytes, o.seq));
  stream = std::move(s);
  input = ios[0].name;
  return draw();  // the shapes the stage's gradient model is built for
}

Status PipeRun::draw() {
  HP_ASSIGN_OR_RETURN(auto batch, token_batch(*stream, o.batch, o.seq, o.seed, data_position, 0,
                                              input, o.grad.labels));
  return take(std::move(batch), o.data_file);
}

Status PipeRun::take(std::vector<exec::HostTensor> batch, const std::filesystem::path& where) {
  tokens = batch.back().numel();
  if (o.dp.active()) {
    const std::int64_t rows = batch.back().dims.empty() ? 0 : batch.back().dims[0];
    // slice_rows refuses a batch that does not split over the replicas.
    HP_ASSIGN_OR_RETURN(batch, slice_rows(std::move(batch), rows, o.dp.index(),
                                          static_cast<int>(o.dp.group.size())));
  }
  total_labels = label_count(batch.back(), o.grad.loss);
  HP_ASSIGN_OR_RETURN(micro, cut_micro(batch, o.pp.micro_batches, where));
  return {};
}

ShardedLayout PipeRun::layout() const {
  ShardedLayout l;
  l.transport = o.pp.transport;
  l.tps = tps.get();
  l.sync = dp.get();
  l.eps = eps.get();
  l.dp_index = std::max(0, o.dp.index());
  l.tp_index = std::max(0, o.tp.index());
  l.lead = lead();
  return l;
}

Status PipeRun::resume_sharded() {
  HP_ASSIGN_OR_RETURN(auto r, load_sharded(layout(), o.resume_dir, params, {}, o.optimizer.kind));
  params = std::move(r.params);
  // Expert parallelism reads each parameter's state whole (the syncs' pieces are cut from it).
  state = eps ? eps->slice_state(r.state) : std::move(r.state);
  HP_TRY(set_weights());
  report.first_step = r.header.step + 1;
  data_position = r.header.data_position;
  return {};
}

Status PipeRun::resume() {
  if (is_sharded_checkpoint(o.resume_dir)) return resume_sharded();
  HP_ASSIGN_OR_RETURN(auto c, load_checkpoint(o.resume_dir, o.optimizer.kind));
  std::map<std::string, std::size_t> at;
  for (std::size_t k = 0; k < c.params.size(); ++k) at[c.params[k].name] = k;
  state = {};
  state.step = c.step;
  // Tensor parallelism: this member's slices of the whole tensors.
  auto mine = [&](std::size_t k, const exec::HostTensor& whole) -> Expected<exec::HostTensor> {
    if (!tps) return whole;
    return tps->slice(k, whole);
  };
  for (std::size_t k = 0; k < params.size(); ++k) {
    auto& p = params[k];
    auto it = at.find(p.name);
    if (it == at.end())
      return Error(Errc::bad_input, fmt::format("the checkpoint has no parameter '{}'", p.name),
                   o.resume_dir.string());
    HP_ASSIGN_OR_RETURN(auto value, mine(k, c.params[it->second]));
    if (value.dims != p.dims)
      return Error(Errc::bad_input,
                   fmt::format("checkpoint parameter '{}' is not shaped as the model's", p.name),
                   o.resume_dir.string());
    p = std::move(value);
    if (it->second < c.state.exp_avg.size()) {
      HP_ASSIGN_OR_RETURN(auto m, mine(k, c.state.exp_avg[it->second]));
      state.exp_avg.push_back(std::move(m));
    }
    if (it->second < c.state.exp_avg_sq.size()) {
      HP_ASSIGN_OR_RETURN(auto v, mine(k, c.state.exp_avg_sq[it->second]));
      state.exp_avg_sq.push_back(std::move(v));
    }
  }
  if (dp) state = dp->slice_state(state);
  if (eps) state = eps->slice_state(state);
  HP_TRY(set_weights());
  report.first_step = c.step + 1;
  data_position = c.data_position;
  return {};
}

Expected<StepMetrics> PipeRun::step() {
  const auto t0 = std::chrono::steady_clock::now();
  const std::int64_t k = state.step + 1;
  if (stream) HP_TRY(draw());
  // Data parallelism: each replica's weight first, so gradients can be handed over as they finish.
  if (dp) HP_TRY(dp->begin_step(total_labels));
  double share = 1.0;  // expert parallelism: this replica's share of the stage's labels
  if (eps) {
    HP_ASSIGN_OR_RETURN(share, eps->begin_step(total_labels));
  }
  HP_ASSIGN_OR_RETURN(double loss, stage->run_step(micro, total_labels, share));
  if (cache) cache->end_step();  // per-step ZeRO-3: the step's last use is done
  // The replicas' gradients of this stage, each a mean over its rows' labels, weighted by their
  // label counts and summed (data_parallel.h): the whole batch's.
  // (A copy: with ZeRO the reduction leaves only this rank's pieces in it, and the stage
  // accumulates the next step's gradients into whole tensors.)
  std::vector<exec::HostTensor> reduced;
  if (dp) {
    reduced = stage->grads();
    HP_ASSIGN_OR_RETURN(loss, dp->finish_step(loss, reduced));
  } else if (eps) {
    reduced = stage->grads();
    HP_ASSIGN_OR_RETURN(loss, eps->finish_step(loss, reduced));
  }
  const auto t1 = std::chrono::steady_clock::now();
  if (!std::isfinite(loss))
    return Error(Errc::runtime,
                 fmt::format("step {}: the loss is {} (diverged); nothing was updated{}", k, loss,
                             o.checkpoint_dir.empty() ? "" : ", the last checkpoint is kept"));
  Expected<StepInfo> info = StepInfo{};
  if (dp) {
    info = dp->update(o.optimizer, params, reduced, state);
  } else if (eps) {
    info = eps->update(o.optimizer, params, reduced, state);
  } else {
    HP_ASSIGN_OR_RETURN(double norm, tps ? tp_norm() : stage->global_norm());
    info = optimizer_step(o.optimizer, params, stage->grads(), state, norm);
  }
  if (!info) return Error(info.error().code, fmt::format("step {}: {}", k, info.error().message()));
  if (!held())
    HP_TRY(set_weights());
  else if (eps)  // ZeRO-3: the next step's gathers bring the held values, the rest go in now
    HP_TRY(set_unheld());
  const auto t2 = std::chrono::steady_clock::now();
  if (!o.trace.empty()) trace.add(fmt::format("optimizer {}", k), "optimizer", 0, t1, t2);
  StepMetrics m;
  m.step = k;
  m.loss = loss;
  m.grad_norm = info->grad_norm;
  m.lr = info->lr;
  m.seconds = std::chrono::duration<double>(t2 - t0).count();
  m.tokens_per_second = m.seconds > 0 ? static_cast<double>(tokens) / m.seconds : 0;
  m.peak_bytes = stage->peak_bytes() + (cache ? cache->peak_bytes() : 0);
  m.run_seconds = std::chrono::duration<double>(t1 - t0).count();
  m.update_seconds = std::chrono::duration<double>(t2 - t1).count();
  m.tp_comm_seconds = stage->comm_seconds();
  report.peak_bytes = std::max(report.peak_bytes, m.peak_bytes);
  return m;
}

// The whole model's gradient norm under tensor parallelism: this rank's split weights and (on the
// group's first member) its whole ones, a shared weight on its first stage only, added over the
// pipeline and then over the stage's tensor-parallel group, which adds the pipelines.
Expected<double> PipeRun::tp_norm() {
  const auto& g = stage->grads();
  std::vector<char> counted(g.size());
  for (std::size_t k = 0; k < g.size(); ++k)
    counted[k] = stage->owns(params[k].name) && (tps->split(k) || o.tp.index() == 0);
  double sq = sum_of_squares(g, counted);
  HP_TRY(t().allreduce(o.pp.ranks, &sq, &sq, 1, HP_F64, comm::ReduceOp::sum));
  HP_TRY(t().allreduce(o.tp.group, &sq, &sq, 1, HP_F64, comm::ReduceOp::sum));
  return std::sqrt(sq);
}

Expected<TrainReport> train_pipeline(const TrainOptions& o) {
  PipeRun r(o);
  HP_TRY(r.prepare());
  if (!o.resume_dir.empty()) HP_TRY(r.resume());
  MetricsFile metrics;
  if (r.lead()) HP_TRY(metrics.open(o.metrics));
  r.say(false, fmt::format("training {} parameters on {} pipeline stages ({} micro-batches) for {} "
                           "steps from step {}",
                           r.report.params, o.pp.ranks.size(), o.pp.micro_batches, o.steps,
                           r.report.first_step));
  const std::int64_t last = r.report.first_step + o.steps - 1;
  auto checkpoint = [&]() -> Status {
    if (o.pp.transport && o.pp.transport->size() > 1) {  // each rank its stage's pieces
      ShardedState h;
      h.step = h.optimizer_step = r.state.step;
      h.data_position = r.data_position;
      h.seed = o.seed;
      h.optimizer = optimizer_name(o.optimizer.kind);
      HP_ASSIGN_OR_RETURN(auto values, r.values());
      if (r.eps) {  // each member writes its parameters' state whole (as trainer.cpp's runs do)
        HP_ASSIGN_OR_RETURN(auto whole, r.whole_state());
        return save_sharded(r.layout(), h, values, whole, {}, o.checkpoint_dir, o.force_checkpoint);
      }
      return save_sharded(r.layout(), h, values, r.state, {}, o.checkpoint_dir, o.force_checkpoint);
    }
    HP_ASSIGN_OR_RETURN(auto c, r.gather());
    if (!r.lead()) return {};
    c.data_position = r.data_position;
    return save_checkpoint(r.forward, c, o.checkpoint_dir, o.force_checkpoint);
  };
  Status failed;
  while (r.state.step < last) {
    auto m = r.step();
    if (!m) {
      failed = std::move(m).error();
      break;
    }
    ++r.data_position;
    metrics.add(*m);
    r.report.steps.push_back(*m);
    const int every = std::max(1, o.log_every);
    if (m->step % every == 0 || m->step == last)
      r.say(false, fmt::format("step {}/{}  loss {:.6f}  grad_norm {:.4f}  lr {:.3g}  {:.3f} s{}",
                               m->step, last, m->loss, m->grad_norm, m->lr, m->seconds,
                               detail::eta_text(r.report.steps, last - m->step)));
    if (!o.checkpoint_dir.empty() && o.checkpoint_every > 0 && m->step % o.checkpoint_every == 0)
      if (Status st = checkpoint(); !st) {
        failed = std::move(st);
        break;
      }
  }
  HP_TRY(metrics.close());
  if (!o.trace.empty()) HP_TRY(r.trace.write(o.trace, o.pp.ranks[o.pp.stage]));
  if (!failed) return std::move(failed).error();
  if (!o.checkpoint_dir.empty() &&
      (o.checkpoint_every <= 0 || r.state.step % o.checkpoint_every != 0))
    HP_TRY(checkpoint());
  if (!o.save_model.empty()) {
    HP_ASSIGN_OR_RETURN(auto c, r.gather());
    if (r.lead()) HP_TRY(save_model(r.forward, c.params, o.save_model));
  }
  r.report.median_step_seconds = median_step_seconds(r.report.steps);
  if (r.lead() && !r.report.steps.empty())
    r.report.summary = fmt::format(
        "trained {} steps on {} pipeline stages: loss {:.6f} -> {:.6f}; median step {:.3f} s\n",
        r.report.steps.size(), o.pp.ranks.size(), r.report.steps.front().loss,
        r.report.steps.back().loss, r.report.median_step_seconds);
  if (r.lead() && r.held() && r.dp)
    r.report.summary += zero3_line(*r.dp, "first stage's parameters");
  if (r.lead() && r.held() && r.eps) {
    if (r.eps->holds_shared())
      r.report.summary += zero3_line(r.eps->shared_sync(), "first stage's shared parameters");
    if (r.eps->holds_experts())
      r.report.summary += zero3_line(r.eps->expert_sync(), "first stage's experts");
  }
  if (r.lead() && r.cache)
    r.report.summary +=
        per_step_line(r.cache->gathered(), r.report.steps.size(), r.cache->peak_bytes());
  if (r.lead() && r.eps) {
    const auto& l = r.expert_layers;
    r.report.summary +=
        expert_layers_line(static_cast<int>(l[0]), static_cast<int>(l[1]), static_cast<int>(l[2]));
  }
  if (!o.save_model.empty() && r.lead())
    r.report.summary += fmt::format("wrote {}\n", o.save_model.string());
  return r.report;
}

}  // namespace hp::train::detail

// The training loop (trainer.h).
//
// Order of one step, as a PyTorch loop does it: forward + backward on the batch (one run of the
// gradient model), the loss of that forward recorded, then clipping and the optimizer update on the
// host copies of the weights, which go back into the executor for the next step. A non-finite loss
// stops the run before the update, naming the step; checkpoints already written stay.
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <numeric>
#include <optional>
#include <set>
#include <thread>

#include "batches.h"
#include "hp/core/fs.h"
#include "hp/exec/backends.h"
#include "hp/exec/executor.h"
#include "hp/plugin/hp_plugin.h"
#include "hp/train/checkpoint.h"
#include "hp/train/data_parallel.h"
#include "hp/train/tensor_parallel.h"
#include "hp/train/trainer.h"
#include "metrics_file.h"
#include "run_summary.h"
#include "trainer_run.h"

namespace hp::train {

namespace {

std::string mib(std::int64_t b) {
  return fmt::format("{:.1f} MiB", static_cast<double>(b) / (1 << 20));
}

// The rows of a batch: those of its labels tensor (by name, else the last tensor).
std::int64_t batch_rows(const std::vector<exec::HostTensor>& batch, const std::string& labels) {
  for (const auto& t : batch)
    if (t.name == labels && !t.dims.empty()) return t.dims[0];
  return batch.empty() || batch.back().dims.empty() ? 0 : batch.back().dims[0];
}

}  // namespace

namespace detail {

Status TrainRun::prepare_tensor_parallel(GradSpec& spec) {
  if (o.pp.active())
    return Error(Errc::not_implemented,
                 "tensor parallelism is trained without pipeline parallelism for now");
  const int me = o.tp.index();
  if (me < 0 || !o.tp.partition)
    return Error(Errc::internal, "this rank has no tensor-parallel partition");
  HP_ASSIGN_OR_RETURN(TensorParallelPart tpp, o.tp.partition(0, o.tp.position, {}));
  model::LoadOptions lo;
  lo.mode = model::LoadMode::require_data;
  HP_ASSIGN_OR_RETURN(
      part_model, model::parse_model(
                      tpp.onnx, o.model.parent_path() / fmt::format("tp-member{}.onnx", me), lo));
  spec.tp.varying = std::move(tpp.varying);
  spec.tp.group.assign(o.tp.group.begin(), o.tp.group.end());
  spec.tp.rank = o.tp.transport->rank();
  comm_ops = std::make_unique<comm::TransportCommOps>(*o.tp.transport);
  cuts = std::move(tpp.cuts);
  return {};
}

Status TrainRun::prepare_expert_parallel(GradSpec& spec, const model::DimBindings& dims) {
  if (o.dp.active())
    return Error(Errc::internal, "expert parallelism replaces the data-parallel group");
  const int me = o.ep.index();
  HP_ASSIGN_OR_RETURN(ExpertPartition part_of,
                      partition_experts(forward, o.ep.group, me, o.ep.routed, dims));
  expert_layers = {part_of.layers, part_of.routed, part_of.summed};
  model::LoadOptions lo;
  lo.mode = model::LoadMode::require_data;
  HP_ASSIGN_OR_RETURN(
      part_model,
      model::parse_model(part_of.onnx, o.model.parent_path() / fmt::format("ep-member{}.onnx", me),
                         lo));
  // The gathered tokens feed this member's experts: their gradient is summed over the group, which
  // makes the all-gather's gradient a reduce-scatter (rules_comm.cpp).
  spec.tp.varying = std::move(part_of.varying);
  spec.tp.group.assign(o.ep.group.begin(), o.ep.group.end());
  spec.tp.rank = o.ep.transport->rank();
  spec.loss_scale = detail::kLossScaleInput;
  comm_ops = std::make_unique<comm::TransportCommOps>(*o.ep.transport);
  experts_of = std::move(part_of.experts_of);
  return {};
}

Expected<std::vector<exec::HostTensor>> TrainRun::whole(
    const std::vector<exec::HostTensor>& mine) const {
  if (eps) {
    if (held() && &mine == &params) {  // ZeRO-3: the shared weights all-gathered first
      HP_ASSIGN_OR_RETURN(auto full, eps->with_held(params));
      return eps->gather(full, forward);
    }
    return eps->gather(mine, forward);
  }
  std::vector<exec::HostTensor> gathered;  // ZeRO-3: this member's parameters, whole
  if (held() && &mine == &params) {
    HP_ASSIGN_OR_RETURN(gathered, sync->gather_parameters(params));
    if (!tps) return gathered;
  }
  if (!tps) return mine;
  HP_ASSIGN_OR_RETURN(auto all, tps->gather(gathered.empty() ? mine : gathered));
  // Checkpoints and saved models list the parameters as one rank trains them: in the forward
  // model's initializer order (the partition orders them by first use).
  std::map<std::string, std::size_t> at;
  const auto& inits = forward.proto->graph().initializer();
  for (int k = 0; k < inits.size(); ++k) at.emplace(inits.Get(k).name(), k);
  std::vector<std::size_t> order(all.size());
  for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return at[params[a].name] < at[params[b].name];
  });
  std::vector<exec::HostTensor> out;
  for (std::size_t k : order) {
    out.push_back(std::move(all[k]));
    out.back().name = params[k].name;
  }
  return out;
}

Status TrainRun::prepare() {
  model::LoadOptions lo;
  lo.mode = model::LoadMode::require_data;
  HP_ASSIGN_OR_RETURN(forward, model::load_model(o.model, lo));
  GradSpec spec = o.grad;
  if (o.inputs_dir.empty() == o.data_file.empty())
    return Error(Errc::usage,
                 "give exactly one of --inputs DIR (one batch) and --data FILE (a token stream)");
  HP_ASSIGN_OR_RETURN(batch, detail::read_input_dir(o));
  TrainOptions local = o;  // the shapes this rank runs at
  if (o.dp.active() || o.ep.active()) {
    part = o.ep.active() ? o.ep.part() : o.dp.index();
    parts = static_cast<int>(o.ep.active() ? o.ep.data.size() : o.dp.group.size());
    const std::int64_t rows = batch_rows(batch, o.grad.labels);
    if (!batch.empty()) {
      HP_ASSIGN_OR_RETURN(batch, detail::slice_rows(batch, rows, part, parts));
    }
    if (!o.data_file.empty()) {
      if (o.batch % parts != 0)
        return Error(Errc::bad_input,
                     fmt::format("the global batch of {} windows does not split over {} "
                                 "data-parallel ranks",
                                 o.batch, parts),
                     "", "make the batch a multiple of dp");
      local.batch = o.batch / parts;
    }
  }
  const auto dims = detail::data_dims(local, forward, batch);
  if (o.tp.active()) {
    HP_TRY(prepare_tensor_parallel(spec));
  } else {
    if (o.ep.active()) HP_TRY(prepare_expert_parallel(spec, dims));
    for (const auto& [k, v] : dims) spec.dims.emplace(k, v);
  }
  // Tensor-parallel partitions keep their buffers as exported (docs/training.md).
  spec.update_buffers = !partitioned();
  HP_ASSIGN_OR_RETURN(gg, build_grad_graph(partitioned() ? part_model : forward, spec));
  for (const auto& n : gg.notes) say(true, "hp: note: " + n);
  if (!gg.aliased.empty())
    say(true,
        fmt::format("hp: warning: {} initializer(s) are shared through Identity nodes (first: "
                    "'{}'): an eval-mode export merges initializers with equal values, "
                    "which ties tensors PyTorch trains apart; export with "
                    "training=torch.onnx.TrainingMode.TRAINING to keep them separate",
                    gg.aliased.size(), gg.aliased.front()));
  for (const auto& [name, readers] : gg.tied)
    say(true, fmt::format("hp: note: '{}' is read by {} nodes (tied or aliased): their gradients "
                          "add up and it is trained as one tensor",
                          name, readers));
  std::vector<std::filesystem::path> paths(o.plugin_paths.begin(), o.plugin_paths.end());
  HP_ASSIGN_OR_RETURN(auto b,
                      exec::open_backends(o.backend.empty() ? "cpu" : o.backend, o.threads, paths));
  exec::ExecOptions eo{b.primary, b.cpu, comm_ops.get()};
  eo.pack_weights = false;        // rewritten every step (ExecOptions::pack_weights)
  eo.profile = !o.trace.empty();  // each node of the gradient model in the trace
  HP_ASSIGN_OR_RETURN(ex, exec::Executor::create(gg.model, eo));
  for (const auto& p : gg.params) {
    HP_ASSIGN_OR_RETURN(auto h, ex->weight(p));
    if (h.dtype != HP_F32)
      return Error(Errc::bad_input, "only float32 parameters are trained for now", p);
    report.params += h.numel();
    params.push_back(std::move(h));
  }
  if (o.ep.active()) {
    HP_ASSIGN_OR_RETURN(eps, ExpertParallelSync::create(o.ep, params, experts_of));
    // The whole model's count: this member's parameters and every other member's experts.
    std::set<std::string> trained(gg.params.begin(), gg.params.end());
    for (const auto& names : experts_of) trained.insert(names.begin(), names.end());
    report.params = 0;
    for (const auto& t : forward.proto->graph().initializer())
      if (trained.count(t.name()))
        report.params +=
            std::accumulate(t.dims().begin(), t.dims().end(), std::int64_t{1}, std::multiplies<>());
    ex->set_output_hook(
        [s = eps.get(), n = params.size()](std::size_t k, const exec::HostTensor& t) {
          if (k > 0 && k <= n) s->gradient_ready(k - 1, t);  // output 0 is the loss, buffers last
        });
    if (!o.trace.empty()) eps->set_trace(&trace);
    // ZeRO-3: the shared weights held in shards over the data-parallel ranks, an expert over
    // the ranks holding it, each gathered for its uses as without experts.
    if (o.ep.zero >= 3 && eps->sharded()) {
      HP_TRY(hold());
      const auto groups = eps->held_groups();
      HP_ASSIGN_OR_RETURN(auto* source,
                          lend_through(cache, *eps, groups, params, o.ep.gather_per_step));
      HP_TRY(ex->set_weight_source(source, groups));
      HP_TRY(eps->same_shared_order(ex->weight_source_order(), o.model.string()));
    }
  }
  for (const auto& [name, value] : gg.buffer_updates) {
    HP_ASSIGN_OR_RETURN(auto h, ex->weight(name));
    buffers.push_back(std::move(h));
  }
  if (o.tp.active()) {
    HP_ASSIGN_OR_RETURN(tps, TensorParallelSync::create(o.tp, cuts, params));
    tps->to_trained(params);
    report.params = 0;  // the whole model's count, not this member's slices
    for (const auto& p : params) {
      auto c = cuts.find(p.name);
      std::int64_t n = 1;
      for (auto d : c == cuts.end() ? p.dims : c->second.shape) n *= d;
      report.params += n;
    }
  }
  if (o.dp.active()) {
    DataParallel dp = o.dp;
    if (tps) {  // the clip norm is the whole model's: split weights over the tensor-parallel group
      dp.norm_group = o.tp.group;
      for (std::size_t k = 0; k < params.size(); ++k) {
        dp.counted.push_back(tps->split(k) || o.tp.index() == 0);
        dp.divisor.push_back(tps->partial(k));  // ZeRO-3's fetches give the executor's form
      }
    }
    HP_ASSIGN_OR_RETURN(sync, DataParallelSync::create(dp, params));
    ex->set_output_hook(
        [s = sync.get(), n = params.size()](std::size_t k, const exec::HostTensor& t) {
          if (k > 0 && k <= n) s->gradient_ready(k - 1, t);  // output 0 is the loss, buffers last
        });
    if (!o.trace.empty()) sync->set_trace(&trace);
    // ZeRO-3: each rank keeps its shard of the parameters, and the executor gathers a bucket of
    // them for each use (data_parallel.h). With tensor parallelism the shards are of this member's
    // slices, gathered over the data-parallel ranks of the same tensor-parallel position, which run
    // the same partition (so ask for buckets in the same order).
    if (dp.zero >= 3 && sync->sharded()) {
      HP_TRY(hold());
      const auto groups = sync->weight_groups(params);
      HP_ASSIGN_OR_RETURN(auto* source,
                          lend_through(cache, *sync, groups, params, dp.gather_per_step));
      HP_TRY(ex->set_weight_source(source, groups));
    }
  }
  return {};
}

Expected<StepMetrics> TrainRun::step(const detail::BatchSource& data) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::int64_t k = state.step + 1;
  HP_ASSIGN_OR_RETURN(auto batch, data.batch(data_position));
  if ((sync || eps) &&
      !o.data_file.empty()) {  // a token stream's windows: this rank's rows of them
    HP_ASSIGN_OR_RETURN(batch, detail::slice_rows(batch, o.batch, part, parts));
  }
  // Data parallelism: the group's label count first, so each gradient can be weighted and its
  // bucket reduced while the backward goes on (the executor's output hook).
  const std::int64_t count = sync || eps ? detail::label_count(batch.back(), o.grad.loss) : 0;
  if (sync) HP_TRY(sync->begin_step(count));
  if (eps) {  // expert parallelism: this rank's share of the group's mean scales its gradient
    HP_ASSIGN_OR_RETURN(const double share, eps->begin_step(count));
    exec::HostTensor scale;
    scale.name = detail::kLossScaleInput;
    scale.dtype = HP_F32;
    scale.data.resize(sizeof(float));
    *scale.as<float>() = static_cast<float>(share);
    batch.push_back(std::move(scale));
  }
  HP_ASSIGN_OR_RETURN(auto outs, ex->run(batch));
  if (cache) cache->end_step();  // per-step ZeRO-3: the backward's uses are done
  const auto t1 = std::chrono::steady_clock::now();
  // Per-step ZeRO-3 keeps the gathered buckets beside the executor's tensors.
  const std::int64_t kept = cache ? cache->peak_bytes() : 0;
  report.peak_bytes = std::max(report.peak_bytes, ex->stats().peak_bytes + kept);
  double loss = outs[0].dtype == HP_F32 ? outs[0].as<float>()[0] : outs[0].as<double>()[0];
  // The buffers' new values are the last outputs.
  const auto first_buffer = outs.end() - static_cast<std::ptrdiff_t>(gg.buffer_updates.size());
  std::vector<exec::HostTensor> grads(std::make_move_iterator(outs.begin() + 1),
                                      std::make_move_iterator(first_buffer));
  std::vector<exec::HostTensor> new_buffers(std::make_move_iterator(first_buffer),
                                            std::make_move_iterator(outs.end()));
  // Data parallelism: the group's loss and gradients (the labels are the model's last input).
  if (sync) {
    HP_ASSIGN_OR_RETURN(loss, sync->finish_step(loss, grads));
  }
  if (eps) {
    HP_ASSIGN_OR_RETURN(loss, eps->finish_step(loss, grads));
  }
  const auto t_reduced = std::chrono::steady_clock::now();
  if (!std::isfinite(loss))
    return Error(Errc::runtime,
                 fmt::format("step {}: the loss is {} (diverged); nothing was updated{}", k, loss,
                             o.checkpoint_dir.empty() ? "" : ", the last checkpoint is kept"));
  OptimizerConfig oc = o.optimizer;
  // The rank's threads; with no count given, every core for a lone rank and one for each of
  // several (ranks simulated in one process share the cores).
  const bool lone = !o.dp.active() && !o.tp.active() && !o.ep.active();
  oc.threads = o.threads > 0 ? o.threads
               : lone        ? static_cast<int>(std::thread::hardware_concurrency())
                             : 1;
  // Where the executor's copy of a weight can be written in place, the update writes it there in
  // the same pass (whole parameters only: not a ZeRO shard, nor a tensor-parallel slice).
  Mirror mirror;
  const bool whole = !tps && !eps && !(sync && sync->sharded());
  for (std::size_t j = 0; whole && j < params.size(); ++j)
    mirror.to.push_back(ex->host_weight(params[j].name));
  Expected<StepInfo> info = StepInfo{};
  if (sync) {
    info = sync->update(oc, params, grads, state, mirror);
  } else if (eps) {
    info = eps->update(oc, params, grads, state);
  } else if (tps) {
    auto norm = tps->global_norm(grads);
    if (!norm) return std::move(norm).error();
    info = optimizer_step(oc, params, grads, state, *norm);
  } else {
    info = optimizer_step(oc, params, grads, state, global_norm(grads, oc.threads), mirror);
  }
  if (!info) return Error(info.error().code, fmt::format("step {}: {}", k, info.error().message()));
  const auto t2 = std::chrono::steady_clock::now();
  for (std::size_t j = 0; j < params.size(); ++j)
    if (lent(j))
      continue;  // ZeRO-3: the executor gathers it for its next use
    else if (j < mirror.to.size() && mirror.to[j])
      HP_TRY(ex->weight_written(params[j].name));
    else
      HP_TRY(ex->set_weight(params[j].name, tps ? tps->stored(j, params[j]) : params[j]));
  for (std::size_t j = 0; j < new_buffers.size(); ++j) {
    new_buffers[j].name = buffers[j].name;
    HP_TRY(ex->set_weight(buffers[j].name, new_buffers[j]));
    buffers[j] = std::move(new_buffers[j]);
  }
  ++data_position;
  if (!o.trace.empty()) {
    const auto t3 = std::chrono::steady_clock::now();
    trace.add(fmt::format("forward+backward {}", k), "compute", 0, t0, t1);
    for (const exec::NodeSpan& n : ex->stats().timeline)  // its nodes, on a lane of their own
      trace.add(n.node, "node", 2, n.start, n.end, nlohmann::json{{"op", n.op}}.dump());
    if (sync || eps)
      trace.add(fmt::format("reduction after the backward {}", k), "dp exposed", 0, t1, t_reduced);
    const bool zero = (sync && sync->sharded()) || (eps && eps->sharded());
    trace.add(fmt::format("optimizer {}", k), zero ? "optimizer+zero" : "optimizer", 0, t_reduced,
              t2);
    trace.add(fmt::format("weights to the executor {}", k), "copy", 0, t2, t3);
  }
  StepMetrics m;
  m.step = k;
  m.loss = loss;
  m.grad_norm = info->grad_norm;
  m.lr = info->lr;
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Tokens of the global batch: a fixed batch was cut to this rank's rows when it was read.
  const double tokens = static_cast<double>(data.tokens()) * (o.data_file.empty() ? parts : 1);
  m.tokens_per_second = m.seconds > 0 ? tokens / m.seconds : 0;
  m.peak_bytes = ex->stats().peak_bytes + (cache ? cache->peak_bytes() : 0);
  m.run_seconds = std::chrono::duration<double>(t1 - t0).count();
  m.reduce_seconds = std::chrono::duration<double>(t_reduced - t1).count();
  m.update_seconds = std::chrono::duration<double>(t2 - t_reduced).count();
  // The gradient model's collectives are tensor parallelism's, or expert parallelism's.
  (eps ? m.ep_comm_seconds : m.tp_comm_seconds) = exec::comm_seconds(ex->stats());
  return m;
}

}  // namespace detail

Expected<TrainReport> train(const TrainOptions& o) {
  if (o.steps < 1) return Error(Errc::usage, "the number of steps must be at least 1");
  if (o.pp.active()) return detail::train_pipeline(o);
  detail::TrainRun r{o};
  HP_TRY(r.prepare());
  HP_ASSIGN_OR_RETURN(auto data,
                      detail::BatchSource::open(o, *r.ex, o.grad.labels, std::move(r.batch)));
  if (!o.resume_dir.empty()) HP_TRY(r.resume());
  detail::MetricsFile metrics;
  if (r.lead()) HP_TRY(metrics.open(o.metrics));
  r.say(false, fmt::format("training {} parameters ({} tensors) for {} steps from step {}",
                           r.report.params, r.params.size(), o.steps, r.report.first_step));
  const std::int64_t last = r.report.first_step + o.steps - 1;
  Status failed;
  while (r.state.step < last) {
    auto m = r.step(data);
    if (!m) {
      failed = std::move(m).error();
      break;
    }
    metrics.add(*m);
    r.report.steps.push_back(*m);
    const int every = std::max(1, o.log_every);
    if (m->step % every == 0 || m->step == last)
      r.say(false,
            fmt::format("step {}/{}  loss {:.6f}  grad_norm {:.4f}  lr {:.3g}  {:.3f} s  "
                        "{:.0f} tokens/s{}",
                        m->step, last, m->loss, m->grad_norm, m->lr, m->seconds,
                        m->tokens_per_second, detail::eta_text(r.report.steps, last - m->step)));
    if (!o.checkpoint_dir.empty() && o.checkpoint_every > 0 && m->step % o.checkpoint_every == 0)
      if (Status st = r.checkpoint(); !st) {
        failed = std::move(st);
        break;
      }
  }
  HP_TRY(metrics.close());
  if (!o.trace.empty())  // one process id per rank of the job
    HP_TRY(r.trace.write(o.trace, o.tp.active() ? o.tp.transport->rank() : r.part));
  if (!failed) return std::move(failed).error();
  if (!o.checkpoint_dir.empty() &&
      (o.checkpoint_every <= 0 || r.state.step % o.checkpoint_every != 0))
    HP_TRY(r.checkpoint());
  if (!o.save_model.empty()) {
    HP_ASSIGN_OR_RETURN(auto trained, r.whole(r.params));  // collective under tensor parallelism
    trained.insert(trained.end(), r.buffers.begin(), r.buffers.end());
    if (r.lead()) HP_TRY(save_model(r.forward, trained, o.save_model));
  }
  r.report.median_step_seconds = detail::median_step_seconds(r.report.steps);
  r.report.summary = fmt::format(
      "trained {} steps: loss {:.6f} -> {:.6f}; median step {:.3f} s; peak tensor memory {}\n",
      r.report.steps.size(), r.report.steps.front().loss, r.report.steps.back().loss,
      r.report.median_step_seconds, mib(r.report.peak_bytes));
  r.report.summary += detail::last_step_line(r.report.steps.back(), r.ex->stats(),
                                             r.eps   ? "expert"
                                             : r.tps ? "tensor"
                                                     : "",
                                             r.eps    ? "expert and data"
                                             : r.sync ? "data"
                                                      : "");
  if (r.held()) {
    if (!r.eps) r.report.summary += detail::zero3_line(*r.sync, "parameters");
    if (r.eps && r.eps->holds_shared())
      r.report.summary += detail::zero3_line(r.eps->shared_sync(), "shared parameters");
    if (r.eps && r.eps->holds_experts())
      r.report.summary += detail::zero3_line(r.eps->expert_sync(), "experts");
  }
  if (r.cache)
    r.report.summary +=
        detail::per_step_line(r.cache->gathered(), r.report.steps.size(), r.cache->peak_bytes());
  if (r.eps)
    r.report.summary += detail::expert_layers_line(r.expert_layers.layers, r.expert_layers.routed,
                                                   r.expert_layers.summed);
  if (!o.save_model.empty()) r.report.summary += fmt::format("wrote {}\n", o.save_model.string());
  return r.report;
}

}  // namespace hp::train

// Resuming and checkpoints of a training run (trainer_run.h): a sharded checkpoint is read piece
// by piece at this run's layout (sharded_run.h), a one-rank one whole and sliced by name; several
// ranks write sharded checkpoints, one rank the one-rank format (hp/train/checkpoint.h).
#include <fmt/core.h>

#include <chrono>
#include <map>

#include "hp/train/sharded_checkpoint.h"
#include "trainer_run.h"

namespace hp::train::detail {

detail::ShardedLayout TrainRun::layout() const {
  detail::ShardedLayout l;
  l.transport = o.dp.active()   ? o.dp.transport
                : o.tp.active() ? o.tp.transport
                : o.ep.active() ? o.ep.transport
                                : nullptr;
  l.tps = tps.get();
  l.sync = sync.get();
  l.eps = eps.get();
  l.dp_index = std::max(0, part);  // the data-parallel position (expert parallelism's too)
  l.tp_index = std::max(0, o.tp.index());
  l.lead = lead();
  return l;
}

Status TrainRun::resume_sharded() {
  HP_ASSIGN_OR_RETURN(
      auto r, detail::load_sharded(layout(), o.resume_dir, params, buffers, o.optimizer.kind));
  for (std::size_t k = 0; k < params.size(); ++k) {
    if (!lent(k))
      HP_TRY(ex->set_weight(params[k].name, tps ? tps->stored(k, r.params[k]) : r.params[k]));
    params[k] = std::move(r.params[k]);
  }
  if (held()) HP_TRY(hold());  // its shard of them; the executor borrows
  for (std::size_t j = 0; j < buffers.size(); ++j) {
    HP_TRY(ex->set_weight(buffers[j].name, r.buffers[j]));
    buffers[j] = std::move(r.buffers[j]);
  }
  state = eps ? eps->slice_state(r.state) : std::move(r.state);
  data_position = r.header.data_position;
  report.first_step = r.header.step + 1;
  return {};
}

Status TrainRun::resume() {
  if (is_sharded_checkpoint(o.resume_dir)) return resume_sharded();
  HP_ASSIGN_OR_RETURN(auto c, load_checkpoint(o.resume_dir, o.optimizer.kind));
  if (eps) return resume_by_name(std::move(c));
  if (c.params.size() != params.size())
    return Error(Errc::bad_input,
                 fmt::format("the checkpoint holds {} parameters, the model trains {}",
                             c.params.size(), params.size()),
                 o.resume_dir.string());
  if (tps) return resume_by_name(std::move(c));
  for (std::size_t k = 0; k < params.size(); ++k) {
    if (c.params[k].name != params[k].name || c.params[k].dims != params[k].dims)
      return Error(Errc::bad_input,
                   fmt::format("checkpoint parameter '{}' does not match the model's '{}'",
                               c.params[k].name, params[k].name),
                   o.resume_dir.string());
    if (!lent(k)) HP_TRY(ex->set_weight(params[k].name, c.params[k]));
    params[k] = std::move(c.params[k]);
  }
  if (held()) HP_TRY(hold());
  state = sync ? sync->slice_state(c.state) : std::move(c.state);
  HP_TRY(resume_buffers(c));
  data_position = c.data_position;
  report.first_step = c.step + 1;
  return {};
}

Status TrainRun::resume_buffers(const Checkpoint& c) {
  for (const auto& b : c.buffers) {
    auto mine = std::find_if(buffers.begin(), buffers.end(),
                             [&](const exec::HostTensor& t) { return t.name == b.name; });
    if (mine == buffers.end())
      return Error(
          Errc::bad_input,
          fmt::format("the checkpoint holds buffer '{}', which this run does not update", b.name),
          o.resume_dir.string());
    HP_TRY(ex->set_weight(b.name, b));
    *mine = b;
  }
  return {};
}

Status TrainRun::resume_by_name(Checkpoint c) {
  std::map<std::string, std::size_t> at;
  for (std::size_t j = 0; j < c.params.size(); ++j) at.emplace(c.params[j].name, j);
  // This member's part of a whole tensor of the checkpoint: its slice under tensor parallelism,
  // the tensor itself under expert parallelism.
  auto mine_of = [&](std::size_t k, const exec::HostTensor& whole) -> Expected<exec::HostTensor> {
    if (tps) return tps->slice(k, whole);
    if (whole.dims != params[k].dims)
      return Error(Errc::bad_input,
                   fmt::format("checkpoint parameter '{}' is {}, the model's is {}", whole.name,
                               exec::dims_label(whole.dims), exec::dims_label(params[k].dims)),
                   o.resume_dir.string());
    return whole;
  };
  OptimizerState mine;
  mine.step = c.state.step;
  for (std::size_t k = 0; k < params.size(); ++k) {
    auto it = at.find(params[k].name);
    if (it == at.end())
      return Error(Errc::bad_input,
                   fmt::format("the checkpoint has no parameter '{}'", params[k].name),
                   o.resume_dir.string());
    HP_ASSIGN_OR_RETURN(auto p, mine_of(k, c.params[it->second]));
    if (!lent(k)) HP_TRY(ex->set_weight(params[k].name, tps ? tps->stored(k, p) : p));
    params[k] = std::move(p);
    for (auto list : {&OptimizerState::exp_avg, &OptimizerState::exp_avg_sq})
      if (!(c.state.*list).empty()) {
        HP_ASSIGN_OR_RETURN(auto m, mine_of(k, (c.state.*list).at(it->second)));
        (mine.*list).push_back(std::move(m));
      }
  }
  if (held()) HP_TRY(hold());
  state = sync ? sync->slice_state(mine) : eps ? eps->slice_state(mine) : std::move(mine);
  HP_TRY(resume_buffers(c));
  data_position = c.data_position;
  report.first_step = c.step + 1;
  return {};
}

Status TrainRun::checkpoint() {
  const auto t0 = std::chrono::steady_clock::now();
  Status st = write_checkpoint();
  if (!o.trace.empty())
    trace.add(fmt::format("checkpoint {}", state.step), "checkpoint", 0, t0,
              std::chrono::steady_clock::now());
  return st;
}

Status TrainRun::write_checkpoint() {
  if (tps || sync || eps) {  // several ranks: each writes its own pieces
    ShardedState h;
    h.step = state.step;
    h.optimizer_step = state.step;
    h.data_position = data_position;
    h.seed = o.seed;
    h.optimizer = optimizer_name(o.optimizer.kind);
    if (eps) {  // each member writes its parameters' state whole, in their order
      HP_ASSIGN_OR_RETURN(auto whole_state, eps->gather_state(state));
      HP_ASSIGN_OR_RETURN(auto mine, eps->with_held(params));  // ZeRO-3: gathered
      return detail::save_sharded(layout(), h, mine, whole_state, buffers, o.checkpoint_dir,
                                  o.force_checkpoint);
    }
    if (held()) {  // ZeRO-3: the parameters are gathered for the writers
      HP_ASSIGN_OR_RETURN(auto gathered, sync->gather_parameters(params));
      return detail::save_sharded(layout(), h, gathered, state, buffers, o.checkpoint_dir,
                                  o.force_checkpoint);
    }
    return detail::save_sharded(layout(), h, params, state, buffers, o.checkpoint_dir,
                                o.force_checkpoint);
  }
  OptimizerState whole_state = state;
  if (sync) {
    HP_ASSIGN_OR_RETURN(whole_state, sync->gather_state(state, params));
  }
  HP_ASSIGN_OR_RETURN(auto whole_params, whole(params));
  if (tps || eps) {
    HP_ASSIGN_OR_RETURN(whole_state.exp_avg, whole(whole_state.exp_avg));
    HP_ASSIGN_OR_RETURN(whole_state.exp_avg_sq, whole(whole_state.exp_avg_sq));
  }
  if (!lead()) return {};
  Checkpoint c;
  c.step = state.step;
  c.data_position = data_position;
  c.seed = o.seed;
  c.optimizer = optimizer_name(o.optimizer.kind);
  c.params = std::move(whole_params);
  c.state = std::move(whole_state);
  c.buffers = buffers;
  return save_checkpoint(forward, c, o.checkpoint_dir, o.force_checkpoint);
}

}  // namespace hp::train::detail

// Pipeline-parallel training jobs (train_run.h): the stage boundaries the recipe's [[stages]] give
// (hp shard's partition plan: the activations that cross from each stage to the next), where the
// ranks are (the plan's stage ranks: with dp > 1 stage k's replicas, one per data-parallel index),
// and each rank's part of the schedule (schedule.h) as hp::train::PipelineRole.
#include <fmt/core.h>

#include "hp/job/schedule.h"
#include "hp/job/train_run.h"
#include "hp/shard/shard.h"

namespace hp::job {

Status pipeline_options(const Job& job, train::TrainOptions& to) {
  const recipe::Recipe& r = job.recipe;
  const std::string where = job.where.at("parallel.pp");
  using S = recipe::Schedule;
  const S s = r.parallel.schedule;
  // hp shard cuts an interleaved recipe into pp x virtual_stages stages; ZB-V's V has the same
  // stages (two chunks per rank), only placed otherwise, which the positions below say.
  recipe::Recipe planned = r;
  if (s == S::zbv) {
    planned.parallel.schedule = S::interleaved;
    for (auto& st : planned.stages) st.ranks.clear();
  }
  std::shared_ptr<const shard::Prepared> prepared;
  {
    HP_ASSIGN_OR_RETURN(auto made, shard::prepare(planned, job.where, job.recipe_path));
    prepared = std::move(made);
  }
  const auto stages = prepared->plan.stages.size();
  const auto p = static_cast<int>(r.parallel.pp);
  std::vector<std::vector<std::string>> cuts(stages - 1);
  for (const auto& b : prepared->plan.boundaries) {
    const std::string& name = prepared->graph.tensor(b.tensor).name;
    if (b.to_stage != b.from_stage + 1)
      return Error(Errc::not_implemented,
                   fmt::format("'{}' goes from stage {} to stage {}: pipeline training passes "
                               "activations to the next stage only",
                               name, b.from_stage, b.to_stage),
                   job.recipe_path.string(), "cut the stages where one tensor stream crosses");
    auto& cut = cuts.at(static_cast<std::size_t>(b.from_stage));
    if (std::find(cut.begin(), cut.end(), name) == cut.end()) cut.push_back(name);
  }
  for (std::size_t b = 0; b < cuts.size(); ++b)
    if (cuts[b].empty())
      return Error(Errc::bad_input,
                   fmt::format("the recipe's [[stages]] pass nothing from stage {} to stage {}: "
                               "they do not split the model into a pipeline",
                               b, b + 1),
                   job.recipe_path.string(), "give each stage a range of the model's layers");
  train::PipelineRole& pp = to.pp;
  pp.grid.assign(static_cast<std::size_t>(p), {});
  for (const auto& st : prepared->plan.stages)
    if (st.index < p)
      for (std::int64_t rank : st.ranks)
        pp.grid.at(static_cast<std::size_t>(st.index)).push_back(static_cast<int>(rank));
  pp.position_of_stage.clear();
  for (int vs = 0; stages > static_cast<std::size_t>(p) && vs < static_cast<int>(stages); ++vs)
    pp.position_of_stage.push_back(s == S::zbv && vs >= p ? 2 * p - 1 - vs : vs % p);
  pp.micro_batches = static_cast<int>(r.parallel.micro_batches);
  pp.split_weight = s == S::zb_h1 || s == S::zbv;
  pp.cuts = std::move(cuts);
  // Tensor parallelism: each rank trains its partition of each of its stages.
  if (r.parallel.tp > 1) HP_TRY(tensor_parallel_setup(job, prepared, to));
  return {};
}

Expected<std::vector<train::PipelineAction>> pipeline_actions(const recipe::Recipe& r,
                                                              const train::PipelineRole& pp,
                                                              int position) {
  HP_ASSIGN_OR_RETURN(ScheduleKind kind,
                      parse_schedule_kind(recipe::schedule_name(r.parallel.schedule)));
  const int chunks = pp.stages() / static_cast<int>(pp.ranks.size());
  HP_ASSIGN_OR_RETURN(auto sched, make_schedule(kind, static_cast<int>(pp.ranks.size()),
                                                pp.micro_batches, chunks, true));
  std::vector<train::PipelineAction> out;
  for (const Action& a : sched.per_rank.at(static_cast<std::size_t>(position))) {
    train::PipelineAction x;
    x.micro_batch = a.micro_batch;
    x.stage = a.stage;
    if (a.kind == ActionKind::forward)
      x.kind = train::PipelineAction::Kind::forward;
    else if (a.kind == ActionKind::backward)
      x.kind = train::PipelineAction::Kind::backward;
    else if (a.kind == ActionKind::weight)
      x.kind = train::PipelineAction::Kind::weight;
    else
      continue;
    out.push_back(x);
  }
  return out;
}

Status pipeline_rank(const recipe::Recipe& r, comm::Transport& t, train::TrainOptions& to) {
  train::PipelineRole& pp = to.pp;
  const auto& grid = pp.grid;
  pp.transport = &t;
  pp.ranks.clear();
  for (std::size_t s = 0; s < grid.size(); ++s)
    for (std::size_t d = 0; d < grid[s].size(); ++d)
      if (grid[s][d] == t.rank()) {
        for (const auto& stage : grid) pp.ranks.push_back(stage.at(d));
        pp.stage = static_cast<int>(s);
        if (r.parallel.tp > 1) {  // the stage's tensor-parallel group of this mesh position
          const auto tp = static_cast<std::size_t>(r.parallel.tp);
          to.tp.transport = &t;
          to.tp.position = static_cast<int>(d);
          to.tp.group.assign(grid[s].begin() + static_cast<std::ptrdiff_t>(d / tp * tp),
                             grid[s].begin() + static_cast<std::ptrdiff_t>(d / tp * tp + tp));
          if (r.parallel.dp > 1) {
            to.dp = data_parallel_of(r, t);
            to.dp.group.clear();
            for (std::size_t q = d % tp; q < grid[s].size(); q += tp)
              to.dp.group.push_back(grid[s][q]);
            to.tp.replica.clear();
            for (const auto& stage : grid)
              for (std::size_t q = d / tp * tp; q < d / tp * tp + tp; ++q)
                to.tp.replica.push_back(stage.at(q));
          }
          continue;
        }
        to.dp = data_parallel_of(r, t);
        to.dp.group = grid[s];
        if (r.parallel.expert_parallel > 1) {  // the stage's replicas share its experts out
          to.ep = expert_parallel_of(r, t);
          to.ep.data = grid[s];
          const auto ep = static_cast<std::size_t>(r.parallel.expert_parallel);
          to.ep.group.assign(grid[s].begin() + static_cast<std::ptrdiff_t>(d / ep * ep),
                             grid[s].begin() + static_cast<std::ptrdiff_t>(d / ep * ep + ep));
          to.ep.replicas.clear();
          for (std::size_t q = d % ep; q < grid[s].size(); q += ep)
            to.ep.replicas.push_back(grid[s][q]);
        }
      }
  if (pp.ranks.empty())
    return Error(Errc::bad_input, fmt::format("rank {} runs no pipeline stage", t.rank()));
  HP_ASSIGN_OR_RETURN(pp.actions, pipeline_actions(r, pp, pp.stage));
  return {};
}

}  // namespace hp::job

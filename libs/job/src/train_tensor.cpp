// Tensor-parallel training jobs (train_run.h): hp shard partitions the recipe once per process, and
// each rank trains the partition of its mesh position (hp/train/tensor_parallel.h).
#include <fmt/core.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <memory>

#include "hp/job/train_run.h"
#include "hp/shard/partition.h"
#include "hp/shard/shard.h"

namespace hp::job {

namespace {

// How weight `t` is cut over the stage mesh's positions (its held view's blocks).
train::ParamCut cut_of(const shard::Prepared& p, int t) {
  const auto& tensor = p.graph.tensor(t);
  const auto shape = shard::global_shape(tensor);
  const shard::HeldView v = shard::held_view(p.prop, t, shape);
  train::ParamCut c;
  c.shape = shape;
  c.view = v.shape;
  for (const auto& a : p.prop.layout[static_cast<std::size_t>(t)].partial)
    c.partial *= p.prop.mesh.dims[static_cast<std::size_t>(a.axis)];
  for (std::int64_t pos = 0; pos < p.prop.mesh.size(); ++pos) {
    std::vector<std::pair<std::int64_t, std::int64_t>> r;
    for (const auto& range : shard::slice_of(p.prop.mesh, v.layout, v.shape, pos))
      r.emplace_back(range.begin, range.end);
    c.ranges.push_back(std::move(r));
  }
  return c;
}

// The partition's collectives run on `ranks` (per mesh position) instead of hp shard's `placed`.
Status rename_ranks(shard::RankPartition& rp, const std::vector<std::int64_t>& placed,
                    const std::vector<int>& ranks) {
  if (ranks.empty()) return {};
  if (ranks.size() != placed.size())
    return Error(Errc::internal, "a pipeline stage runs on another number of ranks than planned");
  std::map<std::int64_t, std::int64_t> to;
  bool same = true;
  for (std::size_t k = 0; k < ranks.size(); ++k) {
    to[placed[k]] = ranks[k];
    same = same && placed[k] == ranks[k];
  }
  if (same) return {};
  onnx::ModelProto m;
  if (!m.ParseFromString(rp.onnx)) return Error(Errc::internal, "a partition does not parse");
  for (auto& n : *m.mutable_graph()->mutable_node()) {
    if (n.domain() != "hp") continue;
    for (auto& a : *n.mutable_attribute()) {
      if (a.name() != "group") continue;
      for (auto& r : *a.mutable_ints()) {
        auto it = to.find(r);
        if (it == to.end())
          return Error(Errc::internal,
                       fmt::format("'{}' runs on rank {}, outside its stage", n.name(), r));
        r = it->second;
      }
    }
  }
  if (!m.SerializeToString(&rp.onnx))
    return Error(Errc::internal, "a partition does not serialize");
  return {};
}

}  // namespace

Status tensor_parallel_rank(const recipe::Recipe& r, comm::Transport& t, train::TrainOptions& to) {
  const auto& grid = to.tp.grid;
  for (std::size_t d = 0; d < grid.size(); ++d)
    for (std::size_t j = 0; j < grid[d].size(); ++j)
      if (grid[d][j] == t.rank()) {
        to.tp.transport = &t;
        to.tp.group = grid[d];
        to.tp.position = static_cast<int>(d * grid[d].size() + j);
        if (grid.size() > 1) {  // this index's replicas over the data-parallel ranks
          to.dp = data_parallel_of(r, t);
          to.dp.group.clear();
          for (const auto& row : grid) to.dp.group.push_back(row.at(j));
        }
        return {};
      }
  return Error(Errc::bad_input,
               fmt::format("rank {} is on no tensor-parallel group of the recipe", t.rank()));
}

Status tensor_parallel_options(const Job& job, train::TrainOptions& to) {
  std::shared_ptr<shard::Prepared> prepared;
  {
    HP_ASSIGN_OR_RETURN(auto made, shard::prepare(job.recipe, job.where, job.recipe_path));
    prepared = std::move(made);
  }
  return tensor_parallel_setup(job, std::move(prepared), to);
}

Status tensor_parallel_setup(const Job& job, std::shared_ptr<const shard::Prepared> prepared,
                             train::TrainOptions& to) {
  const auto& stage = prepared->plan.stages.at(0);
  const auto tp = static_cast<std::size_t>(job.recipe.parallel.tp);
  to.tp.grid.assign(stage.ranks.size() / tp, {});
  for (std::size_t pos = 0; pos < stage.ranks.size(); ++pos)
    to.tp.grid[pos / tp].push_back(static_cast<int>(stage.ranks[pos]));
  // The split weights' cuts, the same for every member: by tensor-parallel index (a weight split
  // over dp as well is not trained yet).
  std::map<std::string, train::ParamCut> cuts;
  for (std::size_t t = 0; t < prepared->graph.tensors.size(); ++t) {
    const auto& tensor = prepared->graph.tensor(static_cast<int>(t));
    if (tensor.kind != model::TensorKind::initializer) continue;
    const auto& layout = prepared->prop.layout[t];
    bool split = !layout.partial.empty();
    for (const auto& d : layout.dims) {
      split = split || !d.empty();
      if (std::find(d.begin(), d.end(), prepared->dp_axis) != d.end())
        return Error(Errc::not_implemented,
                     fmt::format("weight '{}' is split over dp: training keeps weights whole "
                                 "over data-parallel ranks (use optimizer_shard for that)",
                                 tensor.name),
                     job.recipe_path.string());
    }
    if (split) {
      train::ParamCut c = cut_of(*prepared, static_cast<int>(t));
      c.ranges.resize(tp);  // mesh positions 0 .. tp-1: the first data-parallel row
      cuts.emplace(tensor.name, std::move(c));
    }
  }
  to.tp.partition = [prepared, cuts](
                        int stage, int position,
                        const std::vector<int>& ranks) -> Expected<train::TensorParallelPart> {
    HP_ASSIGN_OR_RETURN(auto rp, shard::build_partition(prepared->plan, stage, position));
    HP_TRY(
        rename_ranks(rp, prepared->plan.stages.at(static_cast<std::size_t>(stage)).ranks, ranks));
    train::TensorParallelPart part;
    part.onnx = std::move(rp.onnx);
    part.varying = std::move(rp.varying);
    part.cuts = cuts;
    return part;
  };
  return {};
}

}  // namespace hp::job

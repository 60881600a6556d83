// Tensor-parallel training jobs (train_run.h): hp shard partitions the recipe once per process, and
// each rank trains the partition of its mesh position (hp/train/tensor_parallel.h).
#include <fmt/core.h>

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

}  // namespace

Status tensor_parallel_options(const Job& job, train::TrainOptions& to) {
  std::shared_ptr<shard::Prepared> prepared;
  {
    HP_ASSIGN_OR_RETURN(auto made, shard::prepare(job.recipe, job.where, job.recipe_path));
    prepared = std::move(made);
  }
  const auto& stage = prepared->plan.stages.at(0);
  to.tp.group.assign(stage.ranks.begin(), stage.ranks.end());
  // The split weights' cuts, the same for every member.
  std::map<std::string, train::ParamCut> cuts;
  for (std::size_t t = 0; t < prepared->graph.tensors.size(); ++t) {
    const auto& tensor = prepared->graph.tensor(static_cast<int>(t));
    if (tensor.kind != model::TensorKind::initializer) continue;
    const auto& layout = prepared->prop.layout[t];
    bool split = !layout.partial.empty();
    for (const auto& d : layout.dims) split = split || !d.empty();
    if (split) cuts.emplace(tensor.name, cut_of(*prepared, static_cast<int>(t)));
  }
  to.tp.partition = [prepared, cuts](int index) -> Expected<train::TensorParallelPart> {
    HP_ASSIGN_OR_RETURN(auto rp, shard::build_partition(prepared->plan, 0, index));
    train::TensorParallelPart part;
    part.onnx = std::move(rp.onnx);
    part.varying = std::move(rp.varying);
    part.cuts = cuts;
    return part;
  };
  return {};
}

}  // namespace hp::job

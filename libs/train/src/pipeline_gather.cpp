// ZeRO-3 on a pipeline rank (pipeline_gather.h): the parts' executors borrow the stage's
// parameters from the data-parallel sync, one request ahead over the whole step.
#include "pipeline_gather.h"

#include <fmt/core.h>

#include <algorithm>

#include "pipeline_stage.h"

namespace hp::train::detail {

Status StepGathers::begin_step() {
  if (fetched_ != asked_)
    return Error(Errc::internal, fmt::format("the last step left {} parameter gathers unfetched",
                                             asked_ - fetched_));
  asked_ = fetched_ = 0;
  // The step's first bucket now: the update that changes the shards is done.
  if (!sequence_.empty()) source_.prefetch(sequence_[asked_++]);
  return {};
}

Status StepGathers::fetch(std::size_t bucket, std::span<float* const> dst) {
  if (fetched_ >= sequence_.size() || sequence_[fetched_] != bucket)
    return Error(Errc::internal,
                 fmt::format("parameter bucket {} fetched out of the step's order (request {})",
                             bucket, fetched_));
  // Never past the step's end: the update changes the shards before the next step's first use.
  const std::size_t ahead = std::min(sequence_.size(), fetched_ + 2);
  for (; asked_ < ahead; ++asked_) source_.prefetch(sequence_[asked_]);
  ++fetched_;
  return source_.fetch(bucket, dst);
}

Status PartSource::fetch(std::size_t g, std::span<float* const> dst) {
  if (g >= groups_.size() || dst.size() != groups_[g].at.size())
    return Error(Errc::internal, fmt::format("a stage part fetched group {} wrongly", g));
  const Group& group = groups_[g];
  std::vector<float*> all(group.width, nullptr);
  for (std::size_t i = 0; i < group.at.size(); ++i) all[group.at[i]] = dst[i];
  return step_.fetch(group.bucket, all);
}

Status PipelineStage::lend(exec::WeightSource* source,
                           const std::vector<std::vector<std::string>>& buckets) {
  if (gathers_) return Error(Errc::internal, "the stage's parameters are lent already");
  gathers_ = std::make_unique<StepGathers>(*source);
  for (Chunk& c : chunks_)
    for (Part* q : {&c.forward, &c.backward, &c.weight}) {
      if (!q->ex) continue;
      std::vector<PartSource::Group> groups;
      for (std::size_t b = 0; b < buckets.size(); ++b) {
        PartSource::Group g;
        g.bucket = b;
        g.width = buckets[b].size();
        for (std::size_t i = 0; i < buckets[b].size(); ++i)
          if (std::find(q->part.params.begin(), q->part.params.end(), buckets[b][i]) !=
              q->part.params.end()) {
            g.at.push_back(i);
            g.names.push_back(buckets[b][i]);
          }
        if (!g.at.empty()) groups.push_back(std::move(g));
      }
      if (groups.empty()) continue;
      q->source = std::make_unique<PartSource>(*gathers_, std::move(groups));
      std::vector<std::vector<std::string>> names;
      for (const auto& g : q->source->groups()) names.push_back(g.names);
      HP_TRY(q->ex->set_weight_source(q->source.get(), std::move(names)));
    }
  // The step's sequence: every action's part asks for its uses' buckets in its node order.
  std::vector<std::size_t> sequence;
  for (const PipelineAction& a : role_.actions) {
    Chunk* c = chunk(a.stage >= 0 ? a.stage : chunks_.front().stage);
    if (!c) continue;
    const Part& p = part_of(*c, a.kind);
    if (!p.ex || !p.source) continue;
    for (std::size_t u : p.ex->weight_source_order())
      sequence.push_back(p.source->groups()[u].bucket);
  }
  gathers_->set_sequence(std::move(sequence));
  return {};
}

}  // namespace hp::train::detail

// Sharded checkpoints of data- and tensor-parallel runs (sharded_run.h).
#include "sharded_run.h"

#include <fmt/core.h>

#include <numeric>

#include "hp/plugin/hp_plugin.h"

namespace hp::train::detail {

namespace fs = std::filesystem;
using exec::HostTensor;

namespace {

/// Every rank learns whether all succeeded; the first failure stays the failing rank's own.
Status agree(const ShardedLayout& l, Status mine) {
  if (!l.transport) return mine;
  std::vector<int> all(static_cast<std::size_t>(l.transport->size()));
  std::iota(all.begin(), all.end(), 0);
  std::int32_t flag = mine ? 0 : 1, any = 0;
  HP_TRY(l.transport->allreduce(all, &flag, &any, 1, HP_I32, comm::ReduceOp::max));
  if (!mine) return mine;
  if (any) return Error(Errc::runtime, "another rank could not write its part of the checkpoint");
  return {};
}

std::vector<Extent> whole_runs(const HostTensor& t) { return {{0, t.numel()}}; }

constexpr const char* kMoments[] = {"exp_avg", "exp_avg_sq"};

const std::vector<HostTensor>& moments(const OptimizerState& s, int l) {
  return l == 0 ? s.exp_avg : s.exp_avg_sq;
}

std::vector<HostTensor>& moments(OptimizerState& s, int l) {
  return l == 0 ? s.exp_avg : s.exp_avg_sq;
}

}  // namespace

Status save_sharded(const ShardedLayout& l, const ShardedState& header,
                    const std::vector<HostTensor>& params, const OptimizerState& state,
                    const std::vector<HostTensor>& buffers, const fs::path& dir, bool force) {
  HP_TRY(agree(l, l.lead ? begin_sharded(dir, force) : Status{}));
  auto runs = [&](std::size_t k) { return l.tps ? l.tps->runs(k) : whole_runs(params[k]); };
  auto shape = [&](std::size_t k) { return l.tps ? l.tps->whole_dims(k) : params[k].dims; };
  // A tensor every tensor-parallel member holds whole is written by the first.
  auto owner = [&](std::size_t k) { return (l.tps && l.tps->split(k)) || l.tp_index == 0; };
  // An expert by its holders (the replicas of an expert in other groups write equal copies), the
  // rest by the first data-parallel replica.
  auto writes = [&](std::size_t k) {
    return (l.eps && l.eps->expert(k)) || (l.dp_index == 0 && owner(k));
  };
  std::vector<Shard> shards;
  for (std::size_t k = 0; k < params.size(); ++k)
    if (writes(k)) shards.push_back({params[k].name, "param", shape(k), runs(k), &params[k]});
  const bool zero = l.sync && l.sync->sharded();
  for (int m = 0; m < 2; ++m) {
    const auto& list = moments(state, m);
    if (list.empty()) continue;
    if (!zero) {
      for (std::size_t k = 0; k < params.size(); ++k)
        if (writes(k)) shards.push_back({params[k].name, kMoments[m], shape(k), runs(k), &list[k]});
      continue;
    }
    // ZeRO: this rank's flat pieces of its parameters (HSDP replicas write theirs too: the reader
    // takes either copy).
    const auto& pieces = l.sync->pieces();
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      const FlatPiece& p = pieces[i];
      if (owner(p.param))
        shards.push_back({params[p.param].name, kMoments[m], shape(p.param),
                          sub_runs(runs(p.param), p.offset, p.count), &list[i]});
    }
  }
  if (l.lead)
    for (const auto& b : buffers) shards.push_back({b.name, "buffer", b.dims, whole_runs(b), &b});
  const int rank = l.transport ? l.transport->rank() : 0;
  Status wrote = agree(l, write_shards(dir, rank, shards));
  if (!wrote) {
    if (l.lead) abandon_sharded(dir);
    return wrote;
  }
  ShardedState h = header;
  h.ranks = l.transport ? l.transport->size() : 1;
  return agree(l, l.lead ? commit_sharded(dir, h) : Status{});
}

Expected<ShardedResume> load_sharded(const ShardedLayout& l, const fs::path& dir,
                                     const std::vector<HostTensor>& params,
                                     const std::vector<HostTensor>& buffers, OptimizerKind kind) {
  HP_ASSIGN_OR_RETURN(auto ck, ShardedCheckpoint::open(dir));
  ShardedResume r;
  r.header = ck.state();
  if (r.header.optimizer != optimizer_name(kind))
    return Error(Errc::bad_input,
                 fmt::format("the checkpoint was written by {}, the recipe trains with another "
                             "optimizer",
                             r.header.optimizer),
                 dir.string());
  r.state.step = r.header.optimizer_step;
  auto runs = [&](std::size_t k) { return l.tps ? l.tps->runs(k) : whole_runs(params[k]); };
  auto shape = [&](std::size_t k) { return l.tps ? l.tps->whole_dims(k) : params[k].dims; };
  for (std::size_t k = 0; k < params.size(); ++k) {
    HP_ASSIGN_OR_RETURN(auto p,
                        ck.read(params[k].name, "param", shape(k), runs(k), params[k].dims));
    r.params.push_back(std::move(p));
  }
  for (int m = 0; m < 2; ++m) {
    if (params.empty() || !ck.has(params[0].name, kMoments[m])) continue;  // SGD: no second
    auto& list = moments(r.state, m);
    if (l.sync && l.sync->sharded()) {
      for (const FlatPiece& p : l.sync->pieces()) {
        // As DataParallelSync::slice_state shapes them: a whole parameter keeps its dims.
        std::vector<std::int64_t> dims = {p.count};
        if (p.offset == 0 && p.count == params[p.param].numel()) dims = params[p.param].dims;
        HP_ASSIGN_OR_RETURN(auto t, ck.read(params[p.param].name, kMoments[m], shape(p.param),
                                            sub_runs(runs(p.param), p.offset, p.count), dims));
        list.push_back(std::move(t));
      }
    } else {
      for (std::size_t k = 0; k < params.size(); ++k) {
        HP_ASSIGN_OR_RETURN(
            auto t, ck.read(params[k].name, kMoments[m], shape(k), runs(k), params[k].dims));
        list.push_back(std::move(t));
      }
    }
  }
  for (const auto& b : buffers) {
    HP_ASSIGN_OR_RETURN(auto t, ck.read(b.name, "buffer", b.dims, whole_runs(b), b.dims));
    r.buffers.push_back(std::move(t));
  }
  return r;
}

}  // namespace hp::train::detail

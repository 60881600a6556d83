// Sharded runs of `hp shard` partitions (see sharded.h): feeding the ranks, running their schedule,
// reassembling the outputs.
#include "hp/job/sharded.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>

#include "hp/exec/tensor.h"
#include "hp/job/offload_run.h"
#include "hp/job/schedule.h"
#include "hp/model/model.h"
#include "hp/shard/layout.h"

namespace hp::job {
using comm::ReduceOp;
using comm::run_in_process;
using comm::Transport;
using comm::TransportCommOps;
using exec::Backends;
using exec::bind_inputs;
using exec::dims_label;
using exec::dtype_size;
using exec::Executor;
using exec::GraphIO;
using exec::HostTensor;
using exec::OffloadConfig;
using exec::open_backends;
namespace fs = std::filesystem;
using shard::Range;

namespace {

// Row-major block copy between a whole tensor (dims `dims`, bytes at `whole`) and one of its blocks
// (one Range per dim, bytes at `block`): whole -> block when `to_block`, else block -> whole. The
// innermost dim moves as one run of bytes.
void copy_block(const std::vector<std::int64_t>& dims, unsigned char* whole, unsigned char* block,
                std::size_t es, const std::vector<Range>& r, bool to_block) {
  const std::size_t nd = dims.size();
  if (nd == 0) {
    if (to_block)
      std::memcpy(block, whole, es);
    else
      std::memcpy(whole, block, es);
    return;
  }
  for (const auto& x : r)
    if (x.size() == 0) return;
  std::vector<std::int64_t> stride(nd, 1), bstride(nd, 1);
  for (std::size_t d = nd - 1; d-- > 0;) {
    stride[d] = stride[d + 1] * dims[d + 1];
    bstride[d] = bstride[d + 1] * r[d + 1].size();
  }
  const std::size_t run = static_cast<std::size_t>(r[nd - 1].size()) * es;
  std::vector<std::int64_t> idx(nd, 0);  // position inside the block; the last dim stays 0
  for (;;) {
    std::int64_t off = 0, boff = 0;
    for (std::size_t d = 0; d < nd; ++d) {
      off += (r[d].begin + idx[d]) * stride[d];
      boff += idx[d] * bstride[d];
    }
    unsigned char* w = whole + static_cast<std::size_t>(off) * es;
    unsigned char* b = block + static_cast<std::size_t>(boff) * es;
    if (to_block)
      std::memcpy(b, w, run);
    else
      std::memcpy(w, b, run);
    std::size_t d = nd - 1;  // odometer over all dims but the last
    for (;;) {
      if (d == 0) return;
      --d;
      if (++idx[d] < r[d].size()) break;
      idx[d] = 0;
    }
  }
}

HostTensor take_block(const HostTensor& t, const std::vector<Range>& r) {
  HostTensor b;
  b.name = t.name;
  b.dtype = t.dtype;
  for (const auto& x : r) b.dims.push_back(x.size());
  b.data.resize(static_cast<std::size_t>(b.numel() * dtype_size(t.dtype)));
  copy_block(t.dims, const_cast<unsigned char*>(t.data.data()), b.data.data(),  // only read from
             static_cast<std::size_t>(dtype_size(t.dtype)), r, true);
  return b;
}

std::vector<Range> whole(const std::vector<std::int64_t>& dims) {
  std::vector<Range> r;
  for (auto d : dims) r.push_back({0, d});
  return r;
}

struct Placed {
  shard::Mesh mesh;
  shard::Sharding sharding;
};

Expected<Placed> place(const shard::Manifest& m, const shard::ManifestLayout& l) {
  HP_ASSIGN_OR_RETURN(auto mesh, shard::Mesh::make(m.device_matrix, m.alias_name));
  auto s = shard::parse_tensor_map(mesh, l.tensor_map, l.tensor, static_cast<int>(l.shape.size()));
  if (!s) return std::move(s).error();
  HP_TRY(shard::check_shape(mesh, *s, l.shape, l.tensor));
  return Placed{std::move(mesh), std::move(*s)};
}

const shard::ManifestRank* find_rank(const shard::Manifest& m, int rank) {
  for (const auto& r : m.ranks)
    if (r.rank == rank) return &r;
  return nullptr;
}

std::int64_t position_of(const Placed& p, const shard::ManifestRank& r) {
  // The stage mesh is [dp, tp] (hp/shard/shard.h); rank_list is the positions 0..n-1.
  return p.mesh.rank_at({r.dp, r.tp});
}

}  // namespace

Expected<std::vector<std::vector<HostTensor>>> rank_inputs(
    const shard::Manifest& m, int rank, const std::vector<GraphIO>& wanted,
    const std::vector<HostTensor>& global_inputs) {
  const shard::ManifestRank* mr = find_rank(m, rank);
  if (!mr) return Error(Errc::bad_input, fmt::format("the manifest has no rank {}", rank));
  const auto mb = static_cast<std::size_t>(m.micro_batches);
  std::vector<std::vector<HostTensor>> per_mb(mb);
  for (std::size_t k = 0; k < wanted.size(); ++k) {
    const auto& io = wanted[k];
    const shard::ManifestLayout* l = nullptr;
    for (const auto& x : m.inputs)
      if (x.tensor == io.name) l = &x;
    if (!l)
      return Error(Errc::bad_input,
                   fmt::format("rank {} reads '{}', which is no graph input of the manifest", rank,
                               io.name));
    // The global input: by name, else by the manifest's input position (unnamed input_K.pb files).
    const HostTensor* g = nullptr;
    for (const auto& t : global_inputs)
      if (t.name == io.name) g = &t;
    if (!g) {
      std::size_t pos = 0;
      while (pos < m.inputs.size() && m.inputs[pos].tensor != io.name) ++pos;
      if (pos < global_inputs.size() && global_inputs[pos].name.empty()) g = &global_inputs[pos];
    }
    if (!g)
      return Error(Errc::bad_input, fmt::format("no input named '{}' was given", io.name), "",
                   "pass it in --inputs");
    std::vector<std::int64_t> micro = g->dims;
    const bool split = l->batched && m.micro_batches > 1;
    if (split && !micro.empty() && micro[0] % m.micro_batches == 0) micro[0] /= m.micro_batches;
    if (micro != l->shape) {
      std::vector<std::int64_t> full = l->shape;
      if (split) full[0] *= m.micro_batches;
      return Error(Errc::bad_input,
                   fmt::format("input '{}' has shape {}; the partitions expect {}{}", io.name,
                               dims_label(g->dims), dims_label(full),
                               split ? fmt::format(" ({} micro-batches of {})", m.micro_batches,
                                                   dims_label(l->shape))
                                     : ""),
                   "", "give the shape of the recipe's [model] dims");
    }
    HP_ASSIGN_OR_RETURN(auto placed, place(m, *l));
    auto slice = shard::slice_of(placed.mesh, placed.sharding, l->shape, position_of(placed, *mr));
    for (std::size_t k2 = 0; k2 < mb; ++k2) {
      std::vector<Range> r = slice;
      if (split) {
        r[0].begin += static_cast<std::int64_t>(k2) * l->shape[0];
        r[0].end += static_cast<std::int64_t>(k2) * l->shape[0];
      }
      HostTensor t = take_block(*g, r);
      t.name = io.name;
      per_mb[k2].push_back(std::move(t));
    }
  }
  return per_mb;
}

Expected<int> stage_of(const shard::Manifest& m, int rank) {
  const shard::ManifestRank* mr = find_rank(m, rank);
  if (!mr) return Error(Errc::bad_input, fmt::format("the manifest has no rank {}", rank));
  return static_cast<int>(mr->stage % m.pp);
}

int rank_count(const shard::Manifest& m) {
  std::set<std::int64_t> ranks;
  for (const auto& r : m.ranks) ranks.insert(r.rank);
  return static_cast<int>(ranks.size());
}

Expected<RankRun> run_rank(const shard::Manifest& m, const ShardedRunOptions& o, Transport& t,
                           const Backends& backends, const std::vector<HostTensor>& global_inputs,
                           const OffloadConfig& offload) {
  const int rank = t.rank();
  const shard::ManifestRank* mr = find_rank(m, rank);
  if (!mr)
    return Error(
        Errc::bad_input,
        fmt::format("the manifest has no rank {} (it lists {} ranks)", rank, m.ranks.size()),
        (o.shard_dir / "manifest.toml").string());
  if (!m.weights)
    return Error(Errc::bad_input,
                 "the partitions hold shapes only (the model has no weight data); they cannot run",
                 (o.shard_dir / "manifest.toml").string(),
                 "shard a model exported with its weights");
  const PipelineSchedule& sched = o.schedule;
  const int v = static_cast<int>(m.virtual_stages);
  if (sched.ranks != m.pp || sched.micro_batches != m.micro_batches || sched.chunks != v)
    return Error(Errc::bad_input,
                 fmt::format("the partitions are for pp={}, {} micro-batch(es), {} chunk(s) per "
                             "rank; the schedule ({}) "
                             "is for pp={}, {}, {}",
                             m.pp, m.micro_batches, v, schedule_kind_name(sched.kind), sched.ranks,
                             sched.micro_batches, sched.chunks),
                 (o.shard_dir / "manifest.toml").string());
  RankRun rr;
  rr.rank = rank;
  rr.stage = static_cast<int>(mr->stage % m.pp);

  // One executor per model chunk this rank holds (chunk c = virtual stage c * pp + pipeline index),
  // each with its inputs per micro-batch.
  struct Chunk {
    std::unique_ptr<Executor> exec;
    std::vector<std::vector<HostTensor>> inputs;  // [micro-batch][input]
  };
  std::vector<Chunk> chunks(static_cast<std::size_t>(v));
  TransportCommOps comm(t);
  for (const auto& entry : m.ranks) {
    if (entry.rank != rank) continue;
    const auto c = static_cast<std::size_t>(entry.stage / m.pp);
    if (c >= chunks.size() || chunks[c].exec)
      return Error(Errc::bad_input,
                   fmt::format("rank {} lists stage {} twice or outside the {} chunks", rank,
                               entry.stage, v),
                   (o.shard_dir / "manifest.toml").string());
    model::LoadOptions lo;
    lo.mode = model::LoadMode::require_data;
    HP_ASSIGN_OR_RETURN(auto model, model::load_model(o.shard_dir / entry.file, lo));
    auto ex = Executor::create(model, {backends.primary, backends.cpu, &comm, offload});
    if (!ex) return std::move(ex).error();
    auto inputs = rank_inputs(m, rank, (*ex)->inputs(), global_inputs);
    if (!inputs) return std::move(inputs).error();
    for (auto& in : *inputs) {
      auto bound = bind_inputs((*ex)->inputs(), std::move(in), fmt::format("rank {}", rank));
      if (!bound) return std::move(bound).error();
      in = std::move(*bound);
    }
    chunks[c] = {std::move(*ex), std::move(*inputs)};
  }
  for (std::size_t c = 0; c < chunks.size(); ++c)
    if (!chunks[c].exec)
      return Error(Errc::bad_input,
                   fmt::format("rank {} has no partition for model chunk {}", rank, c),
                   (o.shard_dir / "manifest.toml").string());

  const int mb = static_cast<int>(m.micro_batches);
  const std::vector<Action>& actions = sched.per_rank[static_cast<std::size_t>(rr.stage)];
  std::vector<std::vector<HostTensor>> outs(static_cast<std::size_t>(mb));
  // A barrier before every step, so every rank's clock starts with the schedule (model loading
  // times differ, and a step's last stage finishes after the first).
  std::vector<int> everyone;
  for (int k = 0; k < t.size(); ++k) everyone.push_back(k);
  for (int step = 0; step < std::max(o.steps, 1); ++step) {
    std::int32_t one = 1, sum = 0;
    HP_TRY(t.allreduce(everyone, &one, &sum, 1, HP_I32, ReduceOp::sum));
    const auto t0 = std::chrono::steady_clock::now();
    auto since = [&] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    rr.actions.clear();
    for (const Action& a : actions) {
      if (!a.is_compute()) continue;  // SEND/RECV run as the partition's hp.Send / hp.Recv nodes
      comm.set_micro_batch(a.micro_batch);
      Chunk& ch = chunks[static_cast<std::size_t>(a.stage / m.pp)];
      ActionTime at{a.micro_batch, since(), 0};
      auto out = ch.exec->run(ch.inputs[static_cast<std::size_t>(a.micro_batch)]);
      if (!out) return std::move(out).error();
      at.end_s = since();
      const auto& by_op = ch.exec->stats().by_op;
      if (auto w = by_op.find("hp.Recv"); w != by_op.end()) at.wait_s = w->second.seconds;
      rr.actions.push_back(at);
      if (!out->empty())
        outs[static_cast<std::size_t>(a.micro_batch)] = std::move(*out);  // the chunk with outputs
    }
    HP_TRY(t.flush());
    rr.seconds = since();
    rr.step_seconds.push_back(rr.seconds);
  }
  rr.stats = chunks.back().exec->stats();
  // Local outputs, micro-batches concatenated along axis 0.
  for (std::size_t j = 0; !outs.empty() && j < outs[0].size(); ++j) {
    HostTensor c = outs[0][j];
    for (std::size_t k = 1; k < outs.size(); ++k) {
      const HostTensor& p = outs[k][j];
      if (c.dims.empty() || p.dims.size() != c.dims.size())
        return Error(
            Errc::bad_input,
            fmt::format("output '{}' is a scalar; micro-batches cannot be concatenated", c.name));
      c.dims[0] += p.dims[0];
      c.data.insert(c.data.end(), p.data.begin(), p.data.end());
    }
    rr.outputs.push_back(std::move(c));
  }
  return rr;
}

Expected<std::vector<HostTensor>> assemble_outputs(
    const shard::Manifest& m, const std::vector<std::vector<HostTensor>>& per_rank) {
  std::vector<HostTensor> result;
  const std::int64_t mb = m.micro_batches;
  for (const auto& l : m.outputs) {
    if (!l.partial.empty())
      return Error(Errc::internal, fmt::format("output '{}' is left as a partial sum over {}",
                                               l.tensor, l.partial[0]));
    HP_ASSIGN_OR_RETURN(auto placed, place(m, l));
    HostTensor g;
    g.name = l.tensor;
    g.dims = l.shape;
    if (mb > 1) {
      if (!l.batched)
        return Error(
            Errc::bad_input,
            fmt::format("output '{}' has no batch axis to concatenate micro-batches on", l.tensor));
      g.dims[0] *= mb;
    }
    std::vector<std::vector<Range>> done;
    bool have_dtype = false;
    for (std::size_t r = 0; r < per_rank.size(); ++r) {
      const HostTensor* piece = nullptr;
      for (const auto& t : per_rank[r])
        if (t.name == l.tensor) piece = &t;
      if (!piece) continue;
      const shard::ManifestRank* mr = find_rank(m, static_cast<int>(r));
      if (!mr) continue;
      auto slice = shard::slice_of(placed.mesh, placed.sharding, l.shape, position_of(placed, *mr));
      if (std::find(done.begin(), done.end(), slice) != done.end()) continue;  // a replica
      std::vector<std::int64_t> want;
      for (const auto& x : slice) want.push_back(x.size());
      if (mb > 1) want[0] *= mb;
      if (piece->dims != want)
        return Error(Errc::bad_input,
                     fmt::format("rank {} holds '{}' as {}, its layout says {}", r, l.tensor,
                                 dims_label(piece->dims), dims_label(want)));
      if (!have_dtype) {
        g.dtype = piece->dtype;
        g.data.assign(static_cast<std::size_t>(g.numel() * dtype_size(g.dtype)), 0);
        have_dtype = true;
      }
      for (std::int64_t k = 0; k < mb; ++k) {
        std::vector<Range> at = slice, in = whole(piece->dims);
        const std::int64_t rows = slice[0].size();
        if (mb > 1) {
          at[0] = {k * l.shape[0] + slice[0].begin, k * l.shape[0] + slice[0].end};
          in[0] = {k * rows, (k + 1) * rows};
        }
        HostTensor part = mb > 1 ? take_block(*piece, in) : *piece;
        copy_block(g.dims, g.data.data(), part.data.data(),
                   static_cast<std::size_t>(dtype_size(g.dtype)), at, false);
      }
      done.push_back(std::move(slice));
    }
    std::int64_t covered = 0;
    for (const auto& s : done) {
      std::int64_t n = 1;
      for (const auto& x : s) n *= x.size();
      covered += n;
    }
    std::int64_t total = 1;
    for (auto d : l.shape) total *= d;
    if (!have_dtype || covered != total)
      return Error(Errc::bad_input,
                   fmt::format("the ranks' outputs do not cover '{}' ({} of {} elements held)",
                               l.tensor, covered, total));
    result.push_back(std::move(g));
  }
  return result;
}

Expected<SimulatedRun> run_sharded_in_process(const shard::Manifest& manifest,
                                              const ShardedRunOptions& o,
                                              const std::vector<HostTensor>& global_inputs) {
  const shard::Manifest* m = &manifest;
  HP_ASSIGN_OR_RETURN(auto backends, open_backends(o.backend, o.threads, o.plugin_paths));
  const int ranks = rank_count(*m);
  SimulatedRun sim;
  sim.ranks.resize(static_cast<std::size_t>(ranks));
  std::mutex mu;
  const auto t0 = std::chrono::steady_clock::now();
  const double wait_s = o.timeout_s > 0 ? o.timeout_s : 60;
  Status st = run_in_process(
      ranks,
      [&](int rank, Transport& t) -> Status {
        // Each rank follows its stage's offload schedule; the budget is not enforced here, because
        // all ranks share this process's one cpu backend (hp launch gives each rank its own).
        OffloadConfig off;
        if (o.recipe) {
          auto stage = stage_of(*m, rank);
          if (!stage) return std::move(stage).error();
          auto run = offload_run_for(*o.recipe, *stage, o.backend);
          if (!run) return std::move(run).error();
          off = run->exec;
        }
        auto rr = run_rank(*m, o, t, backends, global_inputs, off);
        if (!rr) return std::move(rr).error();
        std::lock_guard<std::mutex> lock(mu);
        sim.ranks[static_cast<std::size_t>(rank)] = std::move(*rr);
        return {};
      },
      wait_s);
  if (!st) return std::move(st).error();
  sim.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<std::vector<HostTensor>> per_rank;
  for (const auto& r : sim.ranks) per_rank.push_back(r.outputs);
  auto outs = assemble_outputs(*m, per_rank);
  if (!outs) return std::move(outs).error();
  sim.outputs = std::move(*outs);
  return sim;
}

double measured_bubble(const std::vector<RankRun>& ranks) {
  double makespan = 0, busiest = 0;
  int stages = 0;
  for (const auto& r : ranks) {
    double busy = 0;
    for (const auto& a : r.actions) busy += a.busy();
    busiest = std::max(busiest, busy);
    makespan = std::max(makespan, r.seconds);
    stages = std::max(stages, r.stage + 1);
  }
  return stages > 1 && makespan > 0 ? 1.0 - busiest / makespan : 0.0;
}

std::string format_step_timing(const std::vector<RankRun>& ranks, const PipelineSchedule& sched) {
  const int pp = sched.ranks, micro_batches = sched.micro_batches, chunks = sched.chunks;
  double step = 0;
  std::vector<double> busy(static_cast<std::size_t>(std::max(pp, 1)), 0.0);
  for (const auto& r : ranks) {
    step = std::max(step, r.seconds);
    double b = 0;
    for (const auto& a : r.actions) b += a.busy();
    auto& slot = busy[static_cast<std::size_t>(std::clamp(r.stage, 0, std::max(pp, 1) - 1))];
    slot = std::max(slot, b);
  }
  std::string s = fmt::format("step: {:.4f} s (slowest rank, {} micro-batch{})", step,
                              micro_batches, micro_batches == 1 ? "" : "es");
  // Several steps: the slowest rank's time per step, median over the steps.
  std::size_t steps = 0;
  for (const auto& r : ranks) steps = std::max(steps, r.step_seconds.size());
  if (steps > 1) {
    std::vector<double> per_step(steps, 0.0);
    for (const auto& r : ranks)
      for (std::size_t k = 0; k < r.step_seconds.size(); ++k)
        per_step[k] = std::max(per_step[k], r.step_seconds[k]);
    const double first = per_step[0];
    std::sort(per_step.begin(), per_step.end());
    s = fmt::format(
        "step: {:.4f} s median of {} steps (first {:.4f} s; slowest rank, {} micro-batch{})",
        per_step[steps / 2], steps, first, micro_batches, micro_batches == 1 ? "" : "es");
  }
  if (pp > 1) {
    std::string stages;
    for (double b : busy) stages += fmt::format("{}{:.4f}", stages.empty() ? "" : " / ", b);
    const double theory = bubble_fraction(sched.kind, pp, micro_batches, chunks);
    s += fmt::format(
        "; stage compute {} s; pipeline bubble measured {:.3f}, schedule's {:.3f} ({}, p={}, "
        "m={}{})",
        stages, measured_bubble(ranks), theory, schedule_kind_name(sched.kind), pp, micro_batches,
        chunks > 1 ? fmt::format(", v={}", chunks) : "");
  }
  return s + "\n";
}

}  // namespace hp::job

// The rank side of group flows (group_flow.h): a rank of a flow recipe agrees on the batch with
// every other rank, receives its inputs' rows from the producer groups, runs its module once and
// sends its outputs' rows to the consumer groups; the scheduler rank sends the requests and
// collects the results. The row arithmetic (rows_of) is the same on both ends of every message, so
// no rank ever asks another what it will send.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>

#include "hp/core/fs.h"
#include "hp/exec/tensor.h"
#include "hp/job/group_flow.h"
#include "hp/job/launch.h"
#include "hp/model/model.h"
#include "hp/plugin/hp_plugin.h"
#include "worker_internal.h"

namespace hp::job {
using comm::mpi_finalize;
using comm::ReduceOp;
using comm::Transport;
using exec::bind_inputs;
using exec::dims_label;
using exec::dtype_size;
using exec::Executor;
using exec::HostTensor;
using exec::read_tensor_dir;
using exec::write_tensor_dir;
namespace fs = std::filesystem;

namespace {

constexpr std::size_t kMaxDims = 8;

// The header sent before each piece: dtype, rank, dims (axis 0 = the rows of this piece).
struct PieceHeader {
  std::int64_t dtype = -1, ndims = 0;
  std::int64_t dims[kMaxDims] = {};
};

struct FlowRank {
  const Job& job;
  const recipe::Recipe& r;
  const FlowGraph& fg;
  Transport& t;
  std::int64_t batch = 0;

  std::int64_t index_in(std::size_t group, int rank) const {
    return rank - static_cast<int>(r.groups[group].ranks.front());
  }
  std::int64_t ranks_of(std::size_t group) const {
    return static_cast<std::int64_t>(r.groups[group].ranks.size());
  }
  RowRange mine(std::size_t group) const {
    return rows_of(batch, ranks_of(group), index_in(group, t.rank()));
  }

  // Sends this rank's rows of flow k's tensor to every consumer rank that serves any of them.
  Status send(int k, const HostTensor& x) {
    const Flow& f = fg.flows[static_cast<std::size_t>(k)];
    const RowRange own = mine(f.producer);
    const std::string& gname = r.groups[f.producer].name;
    if (x.dims.empty() || x.dims[0] != own.count || x.dims.size() > kMaxDims)
      return Error(Errc::bad_input,
                   fmt::format("group '{}' produced '{}' as {} but its rank {} serves {} of the {} "
                               "requests (axis 0)",
                               gname, f.tensor, dims_label(x.dims), t.rank(), own.count, batch));
    const std::int64_t row_bytes =
        own.count ? static_cast<std::int64_t>(x.data.size()) / own.count : 0;
    for (auto c : f.consumers)
      for (std::int64_t j = 0; j < ranks_of(c); ++j) {
        const RowRange theirs = rows_of(batch, ranks_of(c), j);
        const std::int64_t first = std::max(own.first, theirs.first);
        const std::int64_t end = std::min(own.first + own.count, theirs.first + theirs.count);
        if (end <= first) continue;
        const int peer = static_cast<int>(r.groups[c].ranks[static_cast<std::size_t>(j)]);
        PieceHeader h;
        h.dtype = x.dtype;
        h.ndims = static_cast<std::int64_t>(x.dims.size());
        for (std::size_t d = 0; d < x.dims.size(); ++d) h.dims[d] = x.dims[d];
        h.dims[0] = end - first;
        HP_TRY(t.send(peer, flow_header_tag(k), &h, sizeof h));
        HP_TRY(t.send(peer, flow_data_tag(k), x.data.data() + (first - own.first) * row_bytes,
                      (end - first) * row_bytes));
      }
    return {};
  }

  // Receives this rank's rows of flow k's tensor (as consumer group `c`) from the producer's ranks.
  Expected<HostTensor> recv(int k, std::size_t c) {
    const Flow& f = fg.flows[static_cast<std::size_t>(k)];
    const RowRange own = mine(c);
    const std::int64_t np = ranks_of(f.producer);
    HostTensor x;
    x.name = f.tensor;
    for (std::int64_t i = 0; i < np; ++i) {
      const RowRange theirs = rows_of(batch, np, i);
      const std::int64_t first = std::max(own.first, theirs.first);
      const std::int64_t end = std::min(own.first + own.count, theirs.first + theirs.count);
      if (end <= first) continue;
      const int peer = static_cast<int>(r.groups[f.producer].ranks[static_cast<std::size_t>(i)]);
      PieceHeader h;
      HP_TRY(t.recv(peer, flow_header_tag(k), &h, sizeof h));
      std::vector<std::int64_t> dims(h.dims, h.dims + std::min<std::int64_t>(h.ndims, kMaxDims));
      if (h.ndims < 1 || h.ndims > static_cast<std::int64_t>(kMaxDims) || dims[0] != end - first ||
          dtype_size(static_cast<int>(h.dtype)) == 0)
        return Error(Errc::internal,
                     fmt::format("rank {} sent a malformed piece of '{}'", peer, f.tensor));
      if (x.dtype < 0) {
        x.dtype = static_cast<int>(h.dtype);
        x.dims = dims;
        x.dims[0] = 0;
      } else if (x.dtype != h.dtype ||
                 !std::equal(dims.begin() + 1, dims.end(), x.dims.begin() + 1, x.dims.end())) {
        return Error(
            Errc::bad_input,
            fmt::format("the ranks of group '{}' produced '{}' with different dtypes or shapes",
                        r.groups[f.producer].name, f.tensor));
      }
      HostTensor piece;
      piece.dtype = x.dtype;
      piece.dims = dims;
      piece.data.resize(static_cast<std::size_t>(piece.numel() * dtype_size(piece.dtype)));
      HP_TRY(t.recv(peer, flow_data_tag(k), piece.data.data(),
                    static_cast<std::int64_t>(piece.data.size())));
      x.dims[0] += dims[0];
      x.data.insert(x.data.end(), piece.data.begin(), piece.data.end());
    }
    return x;
  }
};

// Every rank's batch: the largest axis 0 among the request tensors any rank read (a max-AllReduce
// over the world, which every rank of a flow recipe calls exactly once). A rank whose own requests
// disagree fails; so does a batch smaller than some group (a rank would serve no row).
Expected<std::int64_t> agree_batch(const recipe::Recipe& r, Transport& t, std::int64_t local) {
  std::vector<int> world(static_cast<std::size_t>(t.size()));
  std::iota(world.begin(), world.end(), 0);
  std::int64_t batch = local;
  HP_TRY(t.allreduce(world, &local, &batch, 1, HP_I64, ReduceOp::max));
  if (batch <= 0)
    return Error(
        Errc::usage, "no rank read any requests, so the batch is unknown", "",
        "pass --inputs DIR: the scheduler (or the groups reading requests) take them from there");
  if (local > 0 && local != batch)
    return Error(
        Errc::bad_input,
        fmt::format("the request tensors disagree on the batch: {} and {} rows", local, batch));
  for (const auto& g : r.groups)
    if (static_cast<std::int64_t>(g.ranks.size()) > batch)
      return Error(Errc::bad_input,
                   fmt::format("a batch of {} requests cannot be split over group '{}''s {} ranks",
                               batch, g.name, g.ranks.size()));
  return batch;
}

// Rows [first, first + count) of a request tensor read from --inputs.
Expected<HostTensor> rows_of_tensor(const HostTensor& x, RowRange rows) {
  if (x.dims.empty())
    return Error(
        Errc::bad_input,
        fmt::format("request '{}' is a scalar; requests are batched along axis 0", x.name));
  HostTensor s = x;
  const std::size_t row_bytes = x.dims[0] ? x.data.size() / static_cast<std::size_t>(x.dims[0]) : 0;
  s.dims[0] = rows.count;
  s.data.assign(
      x.data.begin() + static_cast<std::ptrdiff_t>(rows.first * row_bytes),
      x.data.begin() + static_cast<std::ptrdiff_t>((rows.first + rows.count) * row_bytes));
  return s;
}

Expected<std::vector<HostTensor>> read_requests(const WorkerOptions& o, const std::string& who) {
  if (o.inputs.empty())
    return Error(Errc::usage, fmt::format("{} reads the requests: pass --inputs DIR", who));
  return read_tensor_dir(o.inputs, "input");
}

const HostTensor* find_named(const std::vector<HostTensor>& ts, const std::string& name) {
  for (const auto& x : ts)
    if (x.name == name) return &x;
  return nullptr;
}

std::string names_of(const std::vector<HostTensor>& ts) {
  std::string s;
  for (const auto& x : ts) s += (s.empty() ? "'" : ", '") + x.name + "'";
  return s.empty() ? "none" : s;
}

// The scheduler: requests out, results in, results written whole.
Status run_scheduler(const WorkerOptions& o, FlowRank& fr, std::size_t gi) {
  const auto& g = fr.r.groups[gi];
  HP_ASSIGN_OR_RETURN(auto reqs, read_requests(o, fmt::format("scheduler group '{}'", g.name)));
  std::int64_t local = 0;
  for (const auto& x : reqs) local = std::max<std::int64_t>(local, x.dims.empty() ? 0 : x.dims[0]);
  auto batch = agree_batch(fr.r, fr.t, local);
  if (!batch) return std::move(batch).error();
  fr.batch = *batch;
  for (std::size_t k = 0; k < fr.fg.flows.size(); ++k) {
    if (fr.fg.flows[k].producer != gi) continue;
    const std::string& name = fr.fg.flows[k].tensor;
    const HostTensor* x = find_named(reqs, name);
    if (!x)
      return Error(
          Errc::bad_input,
          fmt::format("the scheduler sends '{}' but the requests have no tensor of that name "
                      "(they have: {})",
                      name, names_of(reqs)),
          o.inputs.string());
    HP_TRY(fr.send(static_cast<int>(k), *x));
  }
  std::vector<HostTensor> results;
  for (const auto& name : g.inputs) {
    auto x = fr.recv(fr.fg.find(name), gi);
    if (!x) return std::move(x).error();
    results.push_back(std::move(*x));
  }
  HP_TRY(fr.t.flush());
  if (!o.run_dir.empty())
    HP_TRY(write_tensor_dir(rank_output_dir(o.run_dir, fr.t.rank()), results));
  return {};
}

// A model group's rank: inputs from flows (or --inputs), one forward, outputs to flows (or
// written).
Status run_module(const WorkerOptions& o, FlowRank& fr, std::size_t gi, WorkerReport& rep) {
  const auto& g = fr.r.groups[gi];
  HP_ASSIGN_OR_RETURN(auto gm, load_group_module(o, fr.job, g));
  auto ex = Executor::create(gm.model, {gm.backends.primary, gm.backends.cpu, nullptr});
  if (!ex) return std::move(ex).error();
  Executor& exec = **ex;

  std::vector<HostTensor> reqs;
  std::int64_t local = 0;
  if (!fr.fg.external_inputs[gi].empty()) {
    auto read = read_requests(o, fmt::format("group '{}'", g.name));
    if (!read) return std::move(read).error();
    reqs = std::move(*read);
    for (const auto& name : fr.fg.external_inputs[gi])
      if (const HostTensor* x = find_named(reqs, name); x && !x->dims.empty())
        local = std::max(local, x->dims[0]);
  }
  auto batch = agree_batch(fr.r, fr.t, local);
  if (!batch) return std::move(batch).error();
  fr.batch = *batch;

  std::vector<HostTensor> given;
  for (const auto& in : exec.inputs()) {
    const int k = fr.fg.find(in.name);
    const bool flows_here =
        k >= 0 && std::find(g.inputs.begin(), g.inputs.end(), in.name) != g.inputs.end();
    if (flows_here) {
      auto x = fr.recv(k, gi);
      if (!x) return std::move(x).error();
      given.push_back(std::move(*x));
    } else if (const HostTensor* x = find_named(reqs, in.name)) {
      auto s = rows_of_tensor(*x, fr.mine(gi));
      if (!s) return std::move(s).error();
      given.push_back(std::move(*s));
    } else {
      return Error(
          Errc::bad_input,
          fmt::format(
              "module input '{}' of group '{}' is fed by no flow and is not among the requests",
              in.name, g.name),
          gm.path.string(), "list it in the group's inputs and in its producer group's outputs");
    }
  }
  auto bound = bind_inputs(exec.inputs(), std::move(given), fmt::format("group '{}'", g.name));
  if (!bound) return std::move(bound).error();
  auto outs = exec.run(*bound);
  if (!outs) return std::move(outs).error();
  rep.forwards = 1;

  std::vector<HostTensor> job_outputs;
  for (auto& x : *outs) {
    const int k = fr.fg.find(x.name);
    if (k >= 0 && fr.fg.flows[static_cast<std::size_t>(k)].producer == gi) HP_TRY(fr.send(k, x));
    const auto& jo = fr.fg.job_outputs[gi];
    if (std::find(jo.begin(), jo.end(), x.name) != jo.end()) job_outputs.push_back(std::move(x));
  }
  HP_TRY(fr.t.flush());
  if (!o.run_dir.empty() && !job_outputs.empty())
    HP_TRY(write_tensor_dir(rank_output_dir(o.run_dir, fr.t.rank()), job_outputs));
  rep.stats = exec.stats();
  return {};
}

}  // namespace

Expected<WorkerReport> run_flow_worker(const WorkerOptions& o, const Job& job, std::size_t gi,
                                       Transport& t, WorkerReport rep) {
  const auto start = std::chrono::steady_clock::now();
  const recipe::Recipe& r = job.recipe;
  HP_ASSIGN_OR_RETURN(const FlowGraph fg, build_flows(r, job.where));
  FlowRank fr{job, r, fg, t};
  Status s = is_scheduler(r.groups[gi]) ? run_scheduler(o, fr, gi) : run_module(o, fr, gi, rep);
  if (!s.ok()) return std::move(s).error();
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  mpi_finalize();
  return rep;
}

}  // namespace hp::job

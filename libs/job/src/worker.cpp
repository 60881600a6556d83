// run_worker: one rank of an MPMD job (see worker.h).
#include "hp/job/worker.h"

#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>

#include "hp/comm/comm.h"
#include "hp/core/exit_code.h"
#include "hp/core/fs.h"
#include "hp/job/group_flow.h"
#include "hp/job/launch.h"
#include "hp/job/schedule.h"
#include "hp/model/model.h"
#include "hp/recipe/recipe.h"
#include "worker_internal.h"

namespace hp::job {
using comm::mpi_appnum;
using comm::mpi_finalize;
using comm::mpi_world;
using comm::Transport;
using comm::TransportCommOps;
using exec::bind_inputs;
using exec::dims_label;
using exec::ExecStats;
using exec::Executor;
using exec::HostTensor;
using exec::open_backends;
using exec::OpTime;
using exec::read_tensor_dir;
using exec::write_tensor_dir;
namespace fs = std::filesystem;

std::filesystem::path rank_output_dir(const std::filesystem::path& run_dir, int rank) {
  return run_dir / "outputs" / fmt::format("rank-{}", rank);
}

std::string WorkerReport::summary() const {
  std::string s =
      fmt::format("rank {} of {} (group '{}'): {} forward(s), {} nodes each, in {:.3f} s", rank,
                  ranks, group, forwards, stats.nodes, seconds);
  if (stats.device_peak >= 0) s += fmt::format("; device peak {} bytes", stats.device_peak);
  // Where the last forward's time went, the costliest op types first (ExecStats::by_op).
  std::vector<std::pair<std::string, OpTime>> ops(stats.by_op.begin(), stats.by_op.end());
  std::sort(ops.begin(), ops.end(),
            [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  if (ops.size() > 4) ops.resize(4);
  for (std::size_t k = 0; k < ops.size(); ++k)
    s += fmt::format("{}{} {:.2f} ms ({}x)",
                     k ? ", " : "; last forward's costliest ops: ", ops[k].first,
                     1e3 * ops[k].second.seconds, ops[k].second.nodes);
  if (stats.offload_fetches + stats.offload_evictions > 0)
    s += fmt::format("; offload: {} fetches, {} evictions, {} bytes moved (planned peak {} bytes)",
                     stats.offload_fetches, stats.offload_evictions, stats.offload_bytes,
                     stats.offload_planned_peak);
  return s + "\n";
}

namespace {

// Splits `t` along axis 0 into m equal parts.
Expected<std::vector<HostTensor>> split_batch(const HostTensor& t, int m) {
  if (m == 1) return std::vector<HostTensor>{t};
  if (t.dims.empty() || t.dims[0] % m != 0)
    return Error(
        Errc::bad_input,
        fmt::format("input '{}' of shape {} cannot be split into {} micro-batches along axis 0",
                    t.name, dims_label(t.dims), m));
  std::vector<HostTensor> parts;
  const std::size_t bytes = t.data.size() / static_cast<std::size_t>(m);
  for (int k = 0; k < m; ++k) {
    HostTensor p = t;
    p.dims[0] /= m;
    p.data.assign(t.data.begin() + static_cast<std::ptrdiff_t>(k * bytes),
                  t.data.begin() + static_cast<std::ptrdiff_t>((k + 1) * bytes));
    parts.push_back(std::move(p));
  }
  return parts;
}

HostTensor concat_batch(const std::vector<HostTensor>& parts) {
  HostTensor t = parts.front();
  for (std::size_t k = 1; k < parts.size(); ++k) {
    if (!t.dims.empty()) t.dims[0] += parts[k].dims.empty() ? 0 : parts[k].dims[0];
    t.data.insert(t.data.end(), parts[k].data.begin(), parts[k].data.end());
  }
  return t;
}

// The group this rank belongs to: HP_GROUP_INDEX (set per app context by hp launch), checked
// against MPI_APPNUM; by rank ranges when unset (srun --multi-prog sets no app number).
Expected<std::size_t> find_group(const recipe::Recipe& r, int rank, int ranks) {
  if (r.groups.empty()) return std::size_t{0};
  const int appnum = mpi_appnum();
  const char* env = std::getenv("HP_GROUP_INDEX");
  std::size_t by_rank = r.groups.size();
  for (std::size_t i = 0; i < r.groups.size(); ++i)
    for (auto k : r.groups[i].ranks)
      if (k == rank) by_rank = i;
  if (env) {
    const long idx = std::strtol(env, nullptr, 10);
    if (idx < 0 || static_cast<std::size_t>(idx) >= r.groups.size())
      return Error(Errc::bad_input, fmt::format("HP_GROUP_INDEX={} but the recipe has {} group(s)",
                                                env, r.groups.size()));
    if (appnum >= 0 && appnum != idx)
      return Error(Errc::internal, fmt::format("HP_GROUP_INDEX={} but MPI_APPNUM={}", env, appnum));
    if (by_rank != static_cast<std::size_t>(idx))
      return Error(Errc::bad_input,
                   fmt::format("rank {} started in group {} but the recipe puts it in group {}",
                               rank, idx, by_rank));
    return static_cast<std::size_t>(idx);
  }
  if (by_rank == r.groups.size())
    return Error(Errc::bad_input,
                 fmt::format("rank {} of {} is in no group of the recipe", rank, ranks));
  return by_rank;
}

}  // namespace

Expected<GroupModule> load_group_module(const WorkerOptions& o, const Job& job,
                                        const recipe::Group& g) {
  auto backends = open_backends(g.backend, o.threads, o.plugin_paths);
  if (!backends) {
    Error e = std::move(backends).error();
    e.what.message = fmt::format("group '{}': {}", g.name, e.what.message);
    return e;
  }
  const fs::path module = job.module_path(g);
  model::LoadOptions lo;
  lo.mode = model::LoadMode::require_data;
  HP_ASSIGN_OR_RETURN(auto m, model::load_model(module, lo));
  return GroupModule{std::move(*backends), std::move(m), module};
}

Status record_rank_pid(const fs::path& run_dir, int rank) {
  if (run_dir.empty()) return {};
  std::error_code ec;
  fs::create_directories(run_dir / "pids", ec);
  return write_file_atomic(run_dir / "pids" / fmt::format("rank-{}.pid", rank),
                           std::to_string(::getpid()));
}

void record_rank_exit(const fs::path& run_dir, const Error& e) {
  if (run_dir.empty()) return;
  auto world = comm::mpi_world();
  if (!world) return;
  std::error_code ec;
  fs::create_directories(run_dir / "exits", ec);
  (void)write_file_atomic(run_dir / "exits" / fmt::format("rank-{}.code", (*world)->rank()),
                          std::to_string(static_cast<int>(exit_code_for(e.code))));
}

Expected<WorkerReport> run_worker(const WorkerOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  HP_ASSIGN_OR_RETURN(auto world, mpi_world());
  Transport& t = *world;
  WorkerReport rep;
  rep.rank = t.rank();
  rep.ranks = t.size();
  HP_TRY(record_rank_pid(o.run_dir, rep.rank));

  // The recipe is read here once; everything below takes the Job.
  HP_ASSIGN_OR_RETURN(Job job, load_job(o.recipe));
  HP_ASSIGN_OR_RETURN(const std::size_t gi, find_group(job.recipe, rep.rank, rep.ranks));
  const recipe::Group group = job.groups()[gi];
  rep.group = group.name;

  // Fault injection for the launcher's fault tests (tests/mpi): a group's env may set
  // HP_TEST_FAULT = "segv" (the rank crashes) or "hang" (it never returns).
  if (const char* fault = std::getenv("HP_TEST_FAULT")) {
    if (std::strcmp(fault, "segv") == 0) std::raise(SIGSEGV);
    if (std::strcmp(fault, "hang") == 0)
      for (;;) ::pause();
  }

  switch (job.kind) {
    // The recipe's model, sharded by `hp launch` into RUN/shard before the job started.
    case JobKind::sharded_model: return run_sharded_worker(o, job, t, std::move(rep));
    // Groups that exchange tensors (group_flow.h): received inputs, one forward, sent outputs.
    case JobKind::flow_groups: return run_flow_worker(o, job, gi, t, std::move(rep));
    case JobKind::module_groups: break;  // below: each group runs its own module
  }

  auto gm = load_group_module(o, job, group);
  if (!gm) return std::move(gm).error();
  TransportCommOps comm(t);
  auto ex = Executor::create(gm->model, {gm->backends.primary, gm->backends.cpu, &comm});
  if (!ex) return std::move(ex).error();
  Executor& exec = **ex;

  // The inputs this rank's graph declares, picked by name from --inputs (split into micro-batches
  // and bound per micro-batch below, since a stage declares the micro-batch shape).
  std::vector<HostTensor> given;
  if (!exec.inputs().empty()) {
    if (o.inputs.empty())
      return Error(Errc::usage,
                   fmt::format("module '{}' has graph inputs; pass --inputs DIR", group.module));
    auto all = read_tensor_dir(o.inputs, "input");
    if (!all) return std::move(all).error();
    for (auto& g : *all)
      for (const auto& io : exec.inputs())
        if (g.name.empty() || g.name == io.name) {
          given.push_back(std::move(g));
          break;
        }
  }

  // The schedule: the job's pipeline stages when the groups are the pipeline, else one forward.
  const auto& par = job.recipe.parallel;
  // Ranks are laid out tp fastest, then pp, then dp: the pipeline stage of a rank is (rank / tp) %
  // pp.
  const bool pipeline = par.pp > 1 && job.recipe.ranks() == rep.ranks;
  const int stage = static_cast<int>((rep.rank / par.tp) % par.pp);
  const int mb = pipeline ? job.micro_batches() : 1;
  std::vector<Action> actions{{ActionKind::forward, 0, 0, -1}};
  if (pipeline) {
    if (job.schedule.lowered.chunks > 1)
      return Error(
          Errc::not_implemented,
          "interleaved schedules need one module per chunk; hp launch runs one module per rank",
          o.recipe.string());
    actions = job.schedule.lowered.per_rank[static_cast<std::size_t>(stage)];
  }
  std::vector<std::vector<HostTensor>> per_mb(
      static_cast<std::size_t>(mb));  // [micro-batch][input]
  for (const auto& g : given) {
    auto p = split_batch(g, mb);
    if (!p) return std::move(p).error();
    for (int k = 0; k < mb; ++k)
      per_mb[static_cast<std::size_t>(k)].push_back(std::move((*p)[static_cast<std::size_t>(k)]));
  }
  if (!exec.inputs().empty())
    for (auto& in : per_mb) {
      auto bound = bind_inputs(exec.inputs(), std::move(in), o.inputs.string());
      if (!bound) return std::move(bound).error();
      in = std::move(*bound);
    }
  std::vector<std::vector<HostTensor>> outs_per_mb;
  for (const Action& a : actions) {
    if (!a.is_compute()) continue;  // SEND/RECV run as the partition's hp.Send / hp.Recv nodes
    comm.set_micro_batch(a.micro_batch);
    auto out = exec.run(per_mb[static_cast<std::size_t>(a.micro_batch)]);
    if (!out) return std::move(out).error();
    outs_per_mb.push_back(std::move(*out));
    ++rep.forwards;
  }
  HP_TRY(t.flush());
  if (!o.run_dir.empty() && !exec.outputs().empty()) {
    std::vector<HostTensor> outs;
    for (std::size_t k = 0; k < exec.outputs().size(); ++k) {
      std::vector<HostTensor> per;
      for (auto& o2 : outs_per_mb) per.push_back(std::move(o2[k]));
      outs.push_back(concat_batch(per));
    }
    HP_TRY(write_tensor_dir(rank_output_dir(o.run_dir, rep.rank), outs));
  }
  rep.stats = exec.stats();
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ex->reset();
  mpi_finalize();
  return rep;
}

}  // namespace hp::job

// hp.AllReduce against bare MPI_Allreduce on the same float buffer sizes, in the same process,
// interleaved (rotating which goes first) so all see the same machine state. Per size:
//   MPI in place   MPI_Allreduce(MPI_IN_PLACE) on MPI_COMM_WORLD: what a hand-written step does;
//   hp exec        the hp.AllReduce node's own time inside Executor::run of the graph x -> y on the
//                  cpu backend (ExecStats::by_op), right after a one-float AllGather that syncs the
//                  ranks as the barrier does for MPI: placement, pool, stream sync, the comm layer
//                  and the call; x is read for the last time there, so its buffer is donated (in
//                  place);
//   MPI out of place / hp layer: MPI_Allreduce(in, out) against TransportCommOps::run_into on an
//                  input that is not donated, the output in memory kept across calls: the layer's
//                  own overhead over the same MPI call.
// The median of the slowest rank is printed, with the ratios (the target: within 10%).
// See README.md.
#include <fmt/core.h>
#include <mpi.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "hp/comm/comm.h"
#include "hp/exec/backends.h"
#include "hp/exec/executor.h"
#include "hp/model/model.h"
#include "hp_model.h"

using namespace hp::exec;
using namespace hp::comm;
namespace fs = std::filesystem;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// sync[1] -> hp.AllGather -> (unused); x[count] -> hp.AllReduce(group = all ranks, sum) -> y, in
// this order. The AllGather of one float synchronises the ranks right before the AllReduce, as the
// barrier does before the bare MPI call, so the node's time is not the arrival skew of the ranks'
// work before it.
fs::path write_allreduce_model(const fs::path& dir, std::int64_t count, int ranks) {
  onnx::ModelProto m = hp_domain_model();
  auto* g = m.mutable_graph();
  g->set_name("allreduce");
  auto value = [](google::protobuf::RepeatedPtrField<onnx::ValueInfoProto>* list, const char* name,
                  std::int64_t n) {
    auto* v = list->Add();
    v->set_name(name);
    auto* t = v->mutable_type()->mutable_tensor_type();
    t->set_elem_type(onnx::TensorProto::FLOAT);
    t->mutable_shape()->add_dim()->set_dim_value(n);
  };
  value(g->mutable_input(), "sync", 1);
  value(g->mutable_input(), "x", count);
  value(g->mutable_output(), "y", count);
  for (auto [op, in, out] :
       {std::tuple{"AllGather", "sync", "synced"}, std::tuple{"AllReduce", "x", "y"}}) {
    auto* n = g->add_node();
    n->set_name(out);
    n->set_op_type(op);
    n->set_domain("hp");
    n->add_input(in);
    n->add_output(out);
    auto* a = n->add_attribute();
    a->set_name("group");
    a->set_type(onnx::AttributeProto::INTS);
    for (int r = 0; r < ranks; ++r) a->add_ints(r);
  }
  const fs::path p = dir / fmt::format("allreduce_{}.onnx", count);
  std::ofstream(p, std::ios::binary) << m.SerializeAsString();
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  // comm_allreduce_bench [REPEATS [FLOATS...]]
  const int reps = argc > 1 ? std::atoi(argv[1]) : 50;
  auto world = mpi_world();
  if (!world) return 1;
  Transport& t = **world;
  const int me = t.rank(), n = t.size();
  TransportCommOps ops(t);
  std::string group;
  for (int r = 0; r < n; ++r) group += (r ? "," : "") + std::to_string(r);
  const CommNode node{"bench", "AllReduce", {"x"}, {"y"}, {{"group", group}, {"op", "sum"}}};
  auto backends = open_backends("cpu", 1, {});
  if (!backends) {
    fmt::print(stderr, "cannot open the cpu backend: {}\n", backends.error().message());
    mpi_abort(1);
  }
  const fs::path dir = fs::temp_directory_path() / fmt::format("hp-comm-bench-{}-{}", getpid(), me);
  fs::create_directories(dir);
  if (me == 0)
    fmt::print(
        "{} ranks, {} repeats per size, median microseconds of the slowest rank\n"
        "{:>10} {:>12} {:>12} {:>8} {:>12} {:>12} {:>8}\n",
        n, reps, "floats", "MPI inplace", "hp exec", "ratio", "MPI outplace", "hp layer", "ratio");
  std::vector<std::int64_t> counts;
  for (int k = 2; k < argc; ++k) counts.push_back(std::atoll(argv[k]));
  if (counts.empty())
    counts = {std::int64_t{1} << 10, std::int64_t{1} << 14, std::int64_t{1} << 18,
              std::int64_t{1} << 22};
  for (std::int64_t count : counts) {
    HostTensor x;
    x.name = "x";
    x.dtype = HP_F32;
    x.dims = {count};
    x.data.assign(static_cast<std::size_t>(count) * 4, 0);
    for (std::int64_t i = 0; i < count; ++i) x.as<float>()[i] = static_cast<float>(me + i % 7);
    const auto size = static_cast<std::size_t>(count);
    std::vector<float> raw(x.as<float>(), x.as<float>() + count), out(size), out_hp(size);
    const std::vector<CommTensor> in{CommTensor{x.dtype, x.dims, x.data.data(), x.data.size()}};
    const CommAlloc alloc = [&](std::size_t, int, std::span<const std::int64_t>,
                                int) -> hp::Expected<void*> {
      return static_cast<void*>(out_hp.data());
    };
    auto model = hp::model::load_model(write_allreduce_model(dir, count, n));
    if (!model) mpi_abort(1);
    auto exec = Executor::create(*model, {backends->primary, backends->cpu, &ops});
    if (!exec) {
      fmt::print(stderr, "{}\n", exec.error().message());
      mpi_abort(1);
    }
    HostTensor sync;
    sync.name = "sync";
    sync.dtype = HP_F32;
    sync.dims = {1};
    sync.data.assign(4, 0);
    const std::vector<HostTensor> inputs{sync, x};
    const int c = static_cast<int>(count);
    std::vector<double> times[4];  // MPI in place, hp exec, MPI out of place, hp layer
    auto timed = [&](int which) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      switch (which) {
        case 0:
          MPI_Allreduce(MPI_IN_PLACE, raw.data(), c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
          break;
        case 1:
          if (!(*exec)->run(inputs).ok()) mpi_abort(1);
          return (*exec)->stats().by_op.at("hp.AllReduce").seconds;
        case 2:
          MPI_Allreduce(x.data.data(), out.data(), c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
          break;
        default:
          if (!ops.run_into(node, in, alloc).ok()) mpi_abort(1);
      }
      return MPI_Wtime() - t0;
    };
    for (int k = 0; k < reps + 3; ++k) {
      double t[4];
      for (int j = 0; j < 4; ++j) t[(j + k) % 4] = timed((j + k) % 4);  // rotate the order
      if (k >= 3)  // warm-up: communicator creation, first-touch pages, the executor's pool
        for (int j = 0; j < 4; ++j) times[j].push_back(t[j]);
    }
    // The slowest rank decides a collective's time.
    double m[4];
    for (int j = 0; j < 4; ++j) m[j] = median(times[j]);
    MPI_Allreduce(MPI_IN_PLACE, m, 4, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (me == 0)
      fmt::print("{:>10} {:>12.1f} {:>12.1f} {:>8.3f} {:>12.1f} {:>12.1f} {:>8.3f}\n", count,
                 1e6 * m[0], 1e6 * m[1], m[1] / m[0], 1e6 * m[2], 1e6 * m[3], m[3] / m[2]);
  }
  fs::remove_all(dir);
  mpi_finalize();
  return 0;
}

// hp.AllReduce (TransportCommOps over the MPI transport: attribute parsing, output tensor, cached
// communicator) against a bare MPI_Allreduce(MPI_IN_PLACE) on the same float buffer sizes, in the
// same process, interleaved (and alternating which goes first) so both see the same machine state. Prints per size the median time of
// each and the ratio hp / MPI (the target: within 10%). See README.md.
#include <fmt/core.h>
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "hp/runtime/comm.h"

using namespace hp::runtime;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 50;
  auto world = mpi_world();
  if (!world) return 1;
  Transport& t = **world;
  const int me = t.rank(), n = t.size();
  TransportCommOps ops(t);
  std::string group;
  for (int r = 0; r < n; ++r) group += (r ? "," : "") + std::to_string(r);
  const CommNode node{"bench", "AllReduce", {"x"}, {"y"}, {{"group", group}, {"op", "sum"}}};
  if (me == 0) fmt::print("{} ranks, {} repeats per size, median seconds\n{:>12} {:>12} {:>12} {:>8}\n", n, reps,
                          "floats", "hp", "MPI", "hp/MPI");
  for (std::int64_t count : {std::int64_t{1} << 10, std::int64_t{1} << 14, std::int64_t{1} << 18, std::int64_t{1} << 22}) {
    HostTensor x;
    x.dtype = HP_F32;
    x.dims = {count};
    x.data.assign(static_cast<std::size_t>(count) * 4, 0);
    for (std::int64_t i = 0; i < count; ++i) x.as<float>()[i] = static_cast<float>(me + i % 7);
    std::vector<float> raw(x.as<float>(), x.as<float>() + count);
    std::vector<double> th, tm;
    auto time_hp = [&] {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      std::vector<HostTensor> y(1);
      if (!ops.run(node, {&x}, y).ok()) mpi_abort(1);
      return MPI_Wtime() - t0;
    };
    auto time_mpi = [&] {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, raw.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      return MPI_Wtime() - t0;
    };
    for (int k = 0; k < reps + 3; ++k) {
      // Alternate which goes first, so neither always runs right after the other's traffic.
      double a, b;
      if (k % 2) {
        a = time_hp();
        b = time_mpi();
      } else {
        b = time_mpi();
        a = time_hp();
      }
      if (k >= 3) {  // warm-up: communicator creation, first-touch pages
        th.push_back(a);
        tm.push_back(b);
      }
    }
    // The slowest rank decides a collective's time.
    double h = median(th), m = median(tm);
    MPI_Allreduce(MPI_IN_PLACE, &h, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (me == 0) fmt::print("{:>12} {:>12.6f} {:>12.6f} {:>8.3f}\n", count, h, m, h / m);
  }
  mpi_finalize();
  return 0;
}

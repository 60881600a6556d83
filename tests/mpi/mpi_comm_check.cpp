// Started by mpirun (tests/mpi/CMakeLists.txt: 2 and 4 ranks): runs every hp-domain op through the
// MPI transport, over the whole world in a scrambled member order and over a non-ascending
// sub-group, and checks each rank's result against values computed here from every rank's input
// formula. Any mismatch prints the failing check and ends the job with MPI_Abort (exit code 1).
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "hp/comm/comm.h"

using namespace hp::exec;
using namespace hp::comm;

namespace {

int g_checks = 0;
int g_rank = 0;

void expect(bool ok, const std::string& what) {
  ++g_checks;
  if (ok) return;
  fmt::print(stderr, "rank {}: FAILED: {}\n", g_rank, what);
  std::fflush(stderr);
  mpi_abort(1);
}

void require(const hp::Status& s, const std::string& what) {
  if (!s.ok()) expect(false, what + ": " + s.error().str());
}

// Rank r's [rows, cols] input: x[i][j] = 100 r + 10 i + j (+ 0.5 so floats are not all integers).
HostTensor input(int r, std::int64_t rows, std::int64_t cols, int dtype = HP_F32) {
  HostTensor t;
  t.dtype = dtype;
  t.dims = {rows, cols};
  t.data.resize(static_cast<std::size_t>(rows * cols * dtype_size(dtype)));
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) {
      if (dtype == HP_F32)
        t.as<float>()[i * cols + j] = static_cast<float>(100 * r + 10 * i + j) + 0.5f;
      else
        t.as<std::int64_t>()[i * cols + j] = (std::int64_t{1} << 35) * r + 10 * i + j;
    }
  return t;
}
double x_at(int r, std::int64_t i, std::int64_t j) { return 100.0 * r + 10.0 * i + j + 0.5; }
double at(const HostTensor& t, std::int64_t i, std::int64_t j) {
  return t.as<float>()[i * t.dims[1] + j];
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

CommNode node(std::string op, std::vector<std::pair<std::string, std::string>> attrs) {
  return CommNode{"n", std::move(op), {"x"}, {"y"}, std::move(attrs)};
}

HostTensor run(TransportCommOps& ops, const CommNode& n, const HostTensor& x) {
  std::vector<HostTensor> y(1);
  require(ops.run(n, {&x}, y), "hp." + n.op_type);
  return y[0];
}

void check_group(TransportCommOps& ops, const std::vector<int>& group, int me) {
  const int p = static_cast<int>(group.size());
  const int pos = static_cast<int>(std::find(group.begin(), group.end(), me) - group.begin());
  const std::string g = join(group), label = "group [" + g + "]";

  // AllReduce sum and max (f32), sum (i64).
  for (std::string op : {"sum", "max", "avg"}) {
    HostTensor y = run(ops, node("AllReduce", {{"group", g}, {"op", op}}), input(me, 3, 5));
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 5; ++j) {
        double want = op == "max" ? -1e30 : 0;
        for (int r : group)
          want = op == "max" ? std::max(want, x_at(r, i, j)) : want + x_at(r, i, j);
        if (op == "avg") want /= p;
        expect(std::fabs(at(y, i, j) - want) < 1e-3,
               fmt::format("{} AllReduce {} at ({},{}): {} vs {}", label, op, i, j, at(y, i, j),
                           want));
      }
  }
  HostTensor yi = run(ops, node("AllReduce", {{"group", g}}), input(me, 2, 2, HP_I64));
  std::int64_t want_i = 0;
  for (int r : group) want_i += (std::int64_t{1} << 35) * r + 10 + 1;
  expect(yi.as<std::int64_t>()[3] == want_i, label + " AllReduce i64");

  // AllGather along axis 1: member k's block at columns [2k, 2k+2).
  HostTensor ag = run(ops, node("AllGather", {{"group", g}, {"axis", "1"}}), input(me, 2, 2));
  expect(ag.dims == std::vector<std::int64_t>{2, 2 * p}, label + " AllGather shape");
  for (int k = 0; k < p; ++k)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j)
        expect(at(ag, i, 2 * k + j) == x_at(group[static_cast<std::size_t>(k)], i, j),
               label + " AllGather value");

  // ReduceScatter along axis 0: member pos gets the sum of everyone's rows [2 pos, 2 pos + 2).
  HostTensor rs = run(ops, node("ReduceScatter", {{"group", g}, {"axis", "0"}, {"op", "sum"}}),
                      input(me, 2 * p, 3));
  expect(rs.dims == std::vector<std::int64_t>{2, 3}, label + " ReduceScatter shape");
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) {
      double want = 0;
      for (int r : group) want += x_at(r, 2 * pos + i, j);
      expect(std::fabs(at(rs, i, j) - want) < 1e-3, label + " ReduceScatter value");
    }

  // AllToAll: split columns into p chunks, concatenate the received chunks along rows.
  HostTensor aa =
      run(ops, node("AllToAll", {{"group", g}, {"split_axis", "1"}, {"concat_axis", "0"}}),
          input(me, 2, p));
  expect(aa.dims == std::vector<std::int64_t>{2 * p, 1}, label + " AllToAll shape");
  for (int k = 0; k < p; ++k)
    for (int i = 0; i < 2; ++i)
      expect(at(aa, 2 * k + i, 0) == x_at(group[static_cast<std::size_t>(k)], i, pos),
             label + " AllToAll value");
}

}  // namespace

int main() {
  auto world = mpi_world();
  if (!world) {
    fmt::print(stderr, "MPI init failed: {}\n", world.error().str());
    return 1;
  }
  Transport& t = **world;
  const int me = t.rank(), n = t.size();
  g_rank = me;
  TransportCommOps ops(t);

  // The whole world in reverse order and in order; with 4 ranks also two disjoint descending pairs.
  std::vector<int> all(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) all[static_cast<std::size_t>(r)] = n - 1 - r;
  check_group(ops, all, me);
  std::vector<int> ident(all.rbegin(), all.rend());
  check_group(ops, ident, me);
  if (n == 4) {
    const std::vector<int> sub = me % 2 ? std::vector<int>{3, 1} : std::vector<int>{2, 0};
    check_group(ops, sub, me);
    check_group(ops, sub, me);  // again: the cached communicator
  }

  // Two threads at once, as a training rank runs them: a patient reduction thread's all-reduces
  // over the column {c, c + 2} (its communicator connected here first) while this thread runs the
  // row {2 q, 2 q + 1}'s gathers and all-reduces. MPI_THREAD_SERIALIZED allows one call at a time;
  // the transport's lock must make them take turns without deadlocking across ranks.
  if (n == 4) {
    const std::vector<int> row{me / 2 * 2, me / 2 * 2 + 1}, column{me % 2, me % 2 + 2};
    require(t.connect(column), "connect");
    constexpr int kRounds = 300;
    std::string side;
    std::thread reducer([&] {
      set_patient_waits(true);
      std::vector<float> x(50000), y(50000);
      for (int k = 0; k < kRounds && side.empty(); ++k) {
        std::fill(x.begin(), x.end(), static_cast<float>(me + k));
        if (auto s = t.allreduce(column, x.data(), y.data(), 50000, HP_F32, ReduceOp::sum); !s.ok())
          side = s.error().str();
        else if (y[49999] != static_cast<float>(2 * (me % 2) + 2 + 2 * k))
          side = fmt::format("column sum {} in round {}", y[49999], k);
      }
    });
    for (int k = 0; k < kRounds; ++k) {
      double x[2] = {static_cast<double>(me), static_cast<double>(k)}, y[4] = {};
      require(t.allgather(row, x, y, sizeof x), "row allgather");
      expect(y[0] == row[0] && y[2] == row[1] && y[3] == k, "row allgather beside a reducer");
      double v = me, sum = 0;
      require(t.allreduce(row, &v, &sum, 1, HP_F64, ReduceOp::sum), "row allreduce");
      expect(sum == row[0] + row[1], "row allreduce beside a reducer");
    }
    reducer.join();
    expect(side.empty(), "the reduction thread: " + side);
  }

  // Threads at once on the same ranks, each on its own channel, as an expert-parallel rank under
  // HSDP runs them: two patient reducers (the shared weights' and the experts', whose replica
  // groups coincide) beside the main thread's gathers. Rank 0's second reducer starts late, so
  // the threads' calls interleave differently on different ranks.
  {
    std::vector<int> world;
    for (int r = 0; r < n; ++r) world.push_back(r);
    for (int c : {1, 2}) {
      const ScopedChannel channel(c);
      require(t.connect(world), "connect on a channel");
    }
    constexpr int kRounds = 200;
    std::string side[2];
    auto reduce = [&](int which) {
      set_patient_waits(true);
      set_channel(1 + which);
      if (me == 0 && which == 1) std::this_thread::sleep_for(std::chrono::milliseconds(30));
      const std::size_t len = which == 0 ? 1000 : 10;
      std::vector<float> x(len), y(len);
      for (int k = 0; k < kRounds && side[which].empty(); ++k) {
        std::fill(x.begin(), x.end(), static_cast<float>(k + 1000 * which));
        if (auto s = t.allreduce(world, x.data(), y.data(), static_cast<std::int64_t>(len), HP_F32,
                                 ReduceOp::sum);
            !s.ok())
          side[which] = s.error().str();
        else if (y[len - 1] != static_cast<float>(n * (k + 1000 * which)))
          side[which] = fmt::format("sum {} in round {}", y[len - 1], k);
      }
    };
    std::thread first(reduce, 0), second(reduce, 1);
    for (int k = 0; k < kRounds; ++k) {
      double x[2] = {static_cast<double>(me), static_cast<double>(k)};
      std::vector<double> y(2 * static_cast<std::size_t>(n));
      require(t.allgather(world, x, y.data(), sizeof x), "channel 0 allgather");
      expect(y[1] == k && y[2 * (n - 1)] == n - 1, "channel 0 allgather beside channels 1, 2");
    }
    first.join();
    second.join();
    expect(side[0].empty(), "the channel 1 reducer: " + side[0]);
    expect(side[1].empty(), "the channel 2 reducer: " + side[1]);
  }

  // CollectivePermute around a ring (rank r -> r+1), leaving rank 0 without a source when open.
  std::string pairs;
  for (int r = 0; r + 1 < n; ++r)
    pairs += (pairs.empty() ? "" : ",") + fmt::format("{},{}", r, r + 1);
  HostTensor cp = run(ops, node("CollectivePermute", {{"pairs", pairs}}), input(me, 1, 2));
  expect(at(cp, 0, 1) == (me == 0 ? 0.0 : x_at(me - 1, 0, 1)), "CollectivePermute");

  // Send/Recv: rank 0 sends micro-batches 0..2 to the last rank, which receives them in reverse.
  if (me == 0) {
    for (int mb = 0; mb < 3; ++mb) {
      ops.set_micro_batch(mb);
      HostTensor x = input(10 + mb, 2, 3);
      std::vector<HostTensor> none;
      require(
          ops.run(CommNode{"s", "Send", {"x"}, {}, {{"peer", std::to_string(n - 1)}, {"tag", "5"}}},
                  {&x}, none),
          "Send");
    }
  } else if (me == n - 1) {
    for (int mb = 2; mb >= 0; --mb) {
      ops.set_micro_batch(mb);
      std::vector<HostTensor> y(1);
      require(ops.run(CommNode{"r",
                               "Recv",
                               {},
                               {"y"},
                               {{"peer", "0"}, {"tag", "5"}, {"dtype", "1"}, {"shape", "2,3"}}},
                      {}, y),
              "Recv");
      expect(at(y[0], 1, 2) == x_at(10 + mb, 1, 2), fmt::format("Recv micro-batch {}", mb));
    }
  }
  require(t.flush(), "flush");
  fmt::print("rank {} of {}: {} checks passed\n", me, n, g_checks);
  mpi_finalize();
  return 0;
}

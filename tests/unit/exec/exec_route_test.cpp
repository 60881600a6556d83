// Routed expert dispatch in the executor (hp.Dispatch and hp.Combine, hp/core/hp_domain.h), two
// in-process ranks each holding two of four experts: rows go only to their experts' member, an
// expert may get no rows at all (its Gemm runs on [0, d]), the counts change from run to run on one
// executor, and the combined result is each chosen expert's output at its (token, expert) pair and
// zero elsewhere.
#include <catch2/catch.hpp>

#include <fmt/core.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <string>
#include <vector>

#include "exec_test_util.h"
#include "hp/comm/comm.h"
#include "hp/exec/executor.h"

using namespace hp;
using namespace hp::exec;
using namespace hp::exec::test;

namespace {

constexpr int kT = 5, kD = 3, kE = 4, kK = 2;

float weight(int expert, int i) { return static_cast<float>((expert + 1) * (i % 5 - 2)) / 8.f; }

void add_attr_i(onnx::NodeProto* n, const std::string& name, std::int64_t v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}

// Member `member` of group {0, 1}: z = Combine(Gemm(rows_e, W_e) for its experts e).
onnx::ModelProto member_model(int member) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* hp_op = m.add_opset_import();
  hp_op->set_domain("hp");
  hp_op->set_version(1);
  auto* g = m.mutable_graph();
  add_value(g->mutable_input(), "x", {kT, kD});
  add_value(g->mutable_input(), "idx", {kT, kK}, onnx::TensorProto::INT64);
  add_value(g->mutable_output(), "z", {kT, kE, kD});
  auto* d = add_node(g, "Dispatch", {"x", "idx"}, {"r0", "r1"}, "dispatch", "hp");
  auto* c = add_node(g, "Combine", {"y0", "y1", "idx"}, {"z"}, "combine", "hp");
  for (auto* n : {d, c}) {
    auto* a = n->add_attribute();
    a->set_name("group");
    a->set_type(onnx::AttributeProto::INTS);
    a->add_ints(0);
    a->add_ints(1);
    add_attr_i(n, "experts", kE);
  }
  for (int j = 0; j < 2; ++j) {
    const int e = member * 2 + j;
    std::vector<float> w(kD * kD);
    for (int i = 0; i < kD * kD; ++i) w[static_cast<std::size_t>(i)] = weight(e, i);
    add_f32_init(g, "W" + std::to_string(j), {kD, kD}, w);
    add_node(g, "Gemm", {"r" + std::to_string(j), "W" + std::to_string(j)},
             {"y" + std::to_string(j)}, "gemm" + std::to_string(j));
  }
  // Combine reads what the Gemms compute: put it last.
  g->mutable_node()->SwapElements(1, g->node_size() - 1);
  return m;
}

HostTensor indices(const std::vector<std::int64_t>& v) {
  HostTensor t;
  t.name = "idx";
  t.dtype = HP_I64;
  t.dims = {kT, kK};
  t.data.resize(v.size() * 8);
  std::memcpy(t.data.data(), v.data(), t.data.size());
  return t;
}

float x_of(int rank, int t, int i) { return static_cast<float>(rank * 10 + t * 3 + i) / 7.f; }

}  // namespace

TEST_CASE("routed dispatch: rows reach only their experts, empty experts included", "[exec][ep]") {
  // Step 1: every token of both members chooses experts 0 and 1 (member 0's), so member 1's
  // experts get no rows. Step 2: a spread routing.
  const std::vector<std::vector<std::vector<std::int64_t>>> routes{
      {{0, 1, 1, 0, 0, 1, 1, 0, 0, 1}, {1, 0, 0, 1, 0, 1, 1, 0, 1, 0}},
      {{3, 0, 2, 1, 0, 2, 3, 1, 2, 3}, {1, 2, 0, 3, 3, 2, 2, 0, 1, 3}}};
  // Loaded here: Catch2's checks in the helpers are not for the ranks' threads.
  std::vector<model::Model> models;
  std::vector<Backends> backends;
  for (int r = 0; r < 2; ++r) {
    fs::path dir = temp_dir("route" + std::to_string(r));
    models.push_back(load(write_model(dir, member_model(r))));
    backends.push_back(cpu());
  }
  Status s = comm::run_in_process(2, [&](int rank, comm::Transport& t) -> Status {
    const Backends& b = backends[static_cast<std::size_t>(rank)];
    comm::TransportCommOps ops(t);
    HP_ASSIGN_OR_RETURN(auto ex, Executor::create(models[static_cast<std::size_t>(rank)],
                                                  {b.primary, b.cpu, &ops}));
    for (const auto& route : routes) {
      std::vector<float> x(kT * kD);
      for (int tk = 0; tk < kT; ++tk)
        for (int i = 0; i < kD; ++i) x[static_cast<std::size_t>(tk * kD + i)] = x_of(rank, tk, i);
      const auto& idx = route[static_cast<std::size_t>(rank)];
      HP_ASSIGN_OR_RETURN(auto out, ex->run({f32({kT, kD}, x, "x"), indices(idx)}));
      const HostTensor& z = out.at(0);
      if (z.dims != std::vector<std::int64_t>{kT, kE, kD})
        return Error(Errc::runtime, "z has dims " + dims_label(z.dims));
      for (int tk = 0; tk < kT; ++tk)
        for (int e = 0; e < kE; ++e) {
          const bool chosen = idx[static_cast<std::size_t>(tk * kK)] == e ||
                              idx[static_cast<std::size_t>(tk * kK + 1)] == e;
          for (int j = 0; j < kD; ++j) {
            float want = 0;
            for (int i = 0; chosen && i < kD; ++i)
              want += x_of(rank, tk, i) * weight(e, i * kD + j);
            const float got = z.as<float>()[(tk * kE + e) * kD + j];
            if (std::fabs(got - want) > 1e-5f)
              return Error(Errc::runtime, fmt::format("rank {} z[{}, {}, {}] = {}, want {}", rank,
                                                      tk, e, j, got, want));
          }
        }
    }
    return {};
  });
  INFO((s.ok() ? std::string() : s.error().message()));
  REQUIRE(s.ok());
}

TEST_CASE("routed dispatch refuses indices outside the experts on every member", "[exec][ep]") {
  Status s = comm::run_in_process(2, [&](int rank, comm::Transport& t) -> Status {
    comm::TransportCommOps ops(t);
    CommNode n{
        "dispatch", "Dispatch", {"x", "idx"}, {"r0", "r1"}, {{"group", "0,1"}, {"experts", "4"}}};
    HostTensor x = f32({kT, kD}, std::vector<float>(kT * kD, 1.f), "x");
    std::vector<std::int64_t> bad(kT * kK, 0);
    bad[3] = rank == 0 ? 4 : -1;
    HostTensor idx = indices(bad);
    std::vector<HostTensor> outs(2);
    Status st = ops.run(n, {&x, &idx}, outs);
    if (st || st.error().message().find("routed to expert") == std::string::npos)
      return Error(Errc::runtime, "an expert outside 0..3 was accepted");
    // Only member 1 is wrong: member 0 learns it from the exchange instead of waiting for rows.
    bad.assign(kT * kK, 1);
    if (rank == 1) bad[0] = 9;
    HostTensor one_bad = indices(bad);
    Status st1 = ops.run(n, {&x, &one_bad}, outs);
    const std::string want = rank == 1 ? "routed to expert 9" : "member 1 of the group";
    if (st1 || st1.error().message().find(want) == std::string::npos)
      return Error(Errc::runtime, "rank " + std::to_string(rank) + ": " +
                                      (st1 ? std::string("no error") : st1.error().message()));
    CommNode odd{"d", "Dispatch", {"x", "idx"}, {"r0"}, {{"group", "0,1"}, {"experts", "3"}}};
    if (ops.run(odd, {&x, &idx}, outs)) return Error(Errc::runtime, "3 experts over 2 accepted");
    return {};
  });
  INFO((s.ok() ? std::string() : s.error().message()));
  REQUIRE(s.ok());
}

TEST_CASE("alltoallv moves blocks of any size, none included", "[exec][ep]") {
  Status s = comm::run_in_process(3, [&](int rank, comm::Transport& t) -> Status {
    // Member r sends r + j bytes of value 10 r + j to member j.
    std::vector<std::int64_t> send(3), recv(3);
    std::vector<unsigned char> in;
    for (int j = 0; j < 3; ++j) {
      send[static_cast<std::size_t>(j)] = rank + j;
      recv[static_cast<std::size_t>(j)] = j + rank;
      in.insert(in.end(), static_cast<std::size_t>(rank + j),
                static_cast<unsigned char>(10 * rank + j));
    }
    std::vector<unsigned char> out(static_cast<std::size_t>(3 * rank + 3), 0xff);
    HP_TRY(t.alltoallv({0, 1, 2}, in.data(), send, out.data(), recv));
    std::size_t at = 0;
    for (int q = 0; q < 3; ++q)
      for (int i = 0; i < q + rank; ++i, ++at)
        if (out[at] != 10 * q + rank) return Error(Errc::runtime, "a block landed wrong");
    return {};
  });
  INFO((s.ok() ? std::string() : s.error().message()));
  REQUIRE(s.ok());
}

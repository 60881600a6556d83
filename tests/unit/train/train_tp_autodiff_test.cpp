// Autodiff of tensor-parallel partitions (GradSpec::tp, libs/train/src/rules_comm.cpp and
// parallel_entries.cpp) on partitions written here by hand as hp shard would write them: the
// conjugate each "hp"-domain collective gets (all-reduce: identity, all-gather: this member's
// slice, reduce-scatter: all-gather, all-to-all: the reverse exchange), the all-reduced gradient
// at the entry of a parallel region, the refusal of an all-reduce other than a sum; and, run on
// two in-process ranks through the executor, gradients equal to the unsharded model's, sliced.
#include <onnx/onnx_pb.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <mutex>
#include <random>

#include "hp/comm/comm.h"
#include "hp/exec/backends.h"
#include "hp/exec/executor.h"
#include "hp/train/autodiff.h"
#include "train_graph_builder.h"

using namespace hp;
using test::attr_i;
using test::attr_ints;
using test::attr_s;
using test::Builder;

namespace {

// An "hp"-domain collective over members {0, 1}.
onnx::NodeProto* collective(Builder& b, const std::string& op, const std::string& in,
                            const std::string& out, const std::string& name = "") {
  bool imported = false;
  for (const auto& o : b.m.opset_import()) imported = imported || o.domain() == "hp";
  if (!imported) {
    auto* o = b.m.add_opset_import();
    o->set_domain("hp");
    o->set_version(1);
  }
  auto* n = b.node(op, {in}, {out}, name);
  n->set_domain("hp");
  attr_ints(n, "group", {0, 1});
  return n;
}

train::GradSpec tp_spec(std::int64_t rank, std::vector<std::string> varying) {
  train::GradSpec s;
  s.loss = train::LossKind::mse;
  s.logits = std::string("y");
  s.tp.group = {0, 1};
  s.tp.rank = rank;
  s.tp.varying = std::move(varying);
  return s;
}

train::GradGraph differentiate(Builder& b, const train::GradSpec& spec) {
  auto gg = train::build_grad_graph(b.model(), spec);
  INFO((gg ? std::string() : gg.error().str()));
  REQUIRE(gg);
  return std::move(*gg);
}

// The backward's nodes of type `op` (domain "hp" when `hp_domain`).
std::vector<const onnx::NodeProto*> backward(const train::GradGraph& gg, const std::string& op,
                                             bool hp_domain) {
  std::vector<const onnx::NodeProto*> out;
  const auto& g = gg.model.proto->graph();
  for (int k = gg.forward_nodes; k < g.node_size(); ++k)
    if (g.node(k).op_type() == op && (g.node(k).domain() == "hp") == hp_domain)
      out.push_back(&g.node(k));
  return out;
}

std::vector<std::int64_t> ints_of(const onnx::NodeProto& n, const std::string& name) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return {a.ints().begin(), a.ints().end()};
  return {};
}

std::int64_t int_of(const onnx::NodeProto& n, const std::string& name) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return a.i();
  return -99;
}

std::vector<std::int64_t> initializer(const train::GradGraph& gg, const std::string& name) {
  for (const auto& t : gg.model.proto->graph().initializer())
    if (t.name() == name) return {t.int64_data().begin(), t.int64_data().end()};
  FAIL("no initializer " << name);
  return {};
}

exec::HostTensor random(std::vector<std::int64_t> dims, std::mt19937& rng) {
  return test::tensor(std::move(dims), HP_F32, rng);
}

// Columns [c0, c1) of a 2-D tensor (rows when `rows`).
exec::HostTensor cut(const exec::HostTensor& t, bool rows, std::int64_t b, std::int64_t e) {
  exec::HostTensor s;
  s.dtype = HP_F32;
  s.dims = t.dims;
  s.dims[rows ? 0 : 1] = e - b;
  for (std::int64_t i = 0; i < t.dims[0]; ++i)
    for (std::int64_t j = 0; j < t.dims[1]; ++j)
      if ((rows ? i : j) >= b && (rows ? i : j) < e) {
        const float v = t.as<float>()[i * t.dims[1] + j];
        const auto* p = reinterpret_cast<const unsigned char*>(&v);
        s.data.insert(s.data.end(), p, p + 4);
      }
  return s;
}

void weight(Builder& b, const std::string& name, const exec::HostTensor& v) {
  auto* t = b.g().add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::FLOAT);
  for (auto d : v.dims) t->add_dims(d);
  for (std::int64_t k = 0; k < v.numel(); ++k) t->add_float_data(v.as<float>()[k]);
}

// The two-layer MLP of the numeric test, y = tanh((x W0) W1) W2 + b2, with x [4, 4], W0 [4, 4],
// W1 [4, 6], W2 [6, 5]. `rank` < 0: the whole model. Otherwise member `rank`'s partition, W1's
// columns split (column-parallel) and W0, b2 whole, in one of four layouts:
enum class Layout {
  row,       ///< Megatron's pair: W2's rows split, the partial products all-reduced
  gather,    ///< the activation all-gathered before a whole W2
  scatter,   ///< W2's rows split, the partial products reduce-scattered over the batch and gathered
  alltoall,  ///< the activation exchanged from column halves to row halves, a whole W2 on each,
             ///< the rows gathered
};

struct Mlp {
  exec::HostTensor w0, w1, w2, b2;
  Layout layout = Layout::row;
  explicit Mlp(std::mt19937& rng)
      : w0(random({4, 4}, rng)),
        w1(random({4, 6}, rng)),
        w2(random({6, 5}, rng)),
        b2(random({5}, rng)) {}
  bool w2_split() const { return layout == Layout::row || layout == Layout::scatter; }
  Builder build(std::int64_t rank) const {
    Builder b;
    b.input("x", {4, 4});
    weight(b, "W0", w0);
    b.node("MatMul", {"x", "W0"}, {"h0"});
    const bool whole = rank < 0;
    weight(b, "W1", whole ? w1 : cut(w1, false, 3 * rank, 3 * rank + 3));
    b.node("MatMul", {"h0", "W1"}, {"h"});
    b.node("Tanh", {"h"}, {"a"});
    weight(b, "W2", whole || !w2_split() ? w2 : cut(w2, true, 3 * rank, 3 * rank + 3));
    if (whole) {
      b.node("MatMul", {"a", "W2"}, {"s"});
    } else if (layout == Layout::row) {
      b.node("MatMul", {"a", "W2"}, {"p"});
      attr_s(collective(b, "AllReduce", "p", "s"), "op", "sum");
    } else if (layout == Layout::gather) {
      attr_i(collective(b, "AllGather", "a", "ag"), "axis", 1);
      b.node("MatMul", {"ag", "W2"}, {"s"});
    } else if (layout == Layout::scatter) {
      b.node("MatMul", {"a", "W2"}, {"p"});
      auto* rs = collective(b, "ReduceScatter", "p", "rs");
      attr_i(rs, "axis", 0);
      attr_s(rs, "op", "sum");
      attr_i(collective(b, "AllGather", "rs", "s"), "axis", 0);
    } else {
      auto* t = collective(b, "AllToAll", "a", "rows");
      attr_i(t, "split_axis", 0);
      attr_i(t, "concat_axis", 1);
      b.node("MatMul", {"rows", "W2"}, {"q"});
      attr_i(collective(b, "AllGather", "q", "s"), "axis", 0);
    }
    weight(b, "b2", b2);
    b.node("Add", {"s", "b2"}, {"y"});
    b.output("y", {4, 5});
    return b;
  }
  std::vector<std::string> varying() const {
    switch (layout) {
      case Layout::row: return {"W1", "h", "a", "W2", "p"};
      case Layout::gather: return {"W1", "h", "a"};
      case Layout::scatter: return {"W1", "h", "a", "W2", "p", "rs"};
      case Layout::alltoall: return {"W1", "h", "a", "rows", "q"};
    }
    return {};
  }
};

}  // namespace

TEST_CASE("an entry of a parallel region gets an all-reduced gradient", "[train][tp]") {
  std::mt19937 rng(5);
  Mlp mlp(rng);
  for (std::int64_t rank : {0, 1}) {
    Builder b = mlp.build(rank);
    auto gg = differentiate(b, tp_spec(rank, mlp.varying()));
    CHECK(gg.parallel_entries == 1);
    bool entry = false;  // MatMul(h0, W1) computes a varying tensor from the same-valued h0
    const auto& g = gg.model.proto->graph();
    for (int k = 0; k < gg.forward_nodes; ++k)
      entry = entry || (g.node(k).op_type() == "Identity" && g.node(k).input(0) == "h0" &&
                        g.node(k).output(0) == "h0.tp_entry");
    CHECK(entry);
    // The forward's all-reduce is its own gradient's identity: the one all-reduce of the backward
    // is the entry's.
    auto reduces = backward(gg, "AllReduce", true);
    REQUIRE(reduces.size() == 1);
    CHECK(ints_of(*reduces[0], "group") == std::vector<std::int64_t>{0, 1});
    // Without GradSpec::tp the partition is differentiated as an ordinary model: no entry.
    train::GradSpec plain = tp_spec(rank, {});
    plain.tp = {};
    auto ordinary = differentiate(b, plain);
    CHECK(ordinary.parallel_entries == 0);
    CHECK(backward(ordinary, "AllReduce", true).empty());
  }
}

TEST_CASE("a same-valued tensor read by several parts enters once; constants do not enter",
          "[train][tp]") {
  Builder b;
  b.input("x", {3, 4});
  b.weight("Wa", {4, 3});
  b.weight("Wb", {4, 3});
  b.ints("shape", {3, 3});
  b.node("MatMul", {"x", "Wa"}, {"ha"});
  b.node("MatMul", {"x", "Wb"}, {"hb"});
  b.node("Reshape", {"ha", "shape"}, {"ra"});
  // A float Constant (a GELU's sqrt 2, attention's scale) does not enter either: read through an
  // entry it would hide from the rewrites that look for constants.
  b.constant("half", 0.5f);
  b.node("Mul", {"ra", "half"}, {"rh"});
  b.node("Add", {"rh", "hb"}, {"s"});
  attr_s(collective(b, "AllReduce", "s", "y"), "op", "sum");
  b.output("y", {3, 3});
  auto gg = differentiate(b, tp_spec(1, {"Wa", "Wb", "ha", "hb", "ra", "rh", "s"}));
  CHECK(gg.parallel_entries == 1);
  const auto& g = gg.model.proto->graph();
  int entries = 0, readers = 0;
  for (int k = 0; k < gg.forward_nodes; ++k) {
    const auto& n = g.node(k);
    if (n.op_type() == "Identity") entries += n.output(0) == "x.tp_entry";
    for (const auto& i : n.input()) {
      CHECK(i != "shape.tp_entry");
      CHECK(i != "half.tp_entry");
      if (n.output(0) != "x.tp_entry") CHECK(i != "x");  // the other readers read the entry
      readers += i == "x.tp_entry";
    }
  }
  CHECK(entries == 1);
  CHECK(readers == 2);
}

TEST_CASE("collectives get their conjugates as gradients", "[train][tp]") {
  for (std::int64_t rank : {0, 1}) {
    INFO("rank " << rank);
    // AllGather along axis 1 of [3, 2] blocks: the gradient is this member's block of columns.
    Builder ag;
    ag.input("x", {3, 4});
    ag.weight("W", {4, 2});
    ag.node("MatMul", {"x", "W"}, {"h"});
    attr_i(collective(ag, "AllGather", "h", "y"), "axis", 1);
    ag.output("y", {3, 4});
    auto g1 = differentiate(ag, tp_spec(rank, {"W", "h"}));
    auto slices = backward(g1, "Slice", false);
    REQUIRE(slices.size() == 1);
    CHECK(initializer(g1, slices[0]->input(1)) == std::vector<std::int64_t>{2 * rank});
    CHECK(initializer(g1, slices[0]->input(2)) == std::vector<std::int64_t>{2 * rank + 2});
    CHECK(initializer(g1, slices[0]->input(3)) == std::vector<std::int64_t>{1});
    // ReduceScatter along axis 0: the gradient is gathered along the same axis.
    Builder rs;
    rs.input("x", {4, 4});
    rs.weight("W", {4, 4});
    rs.node("MatMul", {"x", "W"}, {"h"});
    auto* r = collective(rs, "ReduceScatter", "h", "y");
    attr_i(r, "axis", 0);
    attr_s(r, "group_name", "tp");
    rs.output("y", {2, 4});
    auto g2 = differentiate(rs, tp_spec(rank, {"W", "h", "y"}));
    auto gathers = backward(g2, "AllGather", true);
    REQUIRE(gathers.size() == 1);
    CHECK(int_of(*gathers[0], "axis") == 0);
    CHECK(ints_of(*gathers[0], "group") == std::vector<std::int64_t>{0, 1});
    // AllToAll splitting dim 0 and concatenating dim 1: the gradient exchanges back.
    Builder aa;
    aa.input("x", {4, 4});
    aa.weight("W", {4, 4});
    aa.node("MatMul", {"x", "W"}, {"h"});
    auto* t = collective(aa, "AllToAll", "h", "y");
    attr_i(t, "split_axis", 0);
    attr_i(t, "concat_axis", 1);
    aa.output("y", {2, 8});
    auto g3 = differentiate(aa, tp_spec(rank, {"W", "h", "y"}));
    auto swaps = backward(g3, "AllToAll", true);
    REQUIRE(swaps.size() == 1);
    CHECK(int_of(*swaps[0], "split_axis") == 1);
    CHECK(int_of(*swaps[0], "concat_axis") == 0);
  }
}

TEST_CASE("an all-reduce other than a sum has no gradient and is named", "[train][tp]") {
  Builder b;
  b.input("x", {3, 4});
  b.weight("W", {4, 2});
  b.node("MatMul", {"x", "W"}, {"h"});
  attr_s(collective(b, "AllReduce", "h", "y", "the_max"), "op", "max");
  b.output("y", {3, 2});
  auto r = train::build_grad_graph(b.model(), tp_spec(0, {"W", "h"}));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::bad_input);
  CHECK(r.error().str().find("the_max") != std::string::npos);
  CHECK(r.error().str().find("'max'") != std::string::npos);
  // The AllGather's member: a rank outside the node's group has no slice of its gradient.
  Builder ag;
  ag.input("x", {3, 4});
  ag.weight("W", {4, 2});
  ag.node("MatMul", {"x", "W"}, {"h"});
  attr_i(collective(ag, "AllGather", "h", "y", "the_gather"), "axis", 1);
  ag.output("y", {3, 4});
  auto outside = train::build_grad_graph(ag.model(), tp_spec(5, {"W", "h"}));
  REQUIRE_FALSE(outside);
  CHECK(outside.error().str().find("the_gather") != std::string::npos);
}

TEST_CASE("two members' gradients equal the whole model's, sliced", "[train][tp]") {
  for (Layout layout : {Layout::row, Layout::gather, Layout::scatter, Layout::alltoall}) {
    INFO("layout " << static_cast<int>(layout));
    std::mt19937 rng(17 + static_cast<unsigned>(layout));
    Mlp mlp(rng);
    mlp.layout = layout;
    const exec::HostTensor x = random({4, 4}, rng), target = random({4, 5}, rng);
    auto be = exec::open_backends("cpu", 1, {});
    REQUIRE(be);
    // The whole model on one rank.
    Builder whole = mlp.build(-1);
    train::GradSpec spec = tp_spec(0, {});
    spec.tp = {};
    auto gg = differentiate(whole, spec);
    REQUIRE(gg.params == std::vector<std::string>{"W0", "W1", "W2", "b2"});
    auto ex = exec::Executor::create(gg.model, {be->primary, be->cpu, nullptr});
    REQUIRE(ex);
    auto ref = (*ex)->run({x, target});
    INFO((ref ? std::string() : ref.error().str()));
    REQUIRE(ref);
    // Each member's partition, differentiated with GradSpec::tp and run with the other.
    std::mutex mu;
    std::vector<std::vector<exec::HostTensor>> got(2);
    std::vector<exec::HostTensor> no_entry(2);  // W0's gradient differentiated without tp
    auto st = comm::run_in_process(2, [&](int rank, comm::Transport& t) -> Status {
      Builder part = mlp.build(rank);
      HP_ASSIGN_OR_RETURN(auto pg,
                          train::build_grad_graph(part.model(), tp_spec(rank, mlp.varying())));
      if (pg.params != gg.params) return Error(Errc::runtime, "the partition's parameters");
      comm::TransportCommOps ops(t);
      HP_ASSIGN_OR_RETURN(auto pex, exec::Executor::create(pg.model, {be->primary, be->cpu, &ops}));
      HP_ASSIGN_OR_RETURN(auto out, pex->run({x, target}));
      train::GradSpec ordinary = tp_spec(rank, {});  // the rank for the AllGather's slice
      ordinary.tp.group.clear();
      HP_ASSIGN_OR_RETURN(auto plain, train::build_grad_graph(part.model(), ordinary));
      HP_ASSIGN_OR_RETURN(auto plain_ex,
                          exec::Executor::create(plain.model, {be->primary, be->cpu, &ops}));
      HP_ASSIGN_OR_RETURN(auto plain_out, plain_ex->run({x, target}));
      std::lock_guard<std::mutex> lock(mu);
      got[static_cast<std::size_t>(rank)] = std::move(out);
      no_entry[static_cast<std::size_t>(rank)] = std::move(plain_out[1]);
      return {};
    });
    INFO((st ? std::string() : st.error().str()));
    REQUIRE(st);
    auto max_diff = [](const exec::HostTensor& a, const exec::HostTensor& b) {
      REQUIRE(a.dims == b.dims);
      double d = 0;
      for (std::int64_t i = 0; i < a.numel(); ++i)
        d = std::max(d, std::fabs(double(a.as<float>()[i]) - b.as<float>()[i]));
      return d;
    };
    for (std::int64_t rank : {0, 1}) {
      INFO("rank " << rank);
      const auto& out = got[static_cast<std::size_t>(rank)];
      REQUIRE(out.size() == ref->size());
      CHECK(max_diff(out[0], (*ref)[0]) < 1e-6);  // the loss
      CHECK(max_diff(out[1], (*ref)[1]) < 1e-5);  // W0: through the entry's all-reduce
      CHECK(max_diff(out[2], cut((*ref)[2], false, 3 * rank, 3 * rank + 3)) < 1e-5);
      CHECK(max_diff(out[3],
                     !mlp.w2_split() ? (*ref)[3] : cut((*ref)[3], true, 3 * rank, 3 * rank + 3)) <
            1e-5);
      CHECK(max_diff(out[4], (*ref)[4]) < 1e-5);  // b2
    }
    // Differentiated as an ordinary model, each member's W0 gradient is only its part of the sum.
    CHECK(max_diff(no_entry[0], (*ref)[1]) > 1e-3);
    CHECK(max_diff(no_entry[1], (*ref)[1]) > 1e-3);
  }
}

TEST_CASE("cross entropy of vocabulary-split logits equals the gathered logits' loss",
          "[train][tp]") {
  // logits = x W, W [4, 8] split by columns (the vocabulary) over two members, whose blocks hp
  // shard all-gathers along the last axis. The loss is then computed on the blocks (three row
  // all-reduces, libs/train/src/loss_vocab.cpp) and the all-gather leaves the training graph.
  std::mt19937 rng(23);
  const exec::HostTensor x = random({6, 4}, rng), w = random({4, 8}, rng);
  exec::HostTensor labels = test::tensor({6}, HP_I64, rng, 8);
  labels.as<std::int64_t>()[1] = 2;     // owned by member 0
  labels.as<std::int64_t>()[2] = 7;     // by member 1
  labels.as<std::int64_t>()[4] = -100;  // ignored
  auto build = [&](int rank) {
    Builder b;
    b.input("x", {6, 4});
    weight(b, "W", rank < 0 ? w : cut(w, false, 4 * rank, 4 * rank + 4));
    if (rank < 0) {
      b.node("MatMul", {"x", "W"}, {"logits"});
    } else {
      b.node("MatMul", {"x", "W"}, {"part"});
      attr_i(collective(b, "AllGather", "part", "gathered"), "axis", -1);
      b.node("Identity", {"gathered"}, {"logits"});
    }
    b.output("logits", {6, 8});
    return b;
  };
  auto spec_for = [](int rank) {
    train::GradSpec s = tp_spec(rank, {"W", "part"});
    s.loss = train::LossKind::cross_entropy;
    s.logits = "logits";
    if (rank < 0) s.tp = {};
    return s;
  };
  auto be = exec::open_backends("cpu", 1, {});
  REQUIRE(be);
  Builder whole = build(-1);
  auto gg = differentiate(whole, spec_for(-1));
  auto ex = exec::Executor::create(gg.model, {be->primary, be->cpu, nullptr});
  REQUIRE(ex);
  auto ref = (*ex)->run({x, labels});
  REQUIRE(ref);
  std::mutex mu;
  std::vector<std::vector<exec::HostTensor>> got(2);
  auto st = comm::run_in_process(2, [&](int rank, comm::Transport& t) -> Status {
    Builder part = build(rank);
    HP_ASSIGN_OR_RETURN(auto pg, train::build_grad_graph(part.model(), spec_for(rank)));
    int gathers = 0, row_stats = 0;
    for (const auto& n : pg.model.proto->graph().node()) {
      gathers += n.op_type() == "AllGather";
      row_stats += n.op_type() == "RowMaxSumExp";
    }
    if (gathers != 0 || row_stats != 1)
      return Error(Errc::runtime, "the loss was not computed on the vocabulary blocks");
    comm::TransportCommOps ops(t);
    HP_ASSIGN_OR_RETURN(auto pex, exec::Executor::create(pg.model, {be->primary, be->cpu, &ops}));
    HP_ASSIGN_OR_RETURN(auto out, pex->run({x, labels}));
    std::lock_guard<std::mutex> lock(mu);
    got[static_cast<std::size_t>(rank)] = std::move(out);
    return {};
  });
  INFO((st ? std::string() : st.error().str()));
  REQUIRE(st);
  for (int rank : {0, 1}) {
    INFO("rank " << rank);
    const auto& out = got[static_cast<std::size_t>(rank)];
    CHECK(out[0].as<float>()[0] == Approx((*ref)[0].as<float>()[0]).epsilon(1e-6));
    const exec::HostTensor want = cut((*ref)[1], false, 4 * rank, 4 * rank + 4);
    REQUIRE(out[1].dims == want.dims);
    for (std::int64_t i = 0; i < want.numel(); ++i)
      CHECK(out[1].as<float>()[i] == Approx(want.as<float>()[i]).margin(1e-6));
  }
}

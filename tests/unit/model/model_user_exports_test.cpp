// Models exported the way users export them (tests/data/models/gen_user_exports.py) get concrete
// shapes everywhere once the inputs are bound, their repeated layers found by structure despite the
// exporter's differences between layers, and their Identity-aliased weights reported; where shapes
// cannot be known, the node and the reason are named instead of invented unk__N dims. Hand-built
// graphs cover the sequence lowering (shape_seq.cpp), the new value ops and malformed inputs.
#include <onnx/onnx_pb.h>

#include <catch2/catch.hpp>

#include <fstream>
#include <set>

#include "hp/model/summary.h"
#include "model_test_util.h"

using namespace hp;
using namespace hp::model;
using namespace hp::model::test;

namespace {

ModelSummary summarize_named(const std::string& name) {
  auto j = sidecar(name);
  auto s = summarize_model({model_path(name), sidecar_dims(j), false});
  INFO(name << ": " << (s.ok() ? std::string() : s.error().str()));
  REQUIRE(s.ok());
  return std::move(*s);
}

// Every output of every node has a concrete shape (sequences have none of their own).
std::vector<std::string> tensors_without_shape(const Graph& g) {
  std::vector<std::string> out;
  for (const auto& n : g.nodes)
    for (int o : n.outputs) {
      if (o < 0 || g.tensor(o).sequence) continue;
      if (!g.tensor(o).numel()) out.push_back(g.tensor(o).name);
    }
  return out;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("user exports: every node of the Llama exports has a concrete shape", "[model]") {
  auto name = GENERATE(as<std::string>{}, "user-llama-expand", "user-llama-static");
  SECTION(name) {
    ModelSummary s = summarize_named(name);
    auto j = sidecar(name);
    CHECK(tensors_without_shape(s.graph).empty());
    CHECK(s.unknown_dims.empty());
    CHECK(s.graph.unresolved.empty());
    CHECK(s.nodes_cost_unknown == 0);
    CHECK(s.matmul_flops == j["matmul_flops"].get<double>());
    CHECK(s.layering.method == "structure");
    CHECK(s.layering.blocks.size() == j["blocks"].get<std::size_t>());
    // The two layers cost the same: the exporter's differences are only in shape arithmetic.
    REQUIRE(s.layering.blocks.size() == 2);
    CHECK(s.layering.blocks[0].matmul_flops == s.layering.blocks[1].matmul_flops);
    CHECK(s.layering.blocks[0].activation_bytes > 0);
  }
}

TEST_CASE("user exports: the repeat_interleave Loop is unrolled and the export's bug named",
          "[model]") {
  // torch 1.13 writes repeat_interleave over a dynamic dim as a Loop over sequences whose body
  // reshapes each head wrongly (gen_user_exports.py): once lowered, every dim is concrete up to the
  // q @ k^T MatMul, whose inputs are incompatible. That node is what hp must name; no unk__N dim
  // may be reported as an input dim.
  ModelSummary s = summarize_named("user-llama-ri");
  CHECK(s.unknown_dims.empty());
  for (const auto& d : s.unknown_dims) CHECK_FALSE(contains(d, "unk__"));
  // Each layer's MatMul, where shapes stop (layer 1's inputs are concrete again: the residual
  // stream's shape does not depend on the broken attention's).
  REQUIRE(s.graph.unresolved.size() == 2);
  for (int i = 0; i < 2; ++i) {
    const UnresolvedShape& u = s.graph.unresolved[static_cast<std::size_t>(i)];
    CHECK(u.op == "MatMul");
    CHECK(u.node == "/layers." + std::to_string(i) + "/self_attn/MatMul");
    CHECK(contains(u.reason, "2x4x12x16, 2x32x12x2"));
  }
  // The Loop's sequence is marked as such, and what ConcatFromSequence makes of it is concrete.
  int sequences = 0;
  for (const auto& n : s.graph.nodes) {
    if (n.op_type == "Loop") CHECK(s.graph.tensor(n.outputs[0]).sequence);
    if (n.op_type == "ConcatFromSequence") {
      const Tensor& t = s.graph.tensor(n.outputs[0]);
      REQUIRE(t.numel());
      CHECK(t.dims[1].value == 32);
    }
    for (int o : n.outputs) sequences += o >= 0 && s.graph.tensor(o).sequence;
  }
  CHECK(sequences > 0);
  CHECK(s.layering.blocks.size() == 2);
}

TEST_CASE("user exports: the MoE's blocks are found by structure and its aliases reported",
          "[model]") {
  ModelSummary s = summarize_named("user-moe");
  auto j = sidecar("user-moe");
  CHECK(tensors_without_shape(s.graph).empty());
  CHECK(s.matmul_flops == j["matmul_flops"].get<double>());
  CHECK(s.layering.method == "structure");
  REQUIRE(s.layering.blocks.size() == 2);
  CHECK(s.layering.blocks[0].matmul_flops == s.layering.blocks[1].matmul_flops);
  // Exactly the aliases the exporter wrote (the sidecar reads them from the file independently).
  std::map<std::string, std::string> got;
  for (const auto& a : s.aliased_weights) got[a.alias] = a.source;
  std::map<std::string, std::string> want;
  for (const auto& [alias, source] : j["identity_aliases"].items())
    want[alias] = source.get<std::string>();
  CHECK(got == want);
  // layers.1's LayerNorm weight reads layers.0's: shared across the two blocks.
  bool across = false;
  for (const auto& a : s.aliased_weights)
    if (a.alias == "layers.1.ln1.weight")
      across = a.blocks == std::vector<std::string>{"layers.0", "layers.1"};
  CHECK(across);
  auto json = nlohmann::json::parse(format_summary_json(s));
  CHECK(json["aliased_weights"].size() == want.size());
  CHECK(json["unresolved_shapes"].empty());
  CHECK(contains(format_summary_text(s), "aliased       8 weights"));
}

TEST_CASE("user exports: a MoE routing by NonZero is named as data-dependent, blocks found",
          "[model]") {
  ModelSummary s = summarize_named("user-moe-scatter");
  CHECK(s.unknown_dims.empty());
  // One NonZero per expert per layer (torch.where), nothing else.
  auto j = sidecar("user-moe-scatter");
  const auto experts = j["config"]["experts"].get<std::size_t>();
  CHECK(s.graph.unresolved.size() == 2 * experts);
  for (const auto& u : s.graph.unresolved) {
    CHECK(u.op == "NonZero");
    CHECK(contains(u.reason, "depends on the input data"));
  }
  CHECK(s.layering.method == "structure");
  CHECK(s.layering.blocks.size() == 2);
  CHECK(s.aliased_weights.size() == j["identity_aliases"].size());
  // OneHot (F.one_hot with a Constant depth) has its shape: hp computes what ONNX leaves open.
  for (const auto& n : s.graph.nodes)
    if (n.op_type == "OneHot") CHECK(s.graph.tensor(n.outputs[0]).numel());
}

TEST_CASE("user exports: blocks are found without names too", "[model]") {
  // Node names carry "layers.N" tokens, which the fallback by names could use; with every node
  // name removed, only structure is left.
  for (const char* name :
       {"user-moe", "user-moe-scatter", "user-llama-static", "user-llama-expand"}) {
    onnx::ModelProto m;
    std::ifstream in(model_path(name), std::ios::binary);
    REQUIRE(m.ParseFromIstream(&in));
    for (auto& n : *m.mutable_graph()->mutable_node()) n.clear_name();
    auto dir = scratch_dir("user_exports_anon");
    write_bytes(dir / "m.onnx", m.SerializeAsString());
    auto s = summarize_model({dir / "m.onnx", sidecar_dims(sidecar(name)), false});
    REQUIRE(s.ok());
    INFO(name);
    CHECK(s->layering.method == "structure");
    CHECK(s->layering.blocks.size() == 2);
  }
}

TEST_CASE("user exports: an unbound input dim is reported as such, and nothing else", "[model]") {
  auto s = summarize_model({model_path("user-llama-expand"), {{"batch", 2}}, false});
  REQUIRE(s.ok());
  CHECK(s->unknown_dims == std::vector<std::string>{"seq"});
  CHECK(s->graph.unresolved.empty());  // downstream of 'seq': not a node's fault
}

// ---------------------------------------------------------------- hand-built graphs
namespace {

struct G {
  onnx::ModelProto m;
  onnx::GraphProto* g;
  G(int opset = 17) : g(m.mutable_graph()) {
    m.set_ir_version(8);
    m.add_opset_import()->set_version(opset);
  }
  void input(const std::string& name, std::vector<std::string> dims,
             std::int32_t type = onnx::TensorProto::FLOAT) {
    auto* v = g->add_input();
    v->set_name(name);
    auto* tt = v->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(type);
    for (const auto& d : dims) {
      auto* dim = tt->mutable_shape()->add_dim();
      if (std::isdigit(static_cast<unsigned char>(d[0])))
        dim->set_dim_value(std::stoll(d));
      else
        dim->set_dim_param(d);
    }
  }
  void ints(const std::string& name, std::vector<std::int64_t> v, bool scalar = false) {
    auto* t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::INT64);
    if (!scalar) t->add_dims(static_cast<std::int64_t>(v.size()));
    for (auto x : v) t->add_int64_data(x);
  }
  onnx::NodeProto* node(onnx::GraphProto* in, const std::string& op, std::vector<std::string> ins,
                        std::vector<std::string> outs) {
    auto* n = in->add_node();
    n->set_op_type(op);
    n->set_name(outs.empty() ? op : outs[0]);
    for (auto& i : ins) n->add_input(i);
    for (auto& o : outs) n->add_output(o);
    return n;
  }
  onnx::NodeProto* node(const std::string& op, std::vector<std::string> ins,
                        std::vector<std::string> outs) {
    return node(g, op, std::move(ins), std::move(outs));
  }
  void output(const std::string& name) {
    auto* v = g->add_output();
    v->set_name(name);
    v->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  }
  Graph build(const DimBindings& dims, const std::string& file) {
    auto dir = scratch_dir("user_exports_" + file);
    write_bytes(dir / "m.onnx", m.SerializeAsString());
    auto model = load_model(dir / "m.onnx");
    INFO((model.ok() ? std::string() : model.error().str()));
    REQUIRE(model.ok());
    auto graph = build_graph(*model, dims);
    INFO((graph.ok() ? std::string() : graph.error().str()));
    REQUIRE(graph.ok());
    return std::move(*graph);
  }
};

void set_int(onnx::NodeProto* n, const std::string& name, std::int64_t v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}

std::vector<std::int64_t> dims_of(const Graph& g, const std::string& name) {
  std::vector<std::int64_t> d;
  int t = g.find_tensor(name);
  if (t < 0) return d;
  for (const auto& x : g.tensor(t).dims) d.push_back(x.value);
  return d;
}

// x [batch, heads, 4] split into heads along axis 1, each head doubled in a Loop that runs once per
// head (its trip count taken from Shape(x)), the results concatenated: [batch, 2 * heads, 4].
G repeat_heads_loop(const std::string& trips_from = "x") {
  G b;
  b.input("x", {"batch", "heads", "4"});
  b.ints("one", {1});
  b.ints("axis1", {1});
  b.node("Shape", {trips_from}, {"shape"});
  b.node("Gather", {"shape", "axis1"}, {"trips"});
  b.node("Expand", {"one", "trips"}, {"ones"});  // [1] * heads: the split sizes
  set_int(b.node("SplitToSequence", {"x", "ones"}, {"heads_seq"}), "axis", 1);
  b.node("SequenceEmpty", {}, {"empty"});
  auto* t = b.g->add_initializer();
  t->set_name("true");
  t->set_data_type(onnx::TensorProto::BOOL);
  t->add_int32_data(1);
  auto* loop = b.node("Loop", {"trips", "true", "empty"}, {"out_seq"});
  auto* attr = loop->add_attribute();
  attr->set_name("body");
  attr->set_type(onnx::AttributeProto::GRAPH);
  onnx::GraphProto* body = attr->mutable_g();
  for (const char* in : {"i", "cond_in", "acc"}) body->add_input()->set_name(in);
  b.node(body, "Identity", {"cond_in"}, {"cond_out"});
  b.node(body, "SequenceAt", {"heads_seq", "i"}, {"head"});
  set_int(b.node(body, "Concat", {"head", "head"}, {"twice"}), "axis", 1);
  b.node(body, "SequenceInsert", {"acc", "twice"}, {"acc_out"});
  for (const char* out : {"cond_out", "acc_out"}) body->add_output()->set_name(out);
  set_int(b.node("ConcatFromSequence", {"out_seq"}, {"y"}), "axis", 1);
  b.node("Relu", {"y"}, {"z"});
  b.output("z");
  return b;
}

}  // namespace

TEST_CASE("sequences: a Loop building a sequence is unrolled once its trip count is known",
          "[model]") {
  Graph g = repeat_heads_loop().build({{"batch", 2}, {"heads", 3}}, "loop");
  CHECK(dims_of(g, "y") == std::vector<std::int64_t>{2, 6, 4});
  CHECK(dims_of(g, "z") == std::vector<std::int64_t>{2, 6, 4});
  CHECK(g.tensor(g.find_tensor("out_seq")).sequence);
  CHECK(g.tensor(g.find_tensor("heads_seq")).sequence);
  CHECK(g.unresolved.empty());
  CHECK(g.unknown_dims.empty());
  // The Loop's body is not part of the graph view: hp adds no nodes of its own.
  CHECK(g.nodes.size() == 8);
}

TEST_CASE("sequences: an unbound trip count leaves the Loop alone and names the input dim",
          "[model]") {
  Graph g = repeat_heads_loop().build({{"batch", 2}}, "loop-unbound");
  CHECK(g.unknown_dims == std::vector<std::string>{"heads"});
  CHECK(g.unresolved.empty());         // everything unknown follows from the unbound dim
  CHECK(dims_of(g, "y").size() != 3);  // ONNX gives the rank at most, never invented values
  for (const auto& d : g.tensor(g.find_tensor("y")).dims) CHECK_FALSE((d.known() && d.value == 6));
}

TEST_CASE("sequences: a trip count computed from data is reported at the Loop", "[model]") {
  G b = repeat_heads_loop();
  // Replace the trip count by one read from an int input's values: not known before running.
  b.input("n", {"1"}, onnx::TensorProto::INT64);
  for (auto& n : *b.g->mutable_node())
    if (n.op_type() == "Loop") n.set_input(0, "n");
  Graph g = b.build({{"batch", 2}, {"heads", 3}}, "loop-data");
  REQUIRE_FALSE(g.unresolved.empty());
  CHECK(g.unresolved[0].op == "ConcatFromSequence");
  CHECK(contains(g.unresolved[0].reason, "sequence 'out_seq'"));
  CHECK(g.unknown_dims.empty());
}

TEST_CASE("sequences: malformed sequence graphs are left alone without crashing", "[model]") {
  SECTION("a position out of range") {
    G b = repeat_heads_loop();
    b.ints("seven", {7}, true);
    for (auto& n : *b.g->mutable_node())
      if (n.op_type() == "Loop")
        for (auto& a : *n.mutable_attribute())
          for (auto& bn : *a.mutable_g()->mutable_node())
            if (bn.op_type() == "SequenceAt") bn.set_input(1, "seven");
    Graph g = b.build({{"batch", 2}, {"heads", 3}}, "loop-range");
    CHECK_FALSE(g.unresolved.empty());
  }
  SECTION("a Loop without a body") {
    G b = repeat_heads_loop();
    for (auto& n : *b.g->mutable_node())
      if (n.op_type() == "Loop") n.clear_attribute();
    auto dir = scratch_dir("user_exports_nobody");
    write_bytes(dir / "m.onnx", b.m.SerializeAsString());
    auto model = load_model(dir / "m.onnx");
    if (model.ok()) {
      auto g = build_graph(*model, {{"batch", 2}, {"heads", 3}});
      if (g.ok()) CHECK_FALSE(g->unresolved.empty());
    }
  }
  SECTION("a body with the wrong number of inputs") {
    G b = repeat_heads_loop();
    for (auto& n : *b.g->mutable_node())
      if (n.op_type() == "Loop") n.mutable_attribute(0)->mutable_g()->mutable_input()->RemoveLast();
    auto dir = scratch_dir("user_exports_badbody");
    write_bytes(dir / "m.onnx", b.m.SerializeAsString());
    auto model = load_model(dir / "m.onnx");
    if (model.ok()) {
      auto g = build_graph(*model, {{"batch", 2}, {"heads", 3}});
      if (g.ok()) CHECK(dims_of(*g, "y") != std::vector<std::int64_t>{2, 6, 4});
    }
  }
}

TEST_CASE("values: Expand, Split and ReduceProd feed Reshape targets", "[model]") {
  // y = Reshape(x, [d0, d1*d2]) with d1*d2 from ReduceProd of a Split of Shape(x), and
  // z = Reshape(x, Expand([-1], [1]) ++ [d2]).
  G b;
  b.input("x", {"batch", "seq", "8"});
  b.ints("sizes", {1, 2});
  b.ints("m1", {-1});
  b.ints("one", {1});
  b.ints("two", {2});
  b.node("Shape", {"x"}, {"s"});
  set_int(b.node("Split", {"s", "sizes"}, {"head", "tail"}), "axis", 0);
  set_int(b.node("ReduceProd", {"tail"}, {"prod"}), "keepdims", 1);
  set_int(b.node("Concat", {"head", "prod"}, {"target"}), "axis", 0);
  b.node("Reshape", {"x", "target"}, {"y"});
  b.node("Expand", {"m1", "one"}, {"lead"});
  b.node("Gather", {"s", "two"}, {"last"});
  set_int(b.node("Concat", {"lead", "last"}, {"target2"}), "axis", 0);
  b.node("Reshape", {"x", "target2"}, {"z"});
  b.output("y");
  b.output("z");
  Graph g = b.build({{"batch", 3}, {"seq", 5}}, "values");
  CHECK(dims_of(g, "y") == std::vector<std::int64_t>{3, 40});
  CHECK(dims_of(g, "z") == std::vector<std::int64_t>{15, 8});
}

TEST_CASE("values: variadic Max/Min/Sum and comparisons fold all their inputs", "[model]") {
  // w = Reshape(x, [Max(d0, 1, 2) , Sum(d1, d1, -d1)... ]): Max(3, 1, 2) = 3 and
  // Sum(4, 4, -4) = 4, then Where(And(d0 >= 3, d1 <= 4), target, [-1]) keeps the target.
  G b;
  b.input("x", {"batch", "seq"});
  b.ints("zero", {0});
  b.ints("one_i", {1});
  b.ints("c1", {1});
  b.ints("c2", {2});
  b.ints("c3", {3});
  b.ints("c4", {4});
  b.ints("m4", {-4});
  b.ints("m1", {-1, -1});
  b.node("Shape", {"x"}, {"s"});
  b.node("Gather", {"s", "zero"}, {"d0"});
  b.node("Gather", {"s", "one_i"}, {"d1"});
  b.node("Max", {"d0", "c1", "c2"}, {"mx"});
  b.node("Sum", {"d1", "d1", "m4"}, {"sm"});
  set_int(b.node("Concat", {"mx", "sm"}, {"target"}), "axis", 0);
  b.node("GreaterOrEqual", {"d0", "c3"}, {"ge"});
  b.node("LessOrEqual", {"d1", "c4"}, {"le"});
  b.node("And", {"ge", "le"}, {"both"});
  b.node("Where", {"both", "target", "m1"}, {"chosen"});
  b.node("Reshape", {"x", "chosen"}, {"w"});
  b.output("w");
  Graph g = b.build({{"batch", 3}, {"seq", 4}}, "variadic");
  CHECK(dims_of(g, "w") == std::vector<std::int64_t>{3, 4});
  CHECK(g.unresolved.empty());
}

TEST_CASE("unresolved: a data-dependent size is named at its node", "[model]") {
  G b;
  b.input("x", {"batch", "4"});
  b.node("NonZero", {"x"}, {"nz"});
  b.node("Transpose", {"nz"}, {"idx"});
  b.node("GatherND", {"x", "idx"}, {"picked"});
  b.output("picked");
  Graph g = b.build({{"batch", 2}}, "nonzero");
  REQUIRE(g.unresolved.size() == 1);  // only where it starts, not the nodes after it
  CHECK(g.unresolved[0].op == "NonZero");
  CHECK(g.unresolved[0].tensor == "nz");
  CHECK(contains(g.unresolved[0].reason, "depends on the input data"));
  CHECK(g.unknown_dims.empty());
  bool warned = false;
  for (const auto& w : g.warnings) warned = warned || contains(w, "node 'nz' (NonZero)");
  CHECK(warned);
}

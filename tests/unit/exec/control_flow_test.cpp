// Control flow and sequences in the executor on graphs built here: If branches reading outer values
// (kept alive past their last explicit reader), Loop with a trip count, an early exit and zero
// iterations, sequences through run_values, and the errors: malformed subgraphs found when the
// executor is created, sequence misuse and out-of-range positions when it runs, sequence files
// that do not parse, and offload, which does not plan through control flow.
#include <catch2/catch.hpp>

#include <onnx/onnx-data_pb.h>
#include <onnx/onnx_pb.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "hp/exec/backends.h"
#include "hp/exec/executor.h"
#include "hp/exec/tensor.h"

namespace fs = std::filesystem;
using namespace hp;
using namespace hp::exec;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d =
      fs::temp_directory_path() / ("hp_control_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

HostTensor tensor(int dtype, std::vector<std::int64_t> dims, const void* data, std::size_t bytes) {
  HostTensor t;
  t.dtype = dtype;
  t.dims = std::move(dims);
  t.data.resize(bytes);
  if (bytes) std::memcpy(t.data.data(), data, bytes);
  return t;
}
HostTensor f32(std::vector<std::int64_t> dims, std::vector<float> v) {
  return tensor(HP_F32, std::move(dims), v.data(), v.size() * 4);
}
HostTensor i64(std::int64_t v) { return tensor(HP_I64, {}, &v, 8); }
HostTensor boolean(bool b) {
  std::uint8_t v = b ? 1 : 0;
  return tensor(HP_BOOL, {}, &v, 1);
}
std::vector<float> values(const HostTensor& t) {
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  std::memcpy(v.data(), t.data.data(), v.size() * 4);
  return v;
}

void add_value(google::protobuf::RepeatedPtrField<onnx::ValueInfoProto>* list,
               const std::string& name, int type = onnx::TensorProto::FLOAT, bool seq = false) {
  auto* v = list->Add();
  v->set_name(name);
  auto* tt =
      seq ? v->mutable_type()->mutable_sequence_type()->mutable_elem_type() : v->mutable_type();
  tt->mutable_tensor_type()->set_elem_type(type);
}

onnx::NodeProto* add_node(onnx::GraphProto* g, const std::string& op, std::vector<std::string> in,
                          std::vector<std::string> out, const std::string& name = "") {
  auto* n = g->add_node();
  n->set_op_type(op);
  n->set_name(name.empty() ? op + "_" + std::to_string(g->node_size()) : name);
  for (auto& s : in) n->add_input(s);
  for (auto& s : out) n->add_output(s);
  return n;
}

onnx::GraphProto* add_graph(onnx::NodeProto* n, const std::string& attr) {
  auto* a = n->add_attribute();
  a->set_name(attr);
  a->set_type(onnx::AttributeProto::GRAPH);
  a->mutable_g()->set_name(attr);
  return a->mutable_g();
}

void add_int(onnx::NodeProto* n, const std::string& attr, std::int64_t v) {
  auto* a = n->add_attribute();
  a->set_name(attr);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}

onnx::ModelProto new_model() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  m.mutable_graph()->set_name("main");
  return m;
}

Expected<std::unique_ptr<Executor>> prepare(const onnx::ModelProto& m, const std::string& name,
                                            OffloadConfig off = {}) {
  const fs::path p = temp_dir(name) / "m.onnx";
  std::ofstream(p, std::ios::binary) << m.SerializeAsString();
  model::LoadOptions lo;
  lo.mode = model::LoadMode::shapes_only;
  auto loaded = model::load_model(p, lo);
  REQUIRE(loaded.ok());
  auto b = open_backends("cpu", 1, {});
  REQUIRE(b.ok());
  ExecOptions o{b->cpu, b->cpu, nullptr};
  o.offload = off;
  return Executor::create(*loaded, o);
}

/// y = If(c) then (a * a) else (a + a), with a = x + 1 computed before the If and read only by the
/// branches (so only the If keeps it alive).
onnx::ModelProto if_model() {
  onnx::ModelProto m = new_model();
  auto* g = m.mutable_graph();
  add_value(g->mutable_input(), "c", onnx::TensorProto::BOOL);
  add_value(g->mutable_input(), "x");
  add_value(g->mutable_output(), "y");
  auto* one = g->add_initializer();
  one->set_name("one");
  one->set_data_type(onnx::TensorProto::FLOAT);
  one->add_float_data(1);
  add_node(g, "Add", {"x", "one"}, {"a"});
  auto* n = add_node(g, "If", {"c"}, {"y"}, "branch");
  auto* t = add_graph(n, "then_branch");
  add_node(t, "Mul", {"a", "a"}, {"t_out"});
  add_value(t->mutable_output(), "t_out");
  auto* e = add_graph(n, "else_branch");
  add_node(e, "Add", {"a", "a"}, {"e_out"});
  add_value(e->mutable_output(), "e_out");
  return m;
}

/// Loop(M, cond, s0) whose body doubles s, stops when s > limit, and emits s as a scan output.
onnx::ModelProto loop_model() {
  onnx::ModelProto m = new_model();
  auto* g = m.mutable_graph();
  add_value(g->mutable_input(), "M", onnx::TensorProto::INT64);
  add_value(g->mutable_input(), "s0");
  add_value(g->mutable_output(), "s");
  add_value(g->mutable_output(), "trace");
  auto* limit = g->add_initializer();
  limit->set_name("limit");
  limit->set_data_type(onnx::TensorProto::FLOAT);
  limit->add_float_data(10);
  auto* n = add_node(g, "Loop", {"M", "", "s0"}, {"s", "trace"}, "loop");
  auto* b = add_graph(n, "body");
  add_value(b->mutable_input(), "i", onnx::TensorProto::INT64);
  add_value(b->mutable_input(), "c_in", onnx::TensorProto::BOOL);
  add_value(b->mutable_input(), "s_in");
  add_node(b, "Add", {"s_in", "s_in"}, {"s_out"});
  add_node(b, "Less", {"s_out", "limit"}, {"c_out"});
  add_node(b, "Identity", {"s_out"}, {"emit"});
  for (const char* o : {"c_out", "s_out", "emit"})
    add_value(b->mutable_output(), o,
              std::string(o) == "c_out" ? onnx::TensorProto::BOOL : onnx::TensorProto::FLOAT);
  return m;
}

}  // namespace

TEST_CASE("control flow: If runs the branch the condition picks, reading outer values", "[exec]") {
  auto ex = prepare(if_model(), "if");
  REQUIRE(ex.ok());
  for (bool c : {true, false, true}) {
    auto out = (*ex)->run({boolean(c), f32({2}, {1, 2})});
    REQUIRE(out.ok());
    // a = [2, 3]: a*a or a+a
    CHECK(values((*out)[0]) == (c ? std::vector<float>{4, 9} : std::vector<float>{4, 6}));
  }
  CHECK((*ex)->stats().by_op.count("If") == 1);
}

TEST_CASE("control flow: Loop carries state, stops on its condition and stacks scan outputs",
          "[exec]") {
  auto ex = prepare(loop_model(), "loop");
  REQUIRE(ex.ok());
  SECTION("the trip count ends it") {
    auto out = (*ex)->run({i64(2), f32({1}, {1})});
    REQUIRE(out.ok());
    CHECK(values((*out)[0]) == std::vector<float>{4});
    CHECK((*out)[1].dims == std::vector<std::int64_t>{2, 1});
    CHECK(values((*out)[1]) == std::vector<float>{2, 4});
  }
  SECTION("the body's condition ends it") {
    auto out = (*ex)->run({i64(100), f32({1}, {1})});
    REQUIRE(out.ok());
    CHECK(values((*out)[0]) == std::vector<float>{16});  // 2, 4, 8, 16 (16 >= 10 stops)
    CHECK(values((*out)[1]) == std::vector<float>{2, 4, 8, 16});
  }
  SECTION("zero iterations give the initial state and an empty scan output") {
    auto out = (*ex)->run({i64(0), f32({1}, {3})});
    REQUIRE(out.ok());
    CHECK(values((*out)[0]) == std::vector<float>{3});
    CHECK((*out)[1].dims.at(0) == 0);
  }
}

TEST_CASE("sequences: construct, insert, at, length and concat through run_values", "[exec]") {
  onnx::ModelProto m = new_model();
  auto* g = m.mutable_graph();
  add_value(g->mutable_input(), "s", onnx::TensorProto::FLOAT, true);
  add_value(g->mutable_input(), "x");
  add_value(g->mutable_output(), "joined");
  add_value(g->mutable_output(), "len", onnx::TensorProto::INT64);
  add_value(g->mutable_output(), "s2", onnx::TensorProto::FLOAT, true);
  add_node(g, "SequenceInsert", {"s", "x"}, {"s2"});
  add_node(g, "SequenceLength", {"s2"}, {"len"});
  add_node(g, "ConcatFromSequence", {"s2"}, {"joined"});
  add_int(g->mutable_node(2), "axis", 0);
  auto ex = prepare(m, "seq");
  REQUIRE(ex.ok());
  CHECK((*ex)->inputs()[0].sequence);
  HostValue s;
  s.is_sequence = true;
  s.elem_dtype = HP_F32;
  s.items = {f32({1}, {1}), f32({2}, {2, 3})};
  HostValue x;
  x.tensor = f32({1}, {4});
  auto out = (*ex)->run_values({s, x});
  REQUIRE(out.ok());
  CHECK(values((*out)[0].tensor) == std::vector<float>{1, 2, 3, 4});
  CHECK((*out)[1].tensor.as<std::int64_t>()[0] == 3);
  REQUIRE((*out)[2].is_sequence);
  CHECK((*out)[2].items.size() == 3);
  // run() takes tensors only: a sequence input is refused before anything runs.
  auto plain = (*ex)->run({x.tensor, x.tensor});
  REQUIRE(!plain.ok());
  CHECK(plain.error().code == Errc::bad_input);
}

TEST_CASE("sequences: misuse and out-of-range positions are run-time errors naming the node",
          "[exec]") {
  onnx::ModelProto m = new_model();
  auto* g = m.mutable_graph();
  add_value(g->mutable_input(), "x");
  add_value(g->mutable_input(), "p", onnx::TensorProto::INT64);
  add_value(g->mutable_output(), "y");
  add_node(g, "SequenceConstruct", {"x", "x"}, {"s"});
  add_node(g, "SequenceAt", {"s", "p"}, {"y"}, "pick");
  auto ex = prepare(m, "seq_at");
  REQUIRE(ex.ok());
  auto ok = (*ex)->run({f32({1}, {5}), i64(-2)});
  REQUIRE(ok.ok());
  CHECK(values((*ok)[0]) == std::vector<float>{5});
  auto bad = (*ex)->run({f32({1}, {5}), i64(2)});
  REQUIRE(!bad.ok());
  CHECK(bad.error().code == Errc::runtime);
  CHECK(bad.error().what.where == "pick");
  CHECK(bad.error().message().find("position 2") != std::string::npos);

  // A sequence where a kernel needs a tensor.
  onnx::ModelProto m2 = new_model();
  auto* g2 = m2.mutable_graph();
  add_value(g2->mutable_input(), "x");
  add_value(g2->mutable_output(), "y");
  add_node(g2, "SequenceConstruct", {"x"}, {"s"});
  add_node(g2, "Relu", {"s"}, {"y"}, "relu");
  auto ex2 = prepare(m2, "seq_misuse");
  REQUIRE(ex2.ok());
  auto r = (*ex2)->run({f32({1}, {5})});
  REQUIRE(!r.ok());
  CHECK(r.error().message().find("is a sequence") != std::string::npos);
}

TEST_CASE("control flow: malformed subgraphs are bad_input when the executor is created",
          "[exec]") {
  SECTION("a missing branch") {
    onnx::ModelProto m = if_model();
    auto* n = m.mutable_graph()->mutable_node(1);
    n->mutable_attribute()->RemoveLast();
    auto ex = prepare(m, "no_else");
    REQUIRE(!ex.ok());
    CHECK(ex.error().code == Errc::bad_input);
    CHECK(ex.error().message().find("else_branch") != std::string::npos);
  }
  SECTION("branches with different output counts") {
    onnx::ModelProto m = if_model();
    add_value(
        m.mutable_graph()->mutable_node(1)->mutable_attribute(1)->mutable_g()->mutable_output(),
        "a");
    auto ex = prepare(m, "branch_outputs");
    REQUIRE(!ex.ok());
    CHECK(ex.error().code == Errc::bad_input);
    CHECK(ex.error().message().find("2 outputs") != std::string::npos);
  }
  SECTION("a body reading a name nothing defines") {
    onnx::ModelProto m = loop_model();
    auto* b = m.mutable_graph()->mutable_node(0)->mutable_attribute(0)->mutable_g();
    b->mutable_node(0)->set_input(1, "nowhere");
    auto ex = prepare(m, "undefined");
    REQUIRE(!ex.ok());
    CHECK(ex.error().code == Errc::bad_input);
    CHECK(ex.error().message().find("nowhere") != std::string::npos);
  }
  SECTION("an unsupported op inside a body is listed with the others") {
    onnx::ModelProto m = loop_model();
    auto* b = m.mutable_graph()->mutable_node(0)->mutable_attribute(0)->mutable_g();
    b->mutable_node(2)->set_op_type("NoSuchOp");
    auto ex = prepare(m, "unsupported");
    REQUIRE(!ex.ok());
    CHECK(ex.error().message().find("NoSuchOp") != std::string::npos);
  }
  SECTION("a Loop body with the wrong number of inputs") {
    onnx::ModelProto m = loop_model();
    auto* b = m.mutable_graph()->mutable_node(0)->mutable_attribute(0)->mutable_g();
    b->mutable_input()->RemoveLast();
    auto ex = prepare(m, "loop_arity");
    REQUIRE(!ex.ok());
    CHECK(ex.error().code == Errc::bad_input);
  }
}

TEST_CASE("control flow: offload does not plan through it yet", "[exec]") {
  OffloadConfig off;
  off.enabled = true;
  auto ex = prepare(if_model(), "offload", off);
  REQUIRE(!ex.ok());
  CHECK(ex.error().code == Errc::not_implemented);
}

TEST_CASE("sequence files: a SequenceProto reads back; a malformed one is named", "[exec]") {
  fs::path d = temp_dir("seqfile");
  onnx::SequenceProto sp;
  sp.set_elem_type(onnx::SequenceProto::TENSOR);
  for (float v : {1.f, 2.f}) {
    auto* t = sp.add_tensor_values();
    t->set_data_type(onnx::TensorProto::FLOAT);
    t->add_dims(1);
    t->add_float_data(v);
  }
  std::ofstream(d / "s.pb", std::ios::binary) << sp.SerializeAsString();
  auto v = read_value_file(d / "s.pb", true);
  REQUIRE(v.ok());
  CHECK(v->is_sequence);
  REQUIRE(v->items.size() == 2);
  CHECK(values(v->items[1]) == std::vector<float>{2});

  std::ofstream(d / "bad.pb") << "\x0a\xff\xff garbage";
  auto bad = read_value_file(d / "bad.pb", true);
  REQUIRE(!bad.ok());
  CHECK(bad.error().code == Errc::bad_input);
  CHECK(bad.error().what.where.find("bad.pb") != std::string::npos);
  auto missing = read_value_file(d / "none.pb", true);
  REQUIRE(!missing.ok());
  CHECK(missing.error().code == Errc::bad_input);
}

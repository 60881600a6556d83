// Loading and validating ONNX files: good models, malformed files (each a clear bad_input error
// naming the file, never a crash), and initializers with external data present or absent.
#include <onnx/onnx_pb.h>

#include <catch2/catch.hpp>

#include <fstream>
#include <random>
#include <string>
#include <tuple>

#include "hp/core/fs.h"
#include "hp/model/model.h"
#include "model_test_util.h"

using namespace hp;
using namespace hp::model;
using namespace hp::model::test;

namespace {

// y = MatMul(x, w) with w [4, 3] float; `external` puts w's data in a side file.
onnx::ModelProto tiny_matmul(bool external, const std::string& input_of_matmul = "x") {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  g->set_name("tiny");
  auto* x = g->add_input();
  x->set_name("x");
  auto* xt = x->mutable_type()->mutable_tensor_type();
  xt->set_elem_type(onnx::TensorProto::FLOAT);
  xt->mutable_shape()->add_dim()->set_dim_param("batch");
  xt->mutable_shape()->add_dim()->set_dim_value(4);
  auto* w = g->add_initializer();
  w->set_name("w");
  w->set_data_type(onnx::TensorProto::FLOAT);
  w->add_dims(4);
  w->add_dims(3);
  if (external) {
    w->set_data_location(onnx::TensorProto::EXTERNAL);
    auto* kv = w->add_external_data();
    kv->set_key("location");
    kv->set_value("tiny.weights");
    kv = w->add_external_data();
    kv->set_key("length");
    kv->set_value("48");
  } else {
    for (int i = 0; i < 12; ++i) w->add_float_data(0.5f);
  }
  auto* n = g->add_node();
  n->set_op_type("MatMul");
  n->set_name("mm");
  n->add_input(input_of_matmul);
  n->add_input("w");
  n->add_output("y");
  auto* y = g->add_output();
  y->set_name("y");
  y->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  return m;
}

void save(const onnx::ModelProto& m, const std::filesystem::path& p) {
  write_bytes(p, m.SerializeAsString());
}

void require_bad_input(const std::filesystem::path& p) {
  auto m = load_model(p);
  REQUIRE_FALSE(m.ok());
  CHECK(m.error().code == Errc::bad_input);
  CHECK(m.error().where() == p.string());
  INFO(m.error().str());
  CHECK_FALSE(m.error().message().empty());
}

}  // namespace

TEST_CASE("model: loads every generated test model", "[model]") {
  for (const char* name : {"tiny-gpt2", "tiny-llama", "tiny-vit", "tiny-mlp", "tiny-moe",
                           "masked-gpt2", "anon-gpt2", "anon-llama", "gpt-175b-skeleton"}) {
    INFO(name);
    auto m = load_model(model_path(name));
    REQUIRE(m.ok());
    CHECK(m->ir_version > 0);
    CHECK(m->opsets.count("") == 1);
  }
}

TEST_CASE("model: missing file, directory and empty file are bad input", "[model]") {
  auto dir = scratch_dir("model_load_basic");
  require_bad_input(dir / "does-not-exist.onnx");
  require_bad_input(dir);
  write_bytes(dir / "empty.onnx", "");
  require_bad_input(dir / "empty.onnx");
}

TEST_CASE("model: truncated files are rejected", "[model]") {
  auto bytes = read_file(model_path("tiny-gpt2"));
  REQUIRE(bytes.ok());
  auto dir = scratch_dir("model_load_truncated");
  for (std::size_t keep : {std::size_t{1}, std::size_t{7}, std::size_t{100}, bytes->size() / 3,
                           bytes->size() / 2, bytes->size() - 1}) {
    INFO("kept " << keep << " bytes");
    auto p = dir / ("cut" + std::to_string(keep) + ".onnx");
    write_bytes(p, bytes->substr(0, keep));
    require_bad_input(p);
  }
}

TEST_CASE("model: random bytes are rejected", "[model]") {
  auto dir = scratch_dir("model_load_random");
  std::mt19937 rng(1234);
  for (int i = 0; i < 40; ++i) {
    std::size_t size = 1 + rng() % 5000;
    std::string bytes(size, '\0');
    for (auto& c : bytes) c = static_cast<char>(rng() & 0xff);
    auto p = dir / ("random" + std::to_string(i) + ".onnx");
    write_bytes(p, bytes);
    INFO("seed 1234 file " << i << " (" << size << " bytes)");
    require_bad_input(p);
  }
  write_bytes(dir / "text.onnx", "this is not a model\n");
  require_bad_input(dir / "text.onnx");
}

TEST_CASE("model: a recipe given as the model is named as one", "[model]") {
  auto dir = scratch_dir("model_load_recipe");
  auto message = [](const std::filesystem::path& p) {
    auto m = hp::model::load_model(p);
    REQUIRE_FALSE(m.ok());
    CHECK(m.error().code == hp::Errc::bad_input);
    return m.error().what.message;
  };
  const std::string recipe = "this is a recipe (TOML), not an onnx model";
  write_bytes(dir / "r.toml", "[recipe]\nversion = 1\n");
  CHECK(message(dir / "r.toml") == recipe);
  // Another extension: the first meaningful line decides (comments and blank lines skipped).
  write_bytes(dir / "r.model", "# a recipe\n\n  [recipe]\n");
  CHECK(message(dir / "r.model") == recipe);
  write_bytes(dir / "kv.bin", "name = \"x\"\n");
  CHECK(message(dir / "kv.bin") == recipe);
  // Text that is neither: still the protobuf error, not a guess.
  for (const char* text : {"this is not a model\n", "[unclosed\n", "= 3\n", "a b = 1\n"}) {
    write_bytes(dir / "t.onnx", text);
    INFO(text);
    CHECK(message(dir / "t.onnx").find("protobuf parse failed") != std::string::npos);
  }
}

TEST_CASE("model: a node using an undefined tensor is rejected with its name", "[model]") {
  auto dir = scratch_dir("model_load_undefined");
  save(tiny_matmul(false, "nowhere"), dir / "undefined.onnx");
  auto m = load_model(dir / "undefined.onnx");
  REQUIRE_FALSE(m.ok());
  CHECK(m.error().code == Errc::bad_input);
  CHECK(m.error().message().find("'nowhere'") != std::string::npos);
}

TEST_CASE("model: an initializer whose data does not match its dims is rejected", "[model]") {
  auto dir = scratch_dir("model_load_size");
  auto proto = tiny_matmul(false);
  proto.mutable_graph()->mutable_initializer(0)->add_float_data(1.0f);  // 13 values for 4x3
  save(proto, dir / "size.onnx");
  auto m = load_model(dir / "size.onnx");
  REQUIRE_FALSE(m.ok());
  CHECK(m.error().message().find("'w'") != std::string::npos);
}

TEST_CASE("model: absent external data is fine for planning, an error when data is required",
          "[model]") {
  auto dir = scratch_dir("model_load_external");
  save(tiny_matmul(true), dir / "tiny.onnx");

  auto planning = load_model(dir / "tiny.onnx");
  REQUIRE(planning.ok());
  REQUIRE(planning->missing_external_data == std::vector<std::string>{"tiny.weights"});
  auto graph = build_graph(*planning, {{"batch", 5}});
  REQUIRE(graph.ok());
  const auto& mm = graph->nodes.at(0);
  CHECK(mm.cost.matmul_flops == 2 * 5 * 4 * 3);
  CHECK(mm.cost.parameters == 12);

  auto running = load_model(dir / "tiny.onnx", {LoadMode::require_data});
  REQUIRE_FALSE(running.ok());
  CHECK(running.error().code == Errc::bad_input);
  CHECK(running.error().message().find("tiny.weights") != std::string::npos);

  write_bytes(dir / "tiny.weights", std::string(48, '\0'));
  auto present = load_model(dir / "tiny.onnx", {LoadMode::require_data});
  REQUIRE(present.ok());
  CHECK(present->missing_external_data.empty());

  write_bytes(dir / "tiny.weights", std::string(20, '\0'));
  auto short_file = load_model(dir / "tiny.onnx", {LoadMode::require_data});
  REQUIRE_FALSE(short_file.ok());
  CHECK(short_file.error().message().find("48") != std::string::npos);
}

TEST_CASE("model: the 175B skeleton's weights are absent and never read", "[model]") {
  auto m = load_model(model_path("gpt-175b-skeleton"));
  REQUIRE(m.ok());
  CHECK(m->missing_external_data == std::vector<std::string>{"gpt-175b-skeleton.weights"});
  REQUIRE(m->external_files.size() == 1);
  CHECK(m->external_files[0].bytes_needed == 2ull * 174604259328ull);
  auto required = load_model(model_path("gpt-175b-skeleton"), {LoadMode::require_data});
  REQUIRE_FALSE(required.ok());
  CHECK(required.error().message().find("gpt-175b-skeleton.weights") != std::string::npos);
}

TEST_CASE("model: byte-mutated models load or fail cleanly, never crash", "[model]") {
  // Mutations keep most of the protobuf structure, so many parse and reach shape inference and the
  // shape-arithmetic evaluator with odd values (out-of-range axes, huge dims, INT64_MAX bounds).
  auto original = read_file(model_path("tiny-llama"));
  REQUIRE(original.ok());
  auto dir = scratch_dir("model_load_mutated");
  std::mt19937 rng(2024);
  int loaded = 0;
  for (int i = 0; i < 120; ++i) {
    std::string bytes = *original;
    for (int k = 1 + static_cast<int>(rng() % 16); k > 0; --k)
      bytes[rng() % bytes.size()] = static_cast<char>(rng() & 0xff);
    auto p = dir / "mutated.onnx";
    write_bytes(p, bytes);
    INFO("seed 2024 mutation " << i);
    auto m = load_model(p);
    if (!m) {
      CHECK(m.error().code == Errc::bad_input);
      continue;
    }
    auto g = build_graph(*m, {{"batch", 2}, {"seq", 16}});
    if (g)
      ++loaded;
    else
      CHECK(g.error().code == Errc::bad_input);
  }
  CHECK(loaded > 0);
}

TEST_CASE("model: an opset newer than the onnx library is a warning, not an error", "[model]") {
  auto dir = scratch_dir("model_load_opset");
  auto proto = tiny_matmul(false);
  proto.mutable_opset_import(0)->set_version(30);
  save(proto, dir / "new.onnx");
  auto m = load_model(dir / "new.onnx");
  REQUIRE(m.ok());
  auto g = build_graph(*m, {{"batch", 2}});
  REQUIRE(g.ok());
  bool warned = false;
  for (const auto& w : g->warnings) warned = warned || w.find("opset 30") != std::string::npos;
  CHECK(warned);
}

// libonnx 1.12's data propagation dereferences a missing type: a Shape node downstream of an op
// it has no schema for (an "hp" collective, a vendor op) crashed the process before every such
// output got a typed stub (libs/model/src/shape_hp.cpp, add_type_stubs).
TEST_CASE("model: Shape downstream of ops onnx does not know is inferred, not a crash", "[model]") {
  onnx::ModelProto m;
  m.set_ir_version(8);
  for (auto [domain, version] : {std::pair{"", 17}, {"hp", 1}, {"com.vendor", 1}}) {
    auto* op = m.add_opset_import();
    op->set_domain(domain);
    op->set_version(version);
  }
  auto* g = m.mutable_graph();
  g->set_name("g");
  auto* x = g->add_input();
  x->set_name("x");
  x->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  for (int d : {2, 3})
    x->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(d);
  auto node = [&](const char* op, const char* domain, const char* in, const char* out) {
    auto* n = g->add_node();
    n->set_op_type(op);
    n->set_domain(domain);
    n->add_input(in);
    n->add_output(out);
    return n;
  };
  auto* ar = node("AllReduce", "hp", "x", "y");
  auto* group = ar->add_attribute();
  group->set_name("group");
  group->set_type(onnx::AttributeProto::INTS);
  group->add_ints(0);
  group->add_ints(1);
  node("Relu", "", "y", "z");
  node("Shape", "", "z", "s");
  node("Mystery", "com.vendor", "x", "v");
  node("Relu", "", "v", "w");
  node("Shape", "", "w", "t");
  for (const char* o : {"s", "t"}) {
    auto* out = g->add_output();
    out->set_name(o);
    out->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::INT64);
  }
  const auto dir = scratch_dir("untyped-shape");
  std::string bytes;
  REQUIRE(m.SerializeToString(&bytes));
  write_bytes(dir / "m.onnx", bytes);
  auto model = load_model(dir / "m.onnx");
  REQUIRE(model);
  auto graph = build_graph(*model, {});
  REQUIRE(graph);
  // The all-reduce keeps its input's shape (hp's own rule), so the Shape downstream is known.
  const auto& z = graph->tensor(graph->find_tensor("z"));
  REQUIRE(z.dims.size() == 2);
  CHECK(z.dims[0].value == 2);
  CHECK(z.dims[1].value == 3);
}

TEST_CASE("model: an untyped graph output an hp op writes gets its shape without a crash",
          "[model]") {
  // What a part cut out of a gradient model looks like (split_backward.cpp declares its outputs
  // by name): hp.AllToAll's output is a graph output with no type. libonnx's inference crashed on
  // it (shape.cpp, type_untyped_outputs).
  onnx::ModelProto m;
  m.set_ir_version(8);
  for (auto [domain, version] : {std::pair{"", 17}, {"hp", 1}}) {
    auto* op = m.add_opset_import();
    op->set_domain(domain);
    op->set_version(version);
  }
  auto* g = m.mutable_graph();
  g->set_name("g");
  auto* x = g->add_input();
  x->set_name("x");
  x->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  for (int d : {4, 1, 3})
    x->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(d);
  auto* n = g->add_node();
  n->set_op_type("AllToAll");
  n->set_domain("hp");
  n->add_input("x");
  n->add_output("y");
  auto attr = [&](const char* name, std::vector<std::int64_t> v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    if (v.size() == 1) {
      a->set_type(onnx::AttributeProto::INT);
      a->set_i(v[0]);
      return;
    }
    a->set_type(onnx::AttributeProto::INTS);
    for (auto e : v) a->add_ints(e);
  };
  attr("group", {0, 1});
  attr("split_axis", {0});
  attr("concat_axis", {1});
  g->add_output()->set_name("y");
  // ... read by a Mul whose Shape is taken, as the gate's product is in an expert layer.
  auto* gate = g->add_input();
  gate->set_name("gate");
  gate->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  for (int d : {2, 2, 1})
    gate->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(d);
  for (auto [op, in, out] : {std::tuple{"Mul", "y", "w"}, {"Shape", "w", "s"}}) {
    auto* k = g->add_node();
    k->set_op_type(op);
    k->add_input(in);
    if (std::string(op) == "Mul") k->add_input("gate");
    k->add_output(out);
  }
  const auto dir = scratch_dir("untyped-hp-output");
  std::string bytes;
  REQUIRE(m.SerializeToString(&bytes));
  write_bytes(dir / "m.onnx", bytes);
  auto model = load_model(dir / "m.onnx");
  REQUIRE(model);
  auto graph = build_graph(*model, {});
  INFO((graph ? std::string() : graph.error().str()));
  REQUIRE(graph);
  const auto& y = graph->tensor(graph->find_tensor("y"));
  REQUIRE(y.dims.size() == 3);
  CHECK(y.dims[0].value == 2);  // split over the two members, their blocks concatenated on axis 1
  CHECK(y.dims[1].value == 2);
  CHECK(y.dims[2].value == 3);
}

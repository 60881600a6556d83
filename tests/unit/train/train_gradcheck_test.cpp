// The gradient check (libs/train/src/gradcheck.cpp, float64.cpp): to_float64 on graphs built here
// (every place a float type hides, the values kept, malformed data refused) and on a PyTorch export
// (its outputs against torch's own float64 outputs); check_gradients passing on small models with
// generated and with given inputs, failing on a gradient model made wrong on purpose, and refusing
// what it cannot check (an op without a gradient rule, integer inputs it cannot generate, a missing
// model, nothing to train).
#include <onnx/onnx_pb.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "hp/exec/backends.h"
#include "hp/exec/executor.h"
#include "hp/plugin/hp_plugin.h"
#include "hp/train/gradcheck.h"

namespace fs = std::filesystem;
using namespace hp;
using onnx::TensorProto;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d =
      fs::temp_directory_path() / ("hp_gradcheck_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

/// A small graph under construction.
struct Builder {
  onnx::ModelProto m;
  std::mt19937 rng{11};
  Builder() {
    m.set_ir_version(8);
    m.add_opset_import()->set_version(17);
  }
  onnx::GraphProto& g() { return *m.mutable_graph(); }
  static void value(onnx::ValueInfoProto* v, const std::string& name,
                    const std::vector<std::int64_t>& dims, int type) {
    v->set_name(name);
    auto* tt = v->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(type);
    for (auto d : dims) {
      auto* dim = tt->mutable_shape()->add_dim();
      if (d < 0)
        dim->set_dim_param("batch");
      else
        dim->set_dim_value(d);
    }
  }
  void input(const std::string& name, std::vector<std::int64_t> dims,
             int type = TensorProto::FLOAT) {
    value(g().add_input(), name, dims, type);
  }
  void output(const std::string& name, std::vector<std::int64_t> dims,
              int type = TensorProto::FLOAT) {
    value(g().add_output(), name, dims, type);
  }
  /// A float32 initializer, in float_data or (raw) in raw_data.
  void weight(const std::string& name, std::vector<std::int64_t> dims, double scale = 0.5,
              bool raw = false) {
    auto* t = g().add_initializer();
    t->set_name(name);
    t->set_data_type(TensorProto::FLOAT);
    std::int64_t n = 1;
    for (auto d : dims) {
      t->add_dims(d);
      n *= d;
    }
    std::normal_distribution<float> nd(0.f, static_cast<float>(scale));
    std::vector<float> v;
    for (std::int64_t k = 0; k < n; ++k) v.push_back(nd(rng));
    if (raw)
      t->set_raw_data(std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4));
    else
      for (float f : v) t->add_float_data(f);
  }
  void ints(const std::string& name, std::vector<std::int64_t> v) {
    auto* t = g().add_initializer();
    t->set_name(name);
    t->set_data_type(TensorProto::INT64);
    t->add_dims(static_cast<std::int64_t>(v.size()));
    for (auto x : v) t->add_int64_data(x);
  }
  onnx::NodeProto* node(const std::string& op, std::vector<std::string> in,
                        std::vector<std::string> out) {
    auto* n = g().add_node();
    n->set_op_type(op);
    n->set_name(op + "_" + std::to_string(g().node_size()));
    for (auto& s : in) n->add_input(s);
    for (auto& s : out) n->add_output(s);
    return n;
  }
  static void attr_i(onnx::NodeProto* n, const std::string& name, std::int64_t v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(v);
  }
  fs::path save(const fs::path& dir, const std::string& name) {
    fs::path p = dir / name;
    std::ofstream(p, std::ios::binary) << m.SerializeAsString();
    return p;
  }
};

model::Model load(const fs::path& p) {
  model::LoadOptions lo;
  lo.mode = model::LoadMode::require_data;
  auto m = model::load_model(p, lo);
  INFO((m ? "" : m.error().str()));
  REQUIRE(m);
  return *m;
}

exec::HostTensor f32(const std::string& name, std::vector<std::int64_t> dims, std::uint32_t seed) {
  exec::HostTensor t;
  t.name = name;
  t.dtype = HP_F32;
  t.dims = std::move(dims);
  t.data.resize(static_cast<std::size_t>(t.numel() * 4));
  std::mt19937 r(seed);
  std::normal_distribution<float> nd;
  for (std::int64_t i = 0; i < t.numel(); ++i) t.as<float>()[i] = nd(r);
  return t;
}

exec::HostTensor to_f64(const exec::HostTensor& t) {
  exec::HostTensor d;
  d.name = t.name;
  d.dtype = HP_F64;
  d.dims = t.dims;
  d.data.resize(static_cast<std::size_t>(t.numel() * 8));
  for (std::int64_t i = 0; i < t.numel(); ++i) d.as<double>()[i] = t.as<float>()[i];
  return d;
}

std::vector<exec::HostTensor> run(const model::Model& m, const std::vector<exec::HostTensor>& in) {
  auto b = exec::open_backends("cpu", 1, {});
  REQUIRE(b);
  auto ex = exec::Executor::create(m, {b->primary, b->cpu, nullptr});
  INFO((ex ? "" : ex.error().str()));
  REQUIRE(ex);
  auto out = (*ex)->run(in);
  INFO((out ? "" : out.error().str()));
  REQUIRE(out);
  return *out;
}

/// Every float32/16 element type left in the graph (types, initializers, attributes), by name.
void narrow_types(const onnx::GraphProto& g, std::vector<std::string>& found) {
  auto narrow = [](std::int32_t t) {
    return t == TensorProto::FLOAT || t == TensorProto::FLOAT16 || t == TensorProto::BFLOAT16;
  };
  for (const auto& t : g.initializer())
    if (narrow(t.data_type())) found.push_back("initializer " + t.name());
  for (const auto* vs : {&g.input(), &g.output(), &g.value_info()})
    for (const auto& v : *vs)
      if (narrow(v.type().tensor_type().elem_type())) found.push_back("value " + v.name());
  for (const auto& n : g.node())
    for (const auto& a : n.attribute()) {
      if (a.has_t() && narrow(a.t().data_type())) found.push_back(n.name() + "." + a.name());
      if ((a.name() == "to" || a.name() == "dtype") && narrow(static_cast<std::int32_t>(a.i())))
        found.push_back(n.name() + "." + a.name());
      if (a.name() == "value_float" || a.name() == "value_floats")
        found.push_back(n.name() + "." + a.name());
      if (a.has_g()) narrow_types(a.g(), found);
    }
}

/// y = Softmax(Relu(x W1 + b1) W2 + b2) scaled by float32 constants of every kind, with a float16
/// weight cast to float, a Cast to float, ConstantOfShape and an If whose branches hold constants.
fs::path write_typed_model(const fs::path& dir) {
  Builder b;
  b.input("x", {-1, 3});
  b.output("y", {-1, 4});
  b.weight("W1", {3, 5}, 0.5, /*raw=*/true);
  b.weight("b1", {5});
  b.weight("W2", {5, 4});
  auto* h = b.g().add_initializer();  // a float16 bias: 0.5, -0.25, 1.0, 2.0
  h->set_name("b2h");
  h->set_data_type(TensorProto::FLOAT16);
  h->add_dims(4);
  for (int bits : {0x3800, 0xB400, 0x3C00, 0x4000}) h->add_int32_data(bits);
  b.node("MatMul", {"x", "W1"}, {"xw"});
  b.node("Add", {"xw", "b1"}, {"h1"});
  b.node("Relu", {"h1"}, {"r"});
  b.node("MatMul", {"r", "W2"}, {"z0"});
  Builder::attr_i(b.node("Cast", {"b2h"}, {"b2"}), "to", TensorProto::FLOAT);
  b.node("Add", {"z0", "b2"}, {"z1"});
  auto* c1 = b.node("Constant", {}, {"k1"});
  auto* a1 = c1->add_attribute();
  a1->set_name("value_float");
  a1->set_type(onnx::AttributeProto::FLOAT);
  a1->set_f(0.75f);
  auto* c2 = b.node("Constant", {}, {"k2"});
  auto* a2 = c2->add_attribute();
  a2->set_name("value_floats");
  a2->set_type(onnx::AttributeProto::FLOATS);
  for (float f : {1.f, 2.f, 0.5f, 1.5f}) a2->add_floats(f);
  b.ints("four", {4});
  auto* cs = b.node("ConstantOfShape", {"four"}, {"k3"});
  auto* a3 = cs->add_attribute();
  a3->set_name("value");
  a3->set_type(onnx::AttributeProto::TENSOR);
  a3->mutable_t()->set_data_type(TensorProto::FLOAT);
  a3->mutable_t()->add_dims(1);
  a3->mutable_t()->add_float_data(0.125f);
  b.node("Mul", {"z1", "k1"}, {"z2"});
  b.node("Mul", {"z2", "k2"}, {"z3"});
  b.node("Add", {"z3", "k3"}, {"z4"});
  // If(true) { Constant 1.5 } else { Constant -1 }: subgraph constants and outputs rewritten too.
  auto* ct = b.g().add_initializer();
  ct->set_name("cond");
  ct->set_data_type(TensorProto::BOOL);
  ct->add_int32_data(1);
  auto* iff = b.node("If", {"cond"}, {"sel"});
  for (auto [name, v] : {std::pair{"then_branch", 1.5f}, std::pair{"else_branch", -1.f}}) {
    auto* a = iff->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::GRAPH);
    auto* sg = a->mutable_g();
    sg->set_name(name);
    auto* cn = sg->add_node();
    cn->set_op_type("Constant");
    cn->add_output(std::string(name) + "_v");
    auto* ca = cn->add_attribute();
    ca->set_name("value");
    ca->set_type(onnx::AttributeProto::TENSOR);
    ca->mutable_t()->set_data_type(TensorProto::FLOAT);
    ca->mutable_t()->add_float_data(v);
    Builder::value(sg->add_output(), std::string(name) + "_v", {}, TensorProto::FLOAT);
  }
  b.node("Mul", {"z4", "sel"}, {"z5"});
  Builder::attr_i(b.node("Softmax", {"z5"}, {"y"}), "axis", -1);
  Builder::value(b.g().add_value_info(), "z1", {-1, 4}, TensorProto::FLOAT);
  return b.save(dir, "typed.onnx");
}

}  // namespace

TEST_CASE("to_float64 rewrites every float type and computes the same function in double") {
  const fs::path dir = temp_dir("typed");
  const model::Model m = load(write_typed_model(dir));
  auto m64 = train::to_float64(m);
  INFO((m64 ? "" : m64.error().str()));
  REQUIRE(m64);
  std::vector<std::string> left;
  narrow_types(m64->proto->graph(), left);
  CHECK(left.empty());
  for (const auto& s : left) WARN(s);
  // The original is untouched (the proto is shared and immutable).
  std::vector<std::string> before;
  narrow_types(m.proto->graph(), before);
  CHECK(before.size() > 5);

  const exec::HostTensor x = f32("x", {6, 3}, 5);
  const auto y32 = run(m, {x});
  const auto y64 = run(*m64, {to_f64(x)});
  REQUIRE(y64[0].dtype == HP_F64);
  REQUIRE(y64[0].numel() == 24);
  double worst = 0, diff_sum = 0;
  for (std::int64_t i = 0; i < 24; ++i) {
    const double a = y32[0].as<float>()[i], d = y64[0].as<double>()[i];
    worst = std::max(worst, std::abs(a - d) / std::max(1e-30, std::abs(d)));
    diff_sum += std::abs(a - d);
  }
  CHECK(worst < 1e-5);  // the same function
  CHECK(diff_sum > 0);  // but not computed in float32
  // Rows of a softmax sum to one in double precision.
  for (int r = 0; r < 6; ++r) {
    double s = 0;
    for (int c = 0; c < 4; ++c) s += y64[0].as<double>()[r * 4 + c];
    CHECK(std::abs(s - 1) < 1e-14);
  }
  fs::remove_all(dir);
}

TEST_CASE("the cpu backend's float64 MatMul, Gemm, LayerNormalization and Conv match float32") {
  // Every layout the float32 paths take: MatMul with a broadcast batch, a folded batch and a
  // vector operand; Gemm with both transposes, alpha, beta and a row bias; LayerNormalization over
  // two axes; Conv with groups, strides, dilations, pads and a bias.
  Builder b;
  b.input("a", {2, 1, 3, 4});
  b.input("img", {1, 4, 7, 6});
  for (const char* o : {"mm_bcast", "mm_fold", "mm_vec", "gemm", "ln", "conv"}) b.output(o, {});
  b.weight("B3", {3, 4, 5});
  b.weight("B2", {4, 5});
  b.weight("v", {4});
  b.node("MatMul", {"a", "B3"}, {"mm_bcast"});  // [2,3,3,5]: batch [2,1] x [3]
  b.node("MatMul", {"a", "B2"}, {"mm_fold"});
  b.node("MatMul", {"a", "v"}, {"mm_vec"});
  b.ints("shape2", {6, 4});
  b.node("Reshape", {"a"}, {"a2"});
  b.g().mutable_node(b.g().node_size() - 1)->add_input("shape2");
  b.weight("Gb", {5, 6});
  b.weight("Gc", {1, 5});
  auto* gemm = b.node("Gemm", {"a2", "Gb", "Gc"}, {"gemm"});  // a2^T [4,6] x Gb^T [6,5]
  Builder::attr_i(gemm, "transA", 1);
  Builder::attr_i(gemm, "transB", 1);
  for (auto [name, v] : {std::pair{"alpha", 0.7f}, std::pair{"beta", -1.3f}}) {
    auto* a = gemm->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::FLOAT);
    a->set_f(v);
  }
  b.weight("ln_s", {3, 4});
  b.weight("ln_b", {3, 4});
  Builder::attr_i(b.node("LayerNormalization", {"a", "ln_s", "ln_b"}, {"ln"}), "axis", -2);
  b.weight("cw", {6, 2, 3, 2});
  b.weight("cb", {6});
  auto* conv = b.node("Conv", {"img", "cw", "cb"}, {"conv"});
  Builder::attr_i(conv, "group", 2);
  for (auto [name, v] : {std::pair{"strides", std::vector<std::int64_t>{2, 1}},
                         std::pair{"dilations", std::vector<std::int64_t>{1, 2}},
                         std::pair{"pads", std::vector<std::int64_t>{1, 0, 2, 1}}}) {
    auto* a = conv->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (auto x : v) a->add_ints(x);
  }
  const fs::path dir = temp_dir("nn64");
  const model::Model m = load(b.save(dir, "nn.onnx"));
  auto m64 = train::to_float64(m);
  REQUIRE(m64);
  const exec::HostTensor a = f32("a", {2, 1, 3, 4}, 3), img = f32("img", {1, 4, 7, 6}, 4);
  const auto y32 = run(m, {a, img});
  const auto y64 = run(*m64, {to_f64(a), to_f64(img)});
  const std::vector<std::vector<std::int64_t>> dims = {{2, 3, 3, 5}, {2, 1, 3, 5}, {2, 1, 3},
                                                       {4, 5},       {2, 1, 3, 4}, {1, 6, 4, 5}};
  REQUIRE(y64.size() == dims.size());
  for (std::size_t k = 0; k < dims.size(); ++k) {
    INFO("output " << k);
    REQUIRE(y64[k].dtype == HP_F64);
    CHECK(y64[k].dims == dims[k]);
    REQUIRE(y64[k].numel() == y32[k].numel());
    double worst = 0;
    for (std::int64_t i = 0; i < y64[k].numel(); ++i)
      worst = std::max(worst, std::abs(y32[k].as<float>()[i] - y64[k].as<double>()[i]) /
                                  (1 + std::abs(y64[k].as<double>()[i])));
    CHECK(worst < 1e-5);
  }
  fs::remove_all(dir);
}

TEST_CASE("to_float64 refuses float data it cannot read") {
  const fs::path dir = temp_dir("bad");
  const model::Model good = load(write_typed_model(dir));
  SECTION("typed values that do not match the dims") {
    auto p = std::make_shared<onnx::ModelProto>(*good.proto);
    p->mutable_graph()->mutable_initializer(1)->add_float_data(1.f);  // b1: 6 values for [5]
    model::Model m = good;
    m.proto = p;
    auto r = train::to_float64(m);
    REQUIRE(!r);
    CHECK(r.error().code == Errc::bad_input);
    CHECK(r.error().where() == "b1");
  }
  SECTION("raw data of the wrong length") {
    auto p = std::make_shared<onnx::ModelProto>(*good.proto);
    p->mutable_graph()->mutable_initializer(0)->mutable_raw_data()->resize(7);
    model::Model m = good;
    m.proto = p;
    auto r = train::to_float64(m);
    REQUIRE(!r);
    CHECK(r.error().code == Errc::bad_input);
    CHECK(r.error().message().find("W1") != std::string::npos);
  }
  SECTION("external data whose file is missing") {
    auto p = std::make_shared<onnx::ModelProto>(*good.proto);
    auto* t = p->mutable_graph()->mutable_initializer(0);
    t->clear_raw_data();
    t->set_data_location(TensorProto::EXTERNAL);
    auto* kv = t->add_external_data();
    kv->set_key("location");
    kv->set_value("nowhere.bin");
    model::Model m = good;
    m.proto = p;
    auto r = train::to_float64(m);
    REQUIRE(!r);
    CHECK(r.error().code == Errc::bad_input);
    CHECK(r.error().message().find("nowhere.bin") != std::string::npos);
  }
  SECTION("a Constant's tensor with too few values") {
    auto p = std::make_shared<onnx::ModelProto>(*good.proto);
    for (auto& n : *p->mutable_graph()->mutable_node())
      if (n.op_type() == "ConstantOfShape") n.mutable_attribute(0)->mutable_t()->add_dims(3);
    model::Model m = good;
    m.proto = p;
    auto r = train::to_float64(m);
    REQUIRE(!r);
    CHECK(r.error().code == Errc::bad_input);
    CHECK(r.error().where().find("ConstantOfShape") != std::string::npos);
  }
  fs::remove_all(dir);
}

namespace {

/// logits = (Tanh(LayerNorm(Relu(x W1 + b1))) W2 + b2), x: [batch, 3]; W2 also read by a second
/// MatMul (tied) when `tied`.
fs::path write_mlp(const fs::path& dir, bool tied = false) {
  Builder b;
  b.input("x", {-1, 3});
  b.output("logits", {-1, 4});
  b.weight("W1", {3, 6});
  b.weight("b1", {6}, 0.1);
  b.weight("gamma", {6}, 0.3);
  b.weight("beta", {6}, 0.1);
  b.weight("W2", {6, 4});
  b.weight("b2", {4}, 0.1);
  b.node("MatMul", {"x", "W1"}, {"xw"});
  b.node("Add", {"xw", "b1"}, {"h"});
  b.node("Relu", {"h"}, {"r"});
  Builder::attr_i(b.node("LayerNormalization", {"r", "gamma", "beta"}, {"n"}), "axis", -1);
  b.node("Tanh", {"n"}, {"t"});
  b.node("MatMul", {"t", "W2"}, {"z"});
  if (tied) {
    b.node("Transpose", {"W2"}, {"W2t"});
    b.node("MatMul", {"z", "W2t"}, {"back"});  // [batch, 6]
    b.node("MatMul", {"back", "W2"}, {"z2"});
    b.node("Add", {"z2", "b2"}, {"logits"});
  } else {
    b.node("Add", {"z", "b2"}, {"logits"});
  }
  return b.save(dir, tied ? "mlp_tied.onnx" : "mlp.onnx");
}

/// logits = Flatten(BatchNormalization(x Wl)) W2, x: [batch, 3, 4], the channel axis 1; the
/// running statistics `mean` and `var` (positive) are initializers. Training mode normalises with
/// the batch's statistics (whose gradient reaches x), inference mode with the running ones.
fs::path write_batch_norm(const fs::path& dir, bool training) {
  Builder b;
  b.input("x", {-1, 3, 4});
  b.output("logits", {-1, 5});
  b.weight("Wl", {4, 4});
  b.weight("gamma", {3}, 0.3);
  b.weight("beta", {3}, 0.1);
  b.weight("mean", {3}, 0.3);
  b.weight("var", {3});
  for (float& v : *b.g().mutable_initializer(b.g().initializer_size() - 1)->mutable_float_data())
    v = std::abs(v) + 0.5f;
  b.weight("W2", {12, 5});
  b.ints("flat", {-1, 12});
  b.node("MatMul", {"x", "Wl"}, {"h"});
  std::vector<std::string> outs = {"n"};
  if (training) outs = {"n", "new_mean", "new_var"};
  Builder::attr_i(b.node("BatchNormalization", {"h", "gamma", "beta", "mean", "var"}, outs),
                  "training_mode", training ? 1 : 0);
  b.node("Reshape", {"n", "flat"}, {"f"});
  b.node("MatMul", {"f", "W2"}, {"logits"});
  return b.save(dir, training ? "bn_train.onnx" : "bn_eval.onnx");
}

train::GradCheckOptions options(const fs::path& model) {
  train::GradCheckOptions o;
  o.model = model;
  o.grad.logits = "logits";
  o.threads = 1;
  return o;
}

}  // namespace

TEST_CASE("check_gradients passes on small models") {
  const fs::path dir = temp_dir("pass");
  SECTION("cross entropy, generated inputs") {
    auto o = options(write_mlp(dir));
    o.directions = 4;
    auto r = train::check_gradients(o);
    INFO((r ? r->text() : r.error().str()));
    REQUIRE(r);
    CHECK(r->ok());
    CHECK(r->directions.size() == 4);
    CHECK(r->worst() < 1e-7);
    CHECK(r->generated_inputs);
    CHECK(r->params.size() == 6);
    CHECK(r->parameters == 3 * 6 + 6 + 6 + 6 + 6 * 4 + 4);
    CHECK(std::isfinite(r->loss));
    CHECK(r->loss > 0);
    for (const auto& d : r->directions) CHECK(std::abs(d.analytic) > 1e-6);
    CHECK(r->floor ==
          Approx(r->grad_norm / std::sqrt(static_cast<double>(r->parameters)) / 10).epsilon(1e-12));
    CHECK(r->step >= 3e-6);  // eps * max(1, |theta|)
    CHECK(r->text().find("gradients match") != std::string::npos);
    CHECK(r->json().find("\"ok\":true") != std::string::npos);
  }
  SECTION("mse, frozen tensors and tied weights reported") {
    auto o = options(write_mlp(dir, true));
    o.grad.loss = train::LossKind::mse;
    o.grad.frozen = {"beta", "gam*"};
    auto r = train::check_gradients(o);
    INFO((r ? r->text() : r.error().str()));
    REQUIRE(r);
    CHECK(r->ok());
    CHECK(r->untrained.count("beta") == 1);
    CHECK(r->untrained.count("gamma") == 1);
    CHECK(r->tied.count("W2") == 1);
    CHECK(r->params.size() == 4);
  }
  SECTION("batch normalization in training and in inference mode") {
    for (bool training : {true, false}) {
      INFO((training ? "training mode" : "inference mode"));
      auto o = options(write_batch_norm(dir, training));
      o.directions = 4;
      auto r = train::check_gradients(o);
      INFO((r ? r->text() : r.error().str()));
      REQUIRE(r);
      CHECK(r->ok());
      CHECK(r->worst() < 1e-6);
      CHECK(r->params == std::vector<std::string>{"Wl", "gamma", "beta", "W2"});
      // The running statistics are buffers, never trained, and hp says why.
      for (const char* stat : {"mean", "var"}) {
        REQUIRE(r->untrained.count(stat) == 1);
        CHECK(r->untrained.at(stat).find("BatchNormalization running statistic") !=
              std::string::npos);
      }
    }
  }
  SECTION("the same seed gives the same numbers, another seed others") {
    auto o = options(write_mlp(dir));
    auto r1 = train::check_gradients(o);
    auto r2 = train::check_gradients(o);
    o.seed = 2;
    auto r3 = train::check_gradients(o);
    REQUIRE((r1 && r2 && r3));
    CHECK(r1->directions[0].analytic == r2->directions[0].analytic);
    CHECK(r1->loss == r2->loss);
    CHECK(r1->loss != r3->loss);
  }
  SECTION("inputs from a directory: the data only, then with the labels") {
    const fs::path in = dir / "inputs";
    fs::create_directories(in);
    REQUIRE(exec::write_tensor_file(in / "input_0.pb", f32("x", {3, 3}, 9)));
    auto o = options(write_mlp(dir));
    o.inputs = in;
    auto r = train::check_gradients(o);
    INFO((r ? r->text() : r.error().str()));
    REQUIRE(r);
    CHECK(r->ok());
    CHECK(r->generated_inputs);  // the labels were
    exec::HostTensor labels;
    labels.name = "labels";
    labels.dtype = HP_I64;
    labels.dims = {3};
    labels.data.resize(24);
    for (int i = 0; i < 3; ++i) labels.as<std::int64_t>()[i] = i;
    REQUIRE(exec::write_tensor_file(in / "input_1.pb", labels));
    auto r2 = train::check_gradients(o);
    INFO((r2 ? r2->text() : r2.error().str()));
    REQUIRE(r2);
    CHECK(r2->ok());
    CHECK(!r2->generated_inputs);
    labels.as<std::int64_t>()[0] = 7;  // out of [0, 4): the loss kernel refuses it
    REQUIRE(exec::write_tensor_file(in / "input_1.pb", labels));
    CHECK(!train::check_gradients(o));
  }
  fs::remove_all(dir);
}

TEST_CASE("check_gradients fails on a wrong gradient") {
  // The gradient model of the MLP with one gradient output scaled by 1 + 1e-4, as a wrong rule
  // would: the directional derivatives move by up to 1e-4 relative, far beyond the tolerance.
  const fs::path dir = temp_dir("wrong");
  const fs::path path = write_mlp(dir);
  const model::Model fwd = load(path);
  auto o = options(path);
  auto gg = train::build_grad_graph(fwd, o.grad);
  REQUIRE(gg);
  auto right = train::check_grad_graph(fwd, *gg, o);
  REQUIRE(right);
  CHECK(right->ok());

  auto p = std::make_shared<onnx::ModelProto>(*gg->model.proto);
  const std::string target = gg->grads[0];  // W1's gradient
  for (auto& n : *p->mutable_graph()->mutable_node())
    for (auto& out : *n.mutable_output())
      if (out == target) out = target + "/right";
  auto* k = p->mutable_graph()->add_initializer();
  k->set_name("wrong_scale");
  k->set_data_type(TensorProto::FLOAT);
  k->add_float_data(1.0001f);
  auto* mul = p->mutable_graph()->add_node();
  mul->set_op_type("Mul");
  mul->add_input(target + "/right");
  mul->add_input("wrong_scale");
  mul->add_output(target);
  train::GradGraph wrong = *gg;
  wrong.model.proto = p;
  auto r = train::check_grad_graph(fwd, wrong, o);
  INFO((r ? r->text() : r.error().str()));
  REQUIRE(r);
  CHECK(!r->ok());
  CHECK(r->worst() > 1e-6);
  CHECK(r->worst() < 2e-4);
  CHECK(r->mismatch().code == Errc::mismatch);
  CHECK(r->text().find("MISMATCH") != std::string::npos);
  CHECK(r->json().find("\"ok\":false") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("check_gradients refuses what it cannot check") {
  const fs::path dir = temp_dir("refuse");
  SECTION("a missing model") {
    auto r = train::check_gradients(options(dir / "missing.onnx"));
    REQUIRE(!r);
    CHECK(r.error().code == Errc::bad_input);
  }
  SECTION("an op without a gradient rule on the trainable path, named") {
    Builder b;
    b.input("x", {2, 3});
    b.output("logits", {2, 3});
    b.weight("W", {3, 3});
    b.node("MatMul", {"x", "W"}, {"z"});
    b.node("Hardmax", {"z"}, {"logits"});
    auto r = train::check_gradients(options(b.save(dir, "hardmax.onnx")));
    REQUIRE(!r);
    CHECK(r.error().code == Errc::bad_input);
    CHECK(r.error().where().find("Hardmax") != std::string::npos);
  }
  SECTION("an integer input that is not a token id") {
    Builder b;
    b.input("x", {2, 3});
    b.input("n", {2, 1}, TensorProto::INT64);
    b.output("logits", {2, 3});
    b.weight("W", {3, 3});
    b.node("MatMul", {"x", "W"}, {"z"});
    Builder::attr_i(b.node("Cast", {"n"}, {"nf"}), "to", TensorProto::FLOAT);
    b.node("Add", {"z", "nf"}, {"logits"});
    auto r = train::check_gradients(options(b.save(dir, "ints.onnx")));
    REQUIRE(!r);
    CHECK(r.error().code == Errc::bad_input);
    CHECK(r.error().where() == "n");
    CHECK(r.error().what.hint.find("--inputs") != std::string::npos);
  }
  SECTION("token ids are drawn inside the embedding table") {
    Builder b;
    b.input("ids", {-1, 4}, TensorProto::INT64);
    b.output("logits", {-1, 4, 5});
    b.weight("emb", {7, 3});
    b.weight("W", {3, 5});
    b.node("Identity", {"emb"}, {"emb_alias"});
    b.node("Gather", {"emb_alias", "ids"}, {"e"});
    b.node("MatMul", {"e", "W"}, {"logits"});
    auto r = train::check_gradients(options(b.save(dir, "tokens.onnx")));
    INFO((r ? r->text() : r.error().str()));
    REQUIRE(r);  // an id outside [0, 7) would fail the Gather
    CHECK(r->ok());
  }
  SECTION("nothing to train") {
    auto o = options(write_mlp(dir));
    o.grad.frozen = {"*"};
    auto r = train::check_gradients(o);
    REQUIRE(!r);
    CHECK(r.error().code == Errc::bad_input);
  }
  SECTION("no direction") {
    auto o = options(write_mlp(dir));
    o.directions = 0;
    auto r = train::check_gradients(o);
    REQUIRE(!r);
    CHECK(r.error().code == Errc::usage);
  }
  fs::remove_all(dir);
}

#ifdef HP_SYSTEM_PYTHON3
namespace {

/// Runs `script` with Debian's python3; false (and a warning) when torch is not there.
bool python(const fs::path& dir, const std::string& script) {
  const fs::path py = dir / "export.py";
  std::ofstream(py) << script;
  const std::string cmd = std::string(HP_SYSTEM_PYTHON3) + " " + py.string() + " " + dir.string() +
                          " > " + (dir / "py.log").string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  if (rc == 0) return true;
  std::ifstream log(dir / "py.log");
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  if (text.find("ModuleNotFoundError") != std::string::npos) {
    WARN("torch or onnx missing, not checked: " + text);
    return false;
  }
  FAIL("export failed: " + text);
  return false;
}

// A transformer block as PyTorch users write it (LayerNorm, attention with a causal softmax, GELU
// MLP), exported at float32 with torch's default constant folding; torch's float64 outputs of the
// same weights and input are the reference.
const char* kExport = R"PY(
import math, sys, os
import torch, torch.nn as nn, torch.nn.functional as F
import onnx
from onnx import numpy_helper
out = sys.argv[1]
class Block(nn.Module):
    def __init__(self, d=16, h=2):
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.head = nn.Linear(d, 10)
    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = [z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in (q, k, v)]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.h)
        att = att.masked_fill(~torch.tril(torch.ones(t, t, dtype=torch.bool)), float("-inf"))
        x = x + self.proj((att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, c))
        x = x + self.out(F.gelu(self.fc(self.ln2(x))))
        return self.head(x)
torch.manual_seed(0)
m = Block().eval()
x = torch.randn(2, 5, 16)
torch.onnx.export(m, (x,), os.path.join(out, "block.onnx"), input_names=["x"],
                  output_names=["logits"], opset_version=17)
with torch.no_grad():
    y = m.double()(x.double())
onnx.save_tensor(numpy_helper.from_array(x.numpy(), "x"), os.path.join(out, "input_0.pb"))
onnx.save_tensor(numpy_helper.from_array(y.numpy(), "logits"), os.path.join(out, "output_0.pb"))
)PY";

}  // namespace

TEST_CASE("to_float64 and check_gradients on a PyTorch export") {
  const fs::path dir = temp_dir("torch");
  if (!python(dir, kExport)) return;
  const model::Model m = load(dir / "block.onnx");
  auto m64 = train::to_float64(m);
  REQUIRE(m64);
  std::vector<std::string> left;
  narrow_types(m64->proto->graph(), left);
  CHECK(left.empty());
  auto x = exec::read_tensor_file(dir / "input_0.pb");
  auto want = exec::read_tensor_file(dir / "output_0.pb");
  REQUIRE((x && want));
  const auto y = run(*m64, {to_f64(*x)});
  REQUIRE(y[0].dtype == HP_F64);
  REQUIRE(y[0].numel() == want->numel());
  // torch computes in double from the same float32 weights; the export's constants (1/sqrt(d),
  // GELU's sqrt(2), the LayerNorm epsilon) are float32 numbers, which moves the result by about
  // 1e-8 relative. float32 arithmetic would be off by 1e-6 and more.
  double worst = 0;
  for (std::int64_t i = 0; i < y[0].numel(); ++i)
    worst = std::max(worst, std::abs(y[0].as<double>()[i] - want->as<double>()[i]));
  CHECK(worst < 1e-7);

  auto o = options(dir / "block.onnx");
  auto r = train::check_gradients(o);
  INFO((r ? r->text() : r.error().str()));
  REQUIRE(r);
  CHECK(r->ok());
  CHECK(r->worst() < 1e-7);
  fs::remove_all(dir);
}
#endif

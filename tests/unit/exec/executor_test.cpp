// Executor unit tests on graphs built here with the onnx protobuf API: tensor files (round trip and
// malformed files), input binding errors, a small MLP against hand-computed values, lifetime
// planning (peak memory), the up-front list of unsupported ops, missing external data, the CommOps
// seam, constant and shape-only nodes cached across runs, and the fusion of the exported GELU
// chain.
#include <catch2/catch.hpp>

#include <onnx/onnx_pb.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "hp/comm/comm.h"
#include "hp/exec/backends.h"
#include "hp/exec/compare.h"
#include "hp/exec/executor.h"
#include "hp/exec/tensor.h"
#include "hp_model.h"

namespace fs = std::filesystem;
using namespace hp;
using namespace hp::exec;
using namespace hp::comm;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d =
      fs::temp_directory_path() / ("hp_runtime_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

HostTensor f32(std::vector<std::int64_t> dims, std::vector<float> v, std::string name = "") {
  HostTensor t;
  t.name = std::move(name);
  t.dtype = HP_F32;
  t.dims = std::move(dims);
  t.data.resize(v.size() * 4);
  std::memcpy(t.data.data(), v.data(), t.data.size());
  return t;
}

void add_value(google::protobuf::RepeatedPtrField<onnx::ValueInfoProto>* list,
               const std::string& name, std::vector<std::int64_t> dims,
               int type = onnx::TensorProto::FLOAT) {
  auto* v = list->Add();
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

onnx::NodeProto* add_node(onnx::GraphProto* g, const std::string& op, std::vector<std::string> in,
                          std::vector<std::string> out, const std::string& name,
                          const std::string& domain = "") {
  auto* n = g->add_node();
  n->set_op_type(op);
  n->set_name(name);
  n->set_domain(domain);
  for (auto& s : in) n->add_input(s);
  for (auto& s : out) n->add_output(s);
  return n;
}

/// y = Relu(x @ W + b), x: [batch, 2], W: [2, 3] (W optionally external).
fs::path write_mlp(const fs::path& dir, bool external_w = false) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  g->set_name("mlp");
  add_value(g->mutable_input(), "x", {-1, 2});
  add_value(g->mutable_output(), "y", {-1, 3});
  auto* w = g->add_initializer();
  w->set_name("W");
  w->set_data_type(onnx::TensorProto::FLOAT);
  w->add_dims(2);
  w->add_dims(3);
  std::vector<float> wv = {1, 2, 3, -1, -2, -3};
  if (external_w) {
    w->set_data_location(onnx::TensorProto::EXTERNAL);
    auto* kv = w->add_external_data();
    kv->set_key("location");
    kv->set_value("mlp.weights");
  } else {
    for (float f : wv) w->add_float_data(f);
  }
  auto* b = g->add_initializer();
  b->set_name("b");
  b->set_data_type(onnx::TensorProto::FLOAT);
  b->add_dims(3);
  for (float f : {0.5f, -10.f, 0.f}) b->add_float_data(f);
  add_node(g, "MatMul", {"x", "W"}, {"xw"}, "mm");
  add_node(g, "Add", {"xw", "b"}, {"h"}, "bias");
  add_node(g, "Relu", {"h"}, {"y"}, "act");
  fs::path p = dir / "mlp.onnx";
  std::ofstream(p, std::ios::binary) << m.SerializeAsString();
  return p;
}

Backends cpu() {
  auto b = open_backends("cpu", 1, {});
  REQUIRE(b.ok());
  return *b;
}

model::Model load(const fs::path& p) {
  model::LoadOptions lo;
  lo.mode = model::LoadMode::shapes_only;
  auto m = model::load_model(p, lo);
  INFO((m.ok() ? std::string() : m.error().message()));
  REQUIRE(m.ok());
  return *m;
}

}  // namespace

TEST_CASE("tensor files round-trip and malformed ones are named", "[exec]") {
  fs::path d = temp_dir("io");
  HostTensor t = f32({2, 2}, {1, 2, 3, 4}, "x");
  REQUIRE(write_tensor_file(d / "input_0.pb", t).ok());
  auto back = read_tensor_file(d / "input_0.pb");
  REQUIRE(back.ok());
  CHECK(back->dims == t.dims);
  CHECK(back->data == t.data);
  CHECK(back->name == "x");

  std::ofstream(d / "bad.pb") << "\x08\x01\x12garbage";
  auto bad = read_tensor_file(d / "bad.pb");
  REQUIRE(!bad.ok());
  CHECK(bad.error().code == Errc::bad_input);
  CHECK(bad.error().where() == (d / "bad.pb").string());

  auto missing = read_tensor_file(d / "nope.pb");
  REQUIRE(!missing.ok());
  CHECK(missing.error().code == Errc::bad_input);

  REQUIRE(write_tensor_dir(d / "out", {t, t}).ok());
  CHECK(fs::exists(d / "out" / "output_1.pb"));
  auto all = read_tensor_dir(d / "out", "output");
  REQUIRE(all.ok());
  CHECK(all->size() == 2);
  fs::remove_all(d);
}

TEST_CASE("typed fields of the narrow and unsigned types decode, and short ones are named",
          "[exec]") {
  fs::path d = temp_dir("typed");
  auto write = [&](const onnx::TensorProto& p) {
    std::ofstream(d / "t.pb", std::ios::binary) << p.SerializeAsString();
    return read_tensor_file(d / "t.pb");
  };
  onnx::TensorProto p;
  p.add_dims(2);
  p.set_data_type(onnx::TensorProto::UINT64);
  p.add_uint64_data(7);
  p.add_uint64_data(std::uint64_t{1} << 40);
  auto u = write(p);
  REQUIRE(u.ok());
  CHECK(u->dtype == HP_U64);
  CHECK(u->as<std::uint64_t>()[1] == (std::uint64_t{1} << 40));
  p.clear_uint64_data();
  p.add_uint64_data(7);  // one value for dims [2]
  auto short_u = write(p);
  REQUIRE(!short_u.ok());
  CHECK(short_u.error().code == Errc::bad_input);
  CHECK(short_u.error().message().find("holds 1 values") != std::string::npos);

  onnx::TensorProto h;  // float16 bits travel in int32_data: 0x3C00 is 1.0, 0xC000 is -2.0
  h.add_dims(2);
  h.set_data_type(onnx::TensorProto::FLOAT16);
  h.add_int32_data(0x3C00);
  h.add_int32_data(0xC000);
  auto half = write(h);
  REQUIRE(half.ok());
  CHECK(half->dtype == HP_F16);
  CHECK(half->as<std::uint16_t>()[1] == 0xC000);
  HostTensor want = *half;
  want.as<std::uint16_t>()[1] = 0xC001;  // -2.002: inside rtol 1e-3 of -2, outside 1e-4
  CHECK(compare_tensors(*half, want, 1e-3, 0).ok());
  CHECK_FALSE(compare_tensors(*half, want, 1e-4, 0).ok());

  onnx::TensorProto i8;
  i8.add_dims(1);
  i8.set_data_type(onnx::TensorProto::INT8);
  i8.add_int32_data(-5);
  auto small = write(i8);
  REQUIRE(small.ok());
  CHECK(small->as<std::int8_t>()[0] == -5);
  fs::remove_all(d);
}

TEST_CASE("an output's summary: range, NaNs apart, first values; short data header only",
          "[exec]") {
  HostTensor t;
  t.name = "y";
  t.dtype = HP_F32;
  t.dims = {2, 4};
  const float v[] = {1, -2, NAN, 4, 5, 6, 7, 8};
  t.data.assign(reinterpret_cast<const unsigned char*>(v),
                reinterpret_cast<const unsigned char*>(v) + sizeof v);
  TensorSummary s = summarize_tensor(t, 3);
  CHECK(s.counted == 7);
  CHECK(s.nans == 1);
  CHECK(s.min == -2);
  CHECK(s.max == 8);
  CHECK(s.mean == Approx(29.0 / 7));
  REQUIRE(s.first.size() == 3);
  CHECK(std::isnan(s.first[2]));
  CHECK(format_summary(s) == "y f32 [2,4]: min -2 max 8 mean 4.14286, 1 NaN [1, -2, nan, ...]");
  // Integers are summarised as their values; a tensor whose bytes do not cover its dims (a
  // malformed file) by its header only, never read past its data.
  HostTensor i;
  i.dtype = HP_I64;
  i.dims = {2};
  const std::int64_t iv[] = {-3, 9};
  i.data.assign(reinterpret_cast<const unsigned char*>(iv),
                reinterpret_cast<const unsigned char*>(iv) + sizeof iv);
  CHECK(format_summary(summarize_tensor(i)) == "(unnamed) i64 [2]: min -3 max 9 mean 3 [-3, 9]");
  i.data.resize(8);
  CHECK(format_summary(summarize_tensor(i)) == "(unnamed) i64 [2]");
}

TEST_CASE("input binding reports wrong dtype, shape, names and missing files", "[exec]") {
  std::vector<GraphIO> ins(1);
  ins[0].name = "x";
  ins[0].dtype = HP_F32;
  ins[0].has_shape = true;
  ins[0].dims = {-1, 2};
  CHECK(bind_inputs(ins, {f32({5, 2}, std::vector<float>(10, 0))}, "d").ok());
  auto shape = bind_inputs(ins, {f32({5, 3}, std::vector<float>(15, 0))}, "d");
  REQUIRE(!shape.ok());
  CHECK(shape.error().where() == "d/input_0.pb");
  CHECK(shape.error().message().find("shape [?,2]") != std::string::npos);
  HostTensor i64;
  i64.dtype = HP_I64;
  i64.dims = {1, 2};
  i64.data.resize(16);
  auto dtype = bind_inputs(ins, {i64}, "d");
  REQUIRE(!dtype.ok());
  CHECK(dtype.error().message().find("must be f32") != std::string::npos);
  auto name = bind_inputs(ins, {f32({1, 2}, {0, 0}), f32({1, 2}, {0, 0}, "zz")}, "d");
  REQUIRE(!name.ok());
  CHECK(name.error().message().find("'zz'") != std::string::npos);
  auto none = bind_inputs(ins, {}, "d");
  REQUIRE(!none.ok());
  CHECK(none.error().message().find("missing") != std::string::npos);
}

TEST_CASE("an mlp runs node by node and matches hand-computed values", "[exec]") {
  fs::path d = temp_dir("mlp");
  auto m = load(write_mlp(d));
  Backends b = cpu();
  auto ex = Executor::create(m, {b.primary, b.cpu, nullptr});
  REQUIRE(ex.ok());
  auto out = (*ex)->run({f32({2, 2}, {1, 1, 2, 0})});
  REQUIRE(out.ok());
  REQUIRE(out->size() == 1);
  const HostTensor& y = (*out)[0];
  CHECK(y.dims == std::vector<std::int64_t>{2, 3});
  // x @ W = [[0,0,0],[2,4,6]]; + b = [[0.5,-10,0],[2.5,-6,6]]; relu.
  std::vector<float> want = {0.5f, 0, 0, 2.5f, 0, 6};
  for (int i = 0; i < 6; ++i) CHECK(y.as<float>()[i] == Approx(want[static_cast<std::size_t>(i)]));
  CHECK((*ex)->stats().nodes == 3);
  CHECK((*ex)->stats().peak_bytes > 0);
  // Freed buffers are reused: a second run peaks no higher.
  const auto peak = (*ex)->stats().peak_bytes;
  REQUIRE((*ex)->run({f32({2, 2}, {1, 1, 2, 0})}).ok());
  CHECK((*ex)->stats().peak_bytes == peak);
  fs::remove_all(d);
}

TEST_CASE("the output hook sees each output once, as run() returns it", "[exec]") {
  fs::path d = temp_dir("hook");
  auto m = load(write_mlp(d));
  Backends b = cpu();
  auto ex = Executor::create(m, {b.primary, b.cpu, nullptr});
  REQUIRE(ex.ok());
  std::vector<std::pair<std::size_t, HostTensor>> seen;
  (*ex)->set_output_hook([&](std::size_t k, const HostTensor& t) { seen.emplace_back(k, t); });
  auto out = (*ex)->run({f32({2, 2}, {1, 1, 2, 0})});
  REQUIRE(out.ok());
  REQUIRE(seen.size() == 1);
  CHECK(seen[0].first == 0);
  CHECK(seen[0].second.dims == (*out)[0].dims);
  CHECK(seen[0].second.data == (*out)[0].data);
  CHECK(seen[0].second.name == (*out)[0].name);
  // Every run hands them over again; without a hook nothing is called.
  REQUIRE((*ex)->run({f32({2, 2}, {1, 1, 2, 0})}).ok());
  CHECK(seen.size() == 2);
  (*ex)->set_output_hook({});
  auto again = (*ex)->run({f32({2, 2}, {1, 1, 2, 0})});
  REQUIRE(again.ok());
  CHECK(seen.size() == 2);
  CHECK((*again)[0].data == (*out)[0].data);
  fs::remove_all(d);
}

TEST_CASE("every unsupported op is listed with its node name before running", "[exec]") {
  fs::path d = temp_dir("unsupported");
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  add_value(g->mutable_input(), "x", {2});
  add_value(g->mutable_output(), "z", {2});
  add_node(g, "FancyOp", {"x"}, {"y"}, "first_bad");
  add_node(g, "Relu", {"y"}, {"y2"}, "fine");
  add_node(g, "OtherOp", {"y2"}, {"z"}, "second_bad");
  std::ofstream(d / "m.onnx", std::ios::binary) << m.SerializeAsString();
  Backends b = cpu();
  auto ex = Executor::create(load(d / "m.onnx"), {b.primary, b.cpu, nullptr});
  REQUIRE(!ex.ok());
  CHECK(ex.error().code == Errc::bad_input);
  auto all = ex.error().all();
  REQUIRE(all.size() == 2);
  CHECK(all[0].where == "node 'first_bad'");
  CHECK(all[1].where == "node 'second_bad'");
  fs::remove_all(d);
}

TEST_CASE("a weight whose external data file is missing fails before the run", "[exec]") {
  fs::path d = temp_dir("external");
  auto m = load(write_mlp(d, /*external_w=*/true));
  Backends b = cpu();
  auto ex = Executor::create(m, {b.primary, b.cpu, nullptr});
  REQUIRE(!ex.ok());
  CHECK(ex.error().code == Errc::bad_input);
  CHECK(ex.error().message().find("mlp.weights") != std::string::npos);
  fs::remove_all(d);
}

namespace {
/// Doubles its input: stands in for an all-reduce over two ranks holding the same values.
struct FakeComm : CommOps {
  int calls = 0;
  bool handles(const std::string& op) const override { return op == "AllReduce"; }
  Status run(const CommNode& node, const std::vector<const HostTensor*>& in,
             std::vector<HostTensor>& out) override {
    ++calls;
    CHECK(node.name == "ar");
    out[0] = *in[0];
    for (std::int64_t i = 0; i < out[0].numel(); ++i) out[0].as<float>()[i] *= 2;
    return {};
  }
};
}  // namespace

TEST_CASE("hp-domain communication nodes go through the CommOps seam", "[exec]") {
  fs::path d = temp_dir("comm");
  onnx::ModelProto m = hp_domain_model();
  auto* g = m.mutable_graph();
  add_value(g->mutable_input(), "x", {3});
  add_value(g->mutable_output(), "z", {3});
  add_node(g, "AllReduce", {"x"}, {"y"}, "ar", "hp");
  add_node(g, "Neg", {"y"}, {"z"}, "neg");
  std::ofstream(d / "m.onnx", std::ios::binary) << m.SerializeAsString();
  auto model = load(d / "m.onnx");
  Backends b = cpu();
  // Without a comm layer the node is reported as unsupported.
  auto none = Executor::create(model, {b.primary, b.cpu, nullptr});
  REQUIRE(!none.ok());
  CHECK(none.error().message().find("hp.AllReduce") != std::string::npos);
  FakeComm comm;
  auto ex = Executor::create(model, {b.primary, b.cpu, &comm});
  REQUIRE(ex.ok());
  auto out = (*ex)->run({f32({3}, {1, 2, 3})});
  REQUIRE(out.ok());
  CHECK(comm.calls == 1);
  CHECK((*out)[0].as<float>()[2] == -6.0f);
  fs::remove_all(d);
}

namespace {

// a -> AllReduce -> ya (a's last reader: donatable); b -> AllReduce -> yb, then zb = b + yb (b is
// read again: not donatable). Outputs ya, zb.
fs::path write_two_allreduces(const fs::path& dir) {
  onnx::ModelProto m = hp_domain_model();
  auto* g = m.mutable_graph();
  add_value(g->mutable_input(), "a", {3});
  add_value(g->mutable_input(), "b", {3});
  add_value(g->mutable_output(), "ya", {3});
  add_value(g->mutable_output(), "zb", {3});
  for (const char* x : {"a", "b"}) {
    auto* n = add_node(g, "AllReduce", {x}, {std::string("y") + x}, std::string("ar_") + x, "hp");
    auto* grp = n->add_attribute();
    grp->set_name("group");
    grp->set_type(onnx::AttributeProto::INTS);
    grp->add_ints(0);
    grp->add_ints(1);
  }
  add_node(g, "Add", {"b", "yb"}, {"zb"}, "add");
  fs::path p = dir / "m.onnx";
  std::ofstream(p, std::ios::binary) << m.SerializeAsString();
  return p;
}

/// Records which inputs the executor offers as donatable; outputs 2 * input, in place when donated.
struct DonationProbe : CommOps {
  std::map<std::string, bool> donatable;
  bool handles(const std::string& op) const override { return op == "AllReduce"; }
  Status run(const CommNode&, const std::vector<const HostTensor*>&,
             std::vector<HostTensor>&) override {
    return hp::Error(hp::Errc::internal, "the executor must call run_into");
  }
  Status run_into(const CommNode& node, const std::vector<CommTensor>& in,
                  const CommAlloc& alloc) override {
    const bool offered = in[0].donatable;
    donatable[node.name] = offered;
    auto y = alloc(0, in[0].dtype, in[0].dims, offered ? 0 : -1);
    if (!y) return std::move(y).error();
    CHECK((*y == in[0].data) == offered);  // donated memory is handed back, else fresh memory
    const auto* x = static_cast<const float*>(in[0].data);
    for (std::int64_t i = 0; i < in[0].numel(); ++i) static_cast<float*>(*y)[i] = 2 * x[i];
    return {};
  }
};

}  // namespace

TEST_CASE(
    "a comm node may take over an input buffer only where that input is read for the last time",
    "[exec]") {
  fs::path d = temp_dir("donate");
  auto model = load(write_two_allreduces(d));
  Backends b = cpu();
  DonationProbe probe;
  auto ex = Executor::create(model, {b.primary, b.cpu, &probe});
  REQUIRE(ex.ok());
  for (int run = 0; run < 2; ++run) {  // the second run works on buffers from the pool
    auto out = (*ex)->run({f32({3}, {1, 2, 3}), f32({3}, {10, 20, 30})});
    REQUIRE(out.ok());
    CHECK(probe.donatable["ar_a"]);
    CHECK_FALSE(probe.donatable["ar_b"]);
    CHECK((*out)[0].as<float>()[2] == 6.0f);
    CHECK((*out)[1].as<float>()[2] == 90.0f);  // b was not overwritten: 30 + 60
  }
  // The real comm layer over two in-process ranks: the AllReduce of `a` runs in place.
  std::vector<std::vector<float>> got(2);
  Status st = run_in_process(2, [&](int r, Transport& t) -> Status {
    TransportCommOps ops(t);
    auto e = Executor::create(model, {b.primary, b.cpu, &ops});
    if (!e) return std::move(e).error();
    for (int run = 0; run < 2; ++run) {
      const float k = static_cast<float>(r + 1);
      auto out = (*e)->run({f32({3}, {k, 2 * k, 3 * k}), f32({3}, {10 * k, 20 * k, 30 * k})});
      if (!out) return std::move(out).error();
      got[static_cast<std::size_t>(r)] = {(*out)[0].as<float>()[2], (*out)[1].as<float>()[2]};
    }
    return {};
  });
  REQUIRE(st.ok());
  CHECK(got[0] == std::vector<float>{9.0f, 30.0f + 90.0f});  // ya = 3 + 6; zb = b_0 + (30 + 60)
  CHECK(got[1] == std::vector<float>{9.0f, 60.0f + 90.0f});
  fs::remove_all(d);
}

namespace {

onnx::NodeProto* add_scalar_constant(onnx::GraphProto* g, const std::string& out, float v) {
  auto* n = add_node(g, "Constant", {}, {out}, out);
  auto* a = n->add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  a->mutable_t()->set_data_type(onnx::TensorProto::FLOAT);
  a->mutable_t()->add_float_data(v);
  return n;
}

fs::path write_model(const fs::path& dir, const onnx::ModelProto& m) {
  fs::path p = dir / "m.onnx";
  std::ofstream(p, std::ios::binary) << m.SerializeAsString();
  return p;
}

}  // namespace

TEST_CASE("constant and shape-only nodes run once and rerun when an input shape changes",
          "[exec]") {
  fs::path d = temp_dir("cached");
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  add_value(g->mutable_input(), "x", {-1, -1});
  add_value(g->mutable_output(), "y", {-1});
  add_value(g->mutable_output(), "s", {2}, onnx::TensorProto::INT64);
  // y = Reshape(x * (c + c), [-1]) where c is a Constant; s = Shape(x).
  add_scalar_constant(g, "c", 1.5f);
  add_node(g, "Add", {"c", "c"}, {"c2"}, "fold");  // constant input only: cached
  add_node(g, "Mul", {"x", "c2"}, {"xc"}, "scale");
  add_node(g, "Shape", {"x"}, {"s"}, "shape");  // cached while x keeps its dims
  auto* flat = g->add_initializer();
  flat->set_name("flat");
  flat->set_data_type(onnx::TensorProto::INT64);
  flat->add_dims(1);
  flat->add_int64_data(-1);
  add_node(g, "Reshape", {"xc", "flat"}, {"y"}, "reshape");
  auto mm = load(write_model(d, m));
  Backends b = cpu();
  auto ex = Executor::create(mm, {b.primary, b.cpu, nullptr});
  REQUIRE(ex.ok());
  auto check = [&](std::vector<std::int64_t> dims, std::vector<float> v) {
    auto out = (*ex)->run({f32(dims, v)});
    REQUIRE(out.ok());
    REQUIRE(out->size() == 2);
    REQUIRE((*out)[0].numel() == static_cast<std::int64_t>(v.size()));
    for (std::size_t i = 0; i < v.size(); ++i) CHECK((*out)[0].as<float>()[i] == Approx(3 * v[i]));
    CHECK((*out)[1].dims == std::vector<std::int64_t>{2});
    CHECK((*out)[1].as<std::int64_t>()[0] == dims[0]);
    CHECK((*out)[1].as<std::int64_t>()[1] == dims[1]);
  };
  check({2, 3}, {1, 2, 3, 4, 5, 6});
  CHECK((*ex)->stats().nodes_cached == 0);
  CHECK((*ex)->stats().nodes == 5);
  check({2, 3}, {6, 5, 4, 3, 2, 1});
  CHECK((*ex)->stats().nodes_cached == 3);  // Constant, the Add of constants, Shape
  CHECK((*ex)->stats().nodes == 2);
  check({3, 1}, {7, 8, 9});  // new dims: Shape reruns, the constants do not
  CHECK((*ex)->stats().nodes_cached == 2);
  CHECK((*ex)->stats().by_op.at("Shape").nodes == 1);
  CHECK((*ex)->stats().by_op.count("Constant") == 0);
  CHECK((*ex)->stats().peak_bytes > 0);
  fs::remove_all(d);
}

// PyTorch's export of the exact GELU: y = x * (erf(x / sqrt 2) + 1) * 0.5, five nodes over a
// length-n input; `erf_is_output` also exposes the Erf result as a second graph output.
onnx::ModelProto gelu_chain_model(std::int64_t n, bool erf_is_output) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  add_value(g->mutable_input(), "x", {n});
  add_value(g->mutable_output(), "y", {n});
  if (erf_is_output) add_value(g->mutable_output(), "e", {n});
  add_scalar_constant(g, "sqrt2", 1.4142135381698608f);
  add_scalar_constant(g, "one", 1.0f);
  add_scalar_constant(g, "half", 0.5f);
  add_node(g, "Div", {"x", "sqrt2"}, {"d"}, "div");
  add_node(g, "Erf", {"d"}, {"e"}, "erf");
  add_node(g, "Add", {"e", "one"}, {"a"}, "add");
  add_node(g, "Mul", {"x", "a"}, {"xm"}, "mul");
  add_node(g, "Mul", {"xm", "half"}, {"y"}, "mul_half");
  return m;
}

TEST_CASE("the exported exact GELU chain runs as one Gelu node with the same values", "[exec]") {
  fs::path d = temp_dir("gelu");
  auto mm = load(write_model(d, gelu_chain_model(4, false)));
  Backends b = cpu();
  auto ex = Executor::create(mm, {b.primary, b.cpu, nullptr});
  REQUIRE(ex.ok());
  const std::vector<float> xs = {-3.f, -0.5f, 0.25f, 2.f};
  auto out = (*ex)->run({f32({4}, xs)});
  REQUIRE(out.ok());
  for (std::size_t i = 0; i < xs.size(); ++i)
    CHECK((*out)[0].as<float>()[i] ==
          Approx(0.5 * xs[i] * (1 + std::erf(xs[i] / std::sqrt(2.0)))).margin(1e-6));
  const auto& by_op = (*ex)->stats().by_op;
  CHECK(by_op.count("Gelu") == 1);
  CHECK(by_op.count("Erf") == 0);
  CHECK(by_op.count("Div") == 0);
  fs::remove_all(d);
}

TEST_CASE("a GELU-like chain whose intermediate is also a graph output is not fused", "[exec]") {
  fs::path d = temp_dir("gelu_nofuse");
  auto mm = load(write_model(d, gelu_chain_model(2, true)));
  Backends b = cpu();
  auto ex = Executor::create(mm, {b.primary, b.cpu, nullptr});
  REQUIRE(ex.ok());
  auto out = (*ex)->run({f32({2}, {1.f, -1.f})});
  REQUIRE(out.ok());
  REQUIRE(out->size() == 2);
  CHECK((*out)[1].as<float>()[0] == Approx(std::erf(1 / std::sqrt(2.0))).margin(1e-6));
  CHECK((*ex)->stats().by_op.count("Erf") == 1);
  CHECK((*ex)->stats().by_op.count("Gelu") == 0);
  fs::remove_all(d);
}

namespace {

void add_f32_init(onnx::GraphProto* g, const std::string& name, std::vector<std::int64_t> dims,
                  const std::vector<float>& v) {
  auto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::FLOAT);
  for (auto d : dims) t->add_dims(d);
  for (float f : v) t->add_float_data(f);
}

/// A residual block as PyTorch exports a ResNet's (BatchNorm folded into the convs):
/// y = Relu(Conv2(Relu(Conv1(x) + b1)) + x), 2 channels, 3x3 kernels, pads 1, on 1 x 2 x 4 x 4.
/// `expose_c2` also makes Conv2's output a graph output; `z_first` writes the Add as Add(x, c2).
onnx::ModelProto residual_block_model(bool expose_c2, bool z_first) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  add_value(g->mutable_input(), "x", {1, 2, 4, 4});
  add_value(g->mutable_output(), "y", {1, 2, 4, 4});
  if (expose_c2) add_value(g->mutable_output(), "c2", {1, 2, 4, 4});
  std::vector<float> w1(36), w2(36);
  for (std::size_t i = 0; i < 36; ++i) {
    w1[i] = static_cast<float>(static_cast<int>(i * 7 % 11) - 5) / 8;
    w2[i] = static_cast<float>(static_cast<int>(i * 5 % 13) - 6) / 8;
  }
  add_f32_init(g, "w1", {2, 2, 3, 3}, w1);
  add_f32_init(g, "b1", {2}, {0.25f, -0.5f});
  add_f32_init(g, "w2", {2, 2, 3, 3}, w2);
  auto conv = [&](const std::string& in, const std::string& w, const std::string& out) {
    auto* n = add_node(g, "Conv", {in, w}, {out}, "conv_" + out);
    if (in == "x") n->add_input("b1");
    auto* p = n->add_attribute();
    p->set_name("pads");
    p->set_type(onnx::AttributeProto::INTS);
    for (int k = 0; k < 4; ++k) p->add_ints(1);
  };
  conv("x", "w1", "c1");
  add_node(g, "Relu", {"c1"}, {"r1"}, "relu1");
  conv("r1", "w2", "c2");
  add_node(g, "Add",
           z_first ? std::vector<std::string>{"x", "c2"} : std::vector<std::string>{"c2", "x"},
           {"a"}, "add");
  add_node(g, "Relu", {"a"}, {"y"}, "relu2");
  return m;
}

/// The block's output computed here, element by element.
std::vector<double> residual_block_ref(const onnx::ModelProto& m, const std::vector<float>& x) {
  auto init = [&](const std::string& name) {
    for (const auto& t : m.graph().initializer())
      if (t.name() == name)
        return std::vector<double>(t.float_data().begin(), t.float_data().end());
    return std::vector<double>{};
  };
  auto conv = [](const std::vector<double>& in, const std::vector<double>& w,
                 const std::vector<double>& b) {
    std::vector<double> out(32);
    for (int mo = 0; mo < 2; ++mo)
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) {
          double acc = b.empty() ? 0 : b[static_cast<std::size_t>(mo)];
          for (int c = 0; c < 2; ++c)
            for (int a = 0; a < 3; ++a)
              for (int e = 0; e < 3; ++e) {
                const int ii = i + a - 1, jj = j + e - 1;
                if (ii < 0 || ii >= 4 || jj < 0 || jj >= 4) continue;
                acc += in[static_cast<std::size_t>((c * 4 + ii) * 4 + jj)] *
                       w[static_cast<std::size_t>(((mo * 2 + c) * 3 + a) * 3 + e)];
              }
          out[static_cast<std::size_t>((mo * 4 + i) * 4 + j)] = acc;
        }
    return out;
  };
  const std::vector<double> xv(x.begin(), x.end());
  std::vector<double> r1 = conv(xv, init("w1"), init("b1"));
  for (double& v : r1) v = std::max(v, 0.0);
  std::vector<double> y = conv(r1, init("w2"), {});
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = std::max(y[i] + xv[i], 0.0);
  return y;
}

}  // namespace

TEST_CASE("Conv + Relu and Conv + Add + Relu run as FusedConv nodes with the same values",
          "[exec]") {
  std::vector<float> xs(32);
  for (std::size_t i = 0; i < xs.size(); ++i)
    xs[i] = static_cast<float>(static_cast<int>(i * 3 % 17) - 8) / 4;
  for (bool expose : {false, true})
    for (bool z_first : {false, true}) {
      INFO("Conv2's output a graph output: " << expose << ", Add(x, c2): " << z_first);
      fs::path d = temp_dir("conv_fuse");
      const onnx::ModelProto m = residual_block_model(expose, z_first);
      auto mm = load(write_model(d, m));
      Backends b = cpu();
      auto ex = Executor::create(mm, {b.primary, b.cpu, nullptr});
      REQUIRE(ex.ok());
      auto out = (*ex)->run({f32({1, 2, 4, 4}, xs)});
      REQUIRE(out.ok());
      const std::vector<double> want = residual_block_ref(m, xs);
      for (std::size_t i = 0; i < want.size(); ++i)
        CHECK((*out)[0].as<float>()[i] == Approx(want[i]).margin(1e-5));
      const auto& by_op = (*ex)->stats().by_op;
      // Conv1 + Relu always fuse; Conv2 + Add + Relu only while Conv2's output is internal.
      CHECK(by_op.at("com.microsoft.FusedConv").nodes == (expose ? 1 : 2));
      CHECK(by_op.count("Conv") == (expose ? 1u : 0u));
      CHECK(by_op.count("Add") == (expose ? 1u : 0u));
      CHECK(by_op.count("Relu") == (expose ? 1u : 0u));
      fs::remove_all(d);
    }
}

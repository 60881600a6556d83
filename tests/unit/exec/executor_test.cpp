// Executor unit tests on graphs built here with the onnx protobuf API: tensor files (round trip and
// malformed files), input binding errors, a small MLP against hand-computed values, lifetime
// planning (peak memory), the up-front list of unsupported ops, missing external data, the CommOps
// seam and constant and shape-only nodes cached across runs. Fusions and layouts are in
// exec_fusion_test.cpp.
#include <catch2/catch.hpp>

#include <onnx/onnx_pb.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "exec_test_util.h"
#include "hp/comm/comm.h"
#include "hp/exec/backends.h"
#include "hp/exec/compare.h"
#include "hp/exec/executor.h"
#include "hp/exec/tensor.h"
#include "hp_model.h"

using namespace hp;
using namespace hp::exec;
using namespace hp::exec::test;
using namespace hp::comm;

namespace {

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
  CHECK((*ex)->stats().nodes == 1);  // MatMul, Add and Relu fused (exec_fusion_test.cpp)
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

TEST_CASE("outputs handed to the hook leave the pool once nothing reads them", "[exec]") {
  // g = -x is an output nobody reads; a = -x - x... is an output a later node reads. With a hook,
  // g's buffer goes right after its node and a's after its last reader; the values are the same.
  constexpr int kN = 64;
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  add_value(g->mutable_input(), "x", {kN, kN});
  for (const char* o : {"g", "a", "y"}) add_value(g->mutable_output(), o, {kN, kN});
  add_node(g, "Neg", {"x"}, {"g"}, "grad");
  add_node(g, "Neg", {"x"}, {"a"}, "early");
  std::string h = "a";
  for (int i = 0; i < 6; ++i) {
    add_node(g, "Neg", {h}, {"c" + std::to_string(i)}, "chain" + std::to_string(i));
    h = "c" + std::to_string(i);
  }
  add_node(g, "Add", {h, "a"}, {"y"}, "last");
  fs::path d = temp_dir("hook_release");
  auto mm = load(write_model(d, m));
  Backends b = cpu();
  std::vector<float> x(kN * kN);
  for (int i = 0; i < kN * kN; ++i) x[static_cast<std::size_t>(i)] = static_cast<float>(i % 13);
  auto plain = Executor::create(mm, {b.primary, b.cpu, nullptr});
  auto hooked = Executor::create(mm, {b.primary, b.cpu, nullptr});
  REQUIRE((plain.ok() && hooked.ok()));
  int handed = 0;
  (*hooked)->set_output_hook([&](std::size_t, const HostTensor&) { ++handed; });
  for (int run = 0; run < 2; ++run) {  // the second run reuses the pool's buffers
    auto want = (*plain)->run({f32({kN, kN}, x, "x")});
    auto got = (*hooked)->run({f32({kN, kN}, x, "x")});
    REQUIRE((want.ok() && got.ok()));
    for (std::size_t k = 0; k < 3; ++k) CHECK((*got)[k].data == (*want)[k].data);
  }
  CHECK(handed == 6);
  // g (16 KiB) no longer lives through the chain.
  CHECK((*hooked)->stats().peak_bytes < (*plain)->stats().peak_bytes);
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

TEST_CASE("view ops that are their input's last reader take its buffer; the values are the same",
          "[exec]") {
  // a = Relu(x); b = Reshape(a, [2, 3]) (a is read again below: b gets a copy);
  // c = Unsqueeze(Relu(b), [0]) (the Relu's output dies there: c takes its buffer);
  // e = Flatten(Identity(a + a)) (each view the last reader of its input); run twice, since the
  // buffers a first run leaves in the pool are reused by the second.
  fs::path d = temp_dir("views");
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  add_value(g->mutable_input(), "x", {6});
  add_value(g->mutable_output(), "c", {1, 2, 3});
  add_value(g->mutable_output(), "e", {6, 1});
  for (const auto& [name, v] :
       {std::pair<const char*, std::vector<std::int64_t>>{"shape", {2, 3}}, {"axes", {0}}}) {
    auto* t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::INT64);
    t->add_dims(static_cast<std::int64_t>(v.size()));
    for (auto k : v) t->add_int64_data(k);
  }
  add_node(g, "Relu", {"x"}, {"a"}, "relu_a");
  add_node(g, "Reshape", {"a", "shape"}, {"b"}, "reshape");
  add_node(g, "Relu", {"b"}, {"rb"}, "relu_b");
  add_node(g, "Unsqueeze", {"rb", "axes"}, {"c"}, "unsqueeze");
  add_node(g, "Add", {"a", "a"}, {"aa"}, "double");
  add_node(g, "Identity", {"aa"}, {"ia"}, "identity");
  add_node(g, "Flatten", {"ia"}, {"e"}, "flatten");
  auto mm = load(write_model(d, m));
  Backends b = cpu();
  auto ex = Executor::create(mm, {b.primary, b.cpu, nullptr});
  REQUIRE(ex.ok());
  for (float sign : {1.f, -1.f}) {
    const std::vector<float> xs = {sign * 1, -2, sign * 3, -4, 5, sign * -6};
    auto out = (*ex)->run({f32({6}, xs)});
    REQUIRE(out.ok());
    REQUIRE((*out)[0].dims == std::vector<std::int64_t>{1, 2, 3});
    REQUIRE((*out)[1].dims == std::vector<std::int64_t>{6, 1});
    for (std::size_t i = 0; i < xs.size(); ++i) {
      CHECK((*out)[0].as<float>()[i] == std::max(xs[i], 0.f));
      CHECK((*out)[1].as<float>()[i] == 2 * std::max(xs[i], 0.f));
    }
  }
  fs::remove_all(d);
}

// The trained model file and checkpoint directories: save_model's output loads with
// model::load_model (and the onnx Python package) and runs with the new weights, inline and as
// external data; checkpoints round-trip bit for bit; every missing, truncated or inconsistent file
// is bad input naming it; and a failed save leaves the previous checkpoint as it was.
#include <catch2/catch.hpp>

#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "hp/core/fs.h"
#include "hp/exec/backends.h"
#include "hp/exec/executor.h"
#include "hp/plugin/hp_plugin.h"
#include "hp/train/checkpoint.h"

namespace fs = std::filesystem;
using namespace hp;
using namespace hp::train;
using exec::HostTensor;
using nlohmann::json;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d =
      fs::temp_directory_path() / ("hp_train_ckpt_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

HostTensor f32(std::vector<std::int64_t> dims, const std::vector<float>& v, std::string name = "") {
  HostTensor t;
  t.name = std::move(name);
  t.dtype = HP_F32;
  t.dims = std::move(dims);
  t.data.resize(v.size() * 4);
  if (!v.empty()) std::memcpy(t.data.data(), v.data(), t.data.size());
  return t;
}

void add_value(google::protobuf::RepeatedPtrField<onnx::ValueInfoProto>* list,
               const std::string& name, std::vector<std::int64_t> dims) {
  auto* v = list->Add();
  v->set_name(name);
  auto* tt = v->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx::TensorProto::FLOAT);
  for (auto d : dims) tt->mutable_shape()->add_dim()->set_dim_value(d);
}

onnx::TensorProto* add_init(onnx::GraphProto* g, const std::string& name,
                            std::vector<std::int64_t> dims, const std::vector<float>& v) {
  auto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::FLOAT);
  for (auto d : dims) t->add_dims(d);
  for (float f : v) t->add_float_data(f);  // typed fields, as some exporters write
  return t;
}

/// y = (x @ W + b) * s: W [2,3] and b [3] are trained, s [3] is not. With `external_s`, s lives
/// in the forward model's own external data file.
fs::path write_forward(const fs::path& dir, bool external_s = false) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  m.set_producer_name("hp-train-test");
  auto* g = m.mutable_graph();
  g->set_name("mlp");
  add_value(g->mutable_input(), "x", {1, 2});
  add_value(g->mutable_output(), "y", {1, 3});
  add_init(g, "W", {2, 3}, {1, 2, 3, 4, 5, 6});
  add_init(g, "b", {3}, {0, 0, 0});
  auto* s = add_init(g, "s", {3}, {1, 10, 100});
  if (external_s) {
    s->clear_float_data();
    const float sv[3] = {1, 10, 100};
    std::ofstream(dir / "forward.bin", std::ios::binary)
        << std::string("pad!") << std::string(reinterpret_cast<const char*>(sv), 12);
    s->set_data_location(onnx::TensorProto::EXTERNAL);
    for (auto [k, v] : {std::pair<const char*, const char*>{"location", "forward.bin"},
                        {"offset", "4"},
                        {"length", "12"}}) {
      auto* kv = s->add_external_data();
      kv->set_key(k);
      kv->set_value(v);
    }
  }
  auto node = [&](const char* op, std::vector<std::string> in, const char* out) {
    auto* n = g->add_node();
    n->set_op_type(op);
    n->set_name(out);
    for (auto& i : in) n->add_input(i);
    n->add_output(out);
  };
  node("MatMul", {"x", "W"}, "xw");
  node("Add", {"xw", "b"}, "h");
  node("Mul", {"h", "s"}, "y");
  fs::path p = dir / "forward.onnx";
  std::ofstream(p, std::ios::binary) << m.SerializeAsString();
  return p;
}

model::Model load(const fs::path& p, model::LoadMode mode = model::LoadMode::shapes_only) {
  model::LoadOptions lo;
  lo.mode = mode;
  auto m = model::load_model(p, lo);
  INFO((m.ok() ? std::string() : m.error().str()));
  REQUIRE(m.ok());
  return *m;
}

std::vector<HostTensor> trained() {
  return {f32({2, 3}, {0.5f, -1, 2, 0.25f, 3, -4}, "W"), f32({3}, {1, 2, 3}, "b")};
}

/// Runs the saved model on x = [1, 2]: with trained() weights, y = ([1,5,-6] + [1,2,3]) * s.
std::vector<float> run(const fs::path& model_file) {
  model::Model m = load(model_file, model::LoadMode::require_data);
  auto b = exec::open_backends("cpu", 1, {});
  REQUIRE(b.ok());
  auto ex = exec::Executor::create(m, {b->primary, b->cpu, nullptr, {}});
  INFO((ex.ok() ? std::string() : ex.error().str()));
  REQUIRE(ex.ok());
  auto out = (*ex)->run({f32({1, 2}, {1, 2}, "x")});
  REQUIRE(out.ok());
  const float* y = (*out)[0].as<float>();
  return {y[0], y[1], y[2]};
}

const std::vector<float> kWant = {2, 70, -300};

const onnx::TensorProto& init(const model::Model& m, const std::string& name) {
  for (const auto& t : m.proto->graph().initializer())
    if (t.name() == name) return t;
  FAIL("no initializer " << name);
  throw;
}

std::string external_entry(const onnx::TensorProto& t, const std::string& key) {
  for (const auto& kv : t.external_data())
    if (kv.key() == key) return kv.value();
  return "";
}

/// The initializers of `model_file` as the onnx Python package reads them ("name v v v" lines),
/// after onnx.checker accepted the model; empty when Debian's python3-onnx is not installed.
std::string onnx_python_values(const fs::path& model_file) {
#ifdef HP_SYSTEM_PYTHON3
  const fs::path out = model_file.parent_path() / "python_values.txt";
  const std::string cmd =
      std::string(HP_SYSTEM_PYTHON3) +
      " -c 'import sys, onnx\nfrom onnx import numpy_helper\nm = onnx.load(sys.argv[1])\n"
      "onnx.checker.check_model(m)\n"
      "for t in m.graph.initializer: print(t.name, *numpy_helper.to_array(t).flatten().tolist())'"
      " '" +
      model_file.string() + "' > '" + out.string() + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  auto text = read_file(out);
  REQUIRE(text.ok());
  INFO(*text);
  REQUIRE(rc == 0);
  return *text;
#else
  (void)model_file;
  WARN("python3 with onnx not found: the onnx.load check is skipped");
  return "";
#endif
}

void check_onnx_python(const fs::path& model_file) {
  const std::string got = onnx_python_values(model_file);
  if (got.empty()) return;
  CHECK(got == "W 0.5 -1.0 2.0 0.25 3.0 -4.0\nb 1.0 2.0 3.0\ns 1.0 10.0 100.0\n");
}

}  // namespace

TEST_CASE("save_model writes the trained weights inline and the model runs with them",
          "[train][checkpoint]") {
  fs::path d = temp_dir("inline");
  model::Model fwd = load(write_forward(d));
  CHECK(run(d / "forward.onnx") == std::vector<float>{9, 120, 1500});  // the forward's weights
  REQUIRE(save_model(fwd, trained(), d / "trained.onnx").ok());
  CHECK(!fs::exists(d / "trained.onnx.data"));
  model::Model m = load(d / "trained.onnx", model::LoadMode::require_data);
  CHECK(m.external_files.empty());
  CHECK(m.proto->producer_name() == "hp-train-test");  // the rest of the proto is kept
  CHECK(init(m, "W").raw_data().size() == 24);
  CHECK(init(m, "W").float_data_size() == 0);
  CHECK(init(m, "s").float_data_size() == 3);  // not trained: untouched
  CHECK(run(d / "trained.onnx") == kWant);
  check_onnx_python(d / "trained.onnx");
  // No temporary files are left beside it.
  int files = 0;
  for (auto& e : fs::directory_iterator(d)) files += e.path().filename().string()[0] == '.';
  CHECK(files == 0);
  fs::remove_all(d);
}

TEST_CASE("save_model keeps large weights in <file>.data as ONNX external data",
          "[train][checkpoint]") {
  fs::path d = temp_dir("external");
  fs::create_directories(d / "src");
  fs::create_directories(d / "out");
  model::Model fwd = load(write_forward(d / "src", /*external_s=*/true));
  REQUIRE(save_model(fwd, trained(), d / "out" / "trained.onnx", /*external_threshold=*/16).ok());
  // The forward model's own data file is copied in: the result does not depend on it.
  fs::remove_all(d / "src");
  model::Model m = load(d / "out" / "trained.onnx", model::LoadMode::require_data);
  REQUIRE(m.external_files.size() == 1);
  CHECK(m.external_files[0].location == "trained.onnx.data");
  CHECK(m.external_files[0].initializers == 3);
  std::set<std::string> offsets;
  for (const char* name : {"W", "b", "s"}) {
    const auto& t = init(m, name);
    CHECK(t.data_location() == onnx::TensorProto::EXTERNAL);
    CHECK(!t.has_raw_data());
    CHECK(std::stoll(external_entry(t, "offset")) % 64 == 0);
    offsets.insert(external_entry(t, "offset"));
  }
  CHECK(offsets.size() == 3);
  CHECK(external_entry(init(m, "W"), "length") == "24");
  CHECK(run(d / "out" / "trained.onnx") == kWant);
  check_onnx_python(d / "out" / "trained.onnx");

  // Below the threshold the same weights go inline, the forward's external one included.
  model::Model fwd2 = load(write_forward(d, /*external_s=*/true));
  REQUIRE(save_model(fwd2, trained(), d / "inline.onnx", 1 << 20).ok());
  model::Model m2 = load(d / "inline.onnx", model::LoadMode::require_data);
  CHECK(m2.external_files.empty());
  CHECK(init(m2, "s").raw_data().size() == 12);
  CHECK(run(d / "inline.onnx") == kWant);
  fs::remove_all(d);
}

TEST_CASE("save_model rejects parameters that do not match the model and writes nothing",
          "[train][checkpoint]") {
  fs::path d = temp_dir("save_bad");
  model::Model fwd = load(write_forward(d));
  REQUIRE(write_file_atomic(d / "out.onnx", "previous").ok());
  auto expect_bad = [&](std::vector<HostTensor> params, const std::string& needle) {
    Status st = save_model(fwd, params, d / "out.onnx", 0);
    REQUIRE(!st.ok());
    INFO(st.error().str());
    CHECK(st.error().code == Errc::bad_input);
    CHECK(st.error().message().find(needle) != std::string::npos);
    CHECK(*read_file(d / "out.onnx") == "previous");
    CHECK(!fs::exists(d / "out.onnx.data"));
  };
  expect_bad({f32({3}, {1, 2, 3}, "nope")}, "'nope' is not an initializer");
  expect_bad({f32({3}, {1, 2, 3}, "W")}, "'W' is f32 [3], the model's initializer f32 [2,3]");
  HostTensor short_b = f32({3}, {1, 2}, "b");
  expect_bad({short_b}, "'b' has 8 bytes, its dims [3] need 12");
  expect_bad({f32({3}, {1, 2, 3}, "b"), f32({3}, {1, 2, 3}, "b")}, "'b' is given twice");
  Status no_dir = save_model(fwd, trained(), d / "missing" / "out.onnx");
  CHECK(!no_dir.ok());
  fs::remove_all(d);
}

namespace {

Checkpoint adamw_checkpoint() {
  Checkpoint c;
  c.step = 7;
  c.data_position = 14;
  c.seed = std::numeric_limits<std::uint64_t>::max();  // JSON must keep all 64 bits
  c.optimizer = "adamw";
  c.params = trained();
  // Values with every bit pattern class: subnormal, negative zero, the largest float.
  c.state.exp_avg = {f32({2, 3}, {1e-40f, -0.0f, 3.4028235e38f, -1, 1.0f / 3, 7}, "W"),
                     f32({3}, {0.1f, 0.2f, 0.3f}, "b")};
  c.state.exp_avg_sq = {f32({2, 3}, {1, 2, 3, 4, 5, 6}, "W"), f32({3}, {1e-30f, 0, 9}, "b")};
  c.state.step = 7;
  return c;
}

void check_same(const Checkpoint& a, const Checkpoint& b) {
  CHECK(a.step == b.step);
  CHECK(a.data_position == b.data_position);
  CHECK(a.seed == b.seed);
  CHECK(a.optimizer == b.optimizer);
  CHECK(a.state.step == b.state.step);
  auto same = [](const std::vector<HostTensor>& x, const std::vector<HostTensor>& y) {
    REQUIRE(x.size() == y.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      CHECK(x[i].name == y[i].name);
      CHECK(x[i].dtype == y[i].dtype);
      CHECK(x[i].dims == y[i].dims);
      CHECK(x[i].data == y[i].data);  // bit for bit
    }
  };
  same(a.params, b.params);
  same(a.state.exp_avg, b.state.exp_avg);
  same(a.state.exp_avg_sq, b.state.exp_avg_sq);
  same(a.buffers, b.buffers);
}

}  // namespace

TEST_CASE("checkpoints keep the buffers the forward updates", "[train][checkpoint]") {
  // A batch-norm running statistic is no parameter (no optimizer state) but must resume as saved.
  fs::path d = temp_dir("buffers");
  model::Model fwd = load(write_forward(d));
  Checkpoint a = adamw_checkpoint();
  a.buffers = {f32({3}, {0.5f, -0.0f, 1e-40f}, "s")};
  REQUIRE(save_checkpoint(fwd, a, d / "ckpt").ok());
  auto b = load_checkpoint(d / "ckpt");
  INFO((b.ok() ? std::string() : b.error().str()));
  REQUIRE(b.ok());
  check_same(a, *b);
  // A checkpoint without buffers lists none, and reads back without any.
  a.buffers.clear();
  REQUIRE(save_checkpoint(fwd, a, d / "ckpt").ok());
  b = load_checkpoint(d / "ckpt");
  REQUIRE(b.ok());
  CHECK(b->buffers.empty());
  // state.json naming a buffer whose shape model.onnx does not have: refused, naming it.
  a.buffers = {f32({3}, {1, 2, 3}, "s")};
  REQUIRE(save_checkpoint(fwd, a, d / "ckpt").ok());
  auto text = read_file(d / "ckpt" / "state.json");
  REQUIRE(text.ok());
  auto j = nlohmann::json::parse(*text);
  j["buffers"][0]["dims"] = {4};
  REQUIRE(write_file_atomic(d / "ckpt" / "state.json", j.dump()).ok());
  auto bad = load_checkpoint(d / "ckpt");
  REQUIRE(!bad.ok());
  CHECK(bad.error().str().find("buffer 's'") != std::string::npos);
  fs::remove_all(d);
}

TEST_CASE("checkpoints round-trip bit for bit", "[train][checkpoint]") {
  fs::path d = temp_dir("roundtrip");
  model::Model fwd = load(write_forward(d));
  const Checkpoint a = adamw_checkpoint();
  REQUIRE(save_checkpoint(fwd, a, d / "ckpt").ok());
  CHECK(fs::exists(d / "ckpt" / "model.onnx"));
  CHECK(fs::file_size(d / "ckpt" / "optimizer.bin") == 2 * (24 + 12));
  auto b = load_checkpoint(d / "ckpt");
  INFO((b.ok() ? std::string() : b.error().str()));
  REQUIRE(b.ok());
  check_same(a, *b);
  // The checkpoint's model is a model like any other.
  CHECK(run(d / "ckpt" / "model.onnx") == kWant);

  // Replacing it: SGD with a momentum buffer, then plain SGD (no state at all).
  Checkpoint s = a;
  s.optimizer = "sgd";
  s.state.exp_avg_sq.clear();
  s.step = 8;
  REQUIRE(save_checkpoint(fwd, s, d / "ckpt").ok());
  auto sb = load_checkpoint(d / "ckpt");
  REQUIRE(sb.ok());
  check_same(s, *sb);
  s.state.exp_avg.clear();
  REQUIRE(save_checkpoint(fwd, s, d / "ckpt").ok());
  sb = load_checkpoint(d / "ckpt");
  REQUIRE(sb.ok());
  check_same(s, *sb);
  CHECK(fs::file_size(d / "ckpt" / "optimizer.bin") == 0);
  // Only the checkpoint and the forward model are left: no temporary or aside directories.
  std::vector<std::string> names;
  for (auto& e : fs::directory_iterator(d)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"ckpt", "forward.onnx"});
  fs::remove_all(d);
}

TEST_CASE("a failed checkpoint save leaves the previous checkpoint intact", "[train][checkpoint]") {
  fs::path d = temp_dir("atomic");
  model::Model fwd = load(write_forward(d));
  const Checkpoint a = adamw_checkpoint();
  REQUIRE(save_checkpoint(fwd, a, d / "ckpt").ok());

  // The weights fail inside the write (save_model rejects a parameter of the wrong size).
  Checkpoint bad = a;
  bad.step = 99;
  bad.params[0] = f32({2, 3}, {1, 2, 3}, "W");
  Status st = save_checkpoint(fwd, bad, d / "ckpt");
  REQUIRE(!st.ok());
  CHECK(st.error().code == Errc::bad_input);
  // The optimizer state does not match the parameters.
  bad = a;
  bad.state.exp_avg.pop_back();
  CHECK(!save_checkpoint(fwd, bad, d / "ckpt").ok());
  bad = a;
  bad.optimizer = "adam";
  CHECK(!save_checkpoint(fwd, bad, d / "ckpt").ok());
  // The destination's parent cannot hold the temporary directory (it is a file).
  REQUIRE(write_file_atomic(d / "file", "x").ok());
  CHECK(!save_checkpoint(fwd, a, d / "file" / "ckpt").ok());

  auto back = load_checkpoint(d / "ckpt");
  REQUIRE(back.ok());
  check_same(a, *back);
  std::vector<std::string> names;
  for (auto& e : fs::directory_iterator(d)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"ckpt", "file", "forward.onnx"});

  // A crash between the two renames of a save leaves only the aside copy: it is still found.
  fs::rename(d / "ckpt", d / ".ckpt.old");
  back = load_checkpoint(d / "ckpt");
  REQUIRE(back.ok());
  check_same(a, *back);
  // And the next save cleans it up.
  REQUIRE(save_checkpoint(fwd, a, d / "ckpt").ok());
  CHECK(!fs::exists(d / ".ckpt.old"));
  fs::remove_all(d);
}

TEST_CASE("malformed checkpoints are bad input naming the file", "[train][checkpoint]") {
  fs::path d = temp_dir("malformed");
  model::Model fwd = load(write_forward(d));
  const fs::path good = d / "good";
  REQUIRE(save_checkpoint(fwd, adamw_checkpoint(), good).ok());
  const std::string state = *read_file(good / "state.json");
  const std::string bin = *read_file(good / "optimizer.bin");

  int n = 0;
  // Copies the good checkpoint, lets `edit` break it, and expects a bad_input naming `file`.
  auto expect_bad = [&](const std::string& file, const std::string& needle, auto edit) {
    const fs::path c = d / ("case" + std::to_string(n++));
    fs::copy(good, c, fs::copy_options::recursive);
    edit(c);
    auto r = load_checkpoint(c);
    REQUIRE(!r.ok());
    INFO(r.error().str());
    CHECK(r.error().code == Errc::bad_input);
    CHECK(r.error().where() == (c / file).string());
    CHECK(r.error().message().find(needle) != std::string::npos);
  };
  auto edit_state = [&](std::function<void(json&)> f) {
    return [f, state](const fs::path& c) {
      json j = json::parse(state);
      f(j);
      REQUIRE(write_file_atomic(c / "state.json", j.dump(1)).ok());
    };
  };
  expect_bad("state.json", "cannot open", [](const fs::path& c) { fs::remove(c / "state.json"); });
  expect_bad("state.json", "malformed checkpoint index", [&](const fs::path& c) {
    REQUIRE(write_file_atomic(c / "state.json", state.substr(0, state.size() / 2)).ok());
  });
  expect_bad("state.json", "not an hp checkpoint index",
             edit_state([](json& j) { j["format"] = "x"; }));
  expect_bad("state.json", "not an hp checkpoint index", edit_state([](json& j) { j = 3; }));
  expect_bad("state.json", "version 2", edit_state([](json& j) { j["version"] = 2; }));
  expect_bad("state.json", "malformed checkpoint index",
             edit_state([](json& j) { j.erase("step"); }));
  expect_bad("state.json", "malformed checkpoint index",
             edit_state([](json& j) { j["data_position"] = "14"; }));
  expect_bad("state.json", "malformed checkpoint index",
             edit_state([](json& j) { j["params"][0]["dims"] = "[2,3]"; }));
  expect_bad("state.json", "must not be negative", edit_state([](json& j) { j["step"] = -7; }));
  expect_bad("state.json", "unknown optimizer 'lion'",
             edit_state([](json& j) { j["optimizer"] = "lion"; }));
  expect_bad("state.json", "optimizer_state.exp_avg[0] has 20 bytes",
             edit_state([](json& j) { j["optimizer_state"]["exp_avg"][0]["bytes"] = 20; }));
  expect_bad("state.json", "is outside optimizer.bin's 72 bytes",
             edit_state([](json& j) { j["optimizer_state"]["exp_avg_sq"][1]["offset"] = 64; }));
  expect_bad("state.json", "optimizer_state.exp_avg has 1 entries for 2 parameters",
             edit_state([](json& j) { j["optimizer_state"]["exp_avg"].erase(1); }));
  expect_bad("state.json", "exp_avg or exp_avg_sq but not both",
             edit_state([](json& j) { j["optimizer_state"]["exp_avg_sq"] = json::array(); }));
  expect_bad("optimizer.bin", "cannot open",
             [](const fs::path& c) { fs::remove(c / "optimizer.bin"); });
  expect_bad("optimizer.bin", "has 71 bytes, state.json says 72", [&](const fs::path& c) {
    REQUIRE(write_file_atomic(c / "optimizer.bin", bin.substr(0, 71)).ok());
  });
  expect_bad("model.onnx", "", [](const fs::path& c) { fs::remove(c / "model.onnx"); });
  expect_bad("model.onnx", "", [](const fs::path& c) {
    REQUIRE(write_file_atomic(c / "model.onnx", "not a model").ok());
  });
  expect_bad("model.onnx", "parameter 'W' is f32 [2,3], state.json says f32 [3,2]",
             edit_state([](json& j) {
               j["params"][0]["dims"] = {3, 2};
             }));
  expect_bad("model.onnx", "parameter 'W' is f32 [2,3], state.json says f16 [2,3]",
             edit_state([](json& j) { j["params"][0]["dtype"] = "f16"; }));
  expect_bad("model.onnx", "parameter 'Q' of state.json is not an initializer",
             edit_state([](json& j) { j["params"][0]["name"] = "Q"; }));
  auto missing = load_checkpoint(d / "nothing");
  REQUIRE(!missing.ok());
  CHECK(missing.error().code == Errc::bad_input);
  CHECK(missing.error().where() == (d / "nothing").string());
  fs::remove_all(d);
}

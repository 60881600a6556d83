// The kernel fuzzer: one-node models of every ONNX op (from libonnx's schema registry) with random
// input counts, element types, ranks, shapes, attribute values and data, loaded as a file would be
// and run by the executor on the cpu backend. Each case must end in a value (outputs, or an error
// naming what is wrong), never a crash, a hang or an escaping exception: the executor and the
// kernels check every assumption about rank, shape and values at the ABI boundary
// (docs/hardening.md, "Bad files"). Budget and seed: HP_FUZZ_SECONDS (default 20),
// HP_FUZZ_MAX_CASES (default none) and HP_FUZZ_SEED (default 1); the case being run is written to
// HP_FUZZ_DIR (default the temp dir) as hp-fuzz-kernel-<seed>.onnx with its inputs beside it, so a
// crash leaves it behind.
#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "hp/exec/backends.h"
#include "hp/exec/executor.h"
#include "hp/exec/tensor.h"
#include "hp/model/model.h"
#include "hp/plugin/hp_plugin.h"

namespace fs = std::filesystem;
using namespace hp;

namespace {

long env_long(const char* name, long dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtol(v, nullptr, 10) : dflt;
}

using Rng = std::mt19937_64;

int pick(Rng& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
bool chance(Rng& rng, double p) { return std::bernoulli_distribution(p)(rng); }

/// The element types the fuzzer draws (what hp's kernels mostly take), by ONNX name.
const std::map<std::string, int>& drawn_types() {
  static const std::map<std::string, int> t = {
      {"tensor(float)", onnx::TensorProto::FLOAT},    {"tensor(double)", onnx::TensorProto::DOUBLE},
      {"tensor(int64)", onnx::TensorProto::INT64},    {"tensor(int32)", onnx::TensorProto::INT32},
      {"tensor(bool)", onnx::TensorProto::BOOL},      {"tensor(uint8)", onnx::TensorProto::UINT8},
      {"tensor(float16)", onnx::TensorProto::FLOAT16}};
  return t;
}

int hp_dtype(int onnx_type) {
  switch (onnx_type) {
    case onnx::TensorProto::FLOAT: return HP_F32;
    case onnx::TensorProto::DOUBLE: return HP_F64;
    case onnx::TensorProto::INT64: return HP_I64;
    case onnx::TensorProto::INT32: return HP_I32;
    case onnx::TensorProto::BOOL: return HP_BOOL;
    case onnx::TensorProto::UINT8: return HP_U8;
    default: return HP_F16;
  }
}

/// Integer data takes the extremes too only when HP_FUZZ_EXTREMES=1: the arithmetic kernels
/// (sums, products, reductions) then overflow, which is defined for unsigned but not for signed
/// C++ integers, and some still compute it signed (undefined behaviour that UBSan stops on, though
/// x86 wraps). Attributes, where extremes are sizes, axes and pads, always take them.
bool data_extremes() {
  static const bool on = env_long("HP_FUZZ_EXTREMES", 0) != 0;
  return on;
}

/// Small values, now and then an extreme one (overflow, negative sizes).
std::int64_t draw_int(Rng& rng, bool extremes = true) {
  if (extremes && chance(rng, 0.02))
    return chance(rng, 0.5) ? std::numeric_limits<std::int64_t>::max()
                            : std::numeric_limits<std::int64_t>::min();
  return pick(rng, -3, 5);
}

exec::HostTensor draw_tensor(Rng& rng, const std::string& name, int onnx_type,
                             const std::vector<std::int64_t>& dims) {
  exec::HostTensor t;
  t.name = name;
  t.dtype = hp_dtype(onnx_type);
  t.dims = dims;
  const std::int64_t n = t.numel();
  t.data.assign(static_cast<std::size_t>(n) * exec::dtype_size(t.dtype), 0);
  std::normal_distribution<float> nd;
  for (std::int64_t i = 0; i < n; ++i) switch (t.dtype) {
      case HP_F32: t.as<float>()[i] = nd(rng); break;
      case HP_F64: t.as<double>()[i] = nd(rng); break;
      case HP_I64: t.as<std::int64_t>()[i] = draw_int(rng, data_extremes()); break;
      case HP_I32: t.as<std::int32_t>()[i] = static_cast<std::int32_t>(pick(rng, -3, 5)); break;
      case HP_BOOL:
      case HP_U8: t.as<std::uint8_t>()[i] = static_cast<std::uint8_t>(pick(rng, 0, 1)); break;
      default: t.as<std::uint16_t>()[i] = static_cast<std::uint16_t>(0x3c00); break;  // 1.0
    }
  return t;
}

/// Strings the ops take, one of which is drawn for any string attribute (most are some op's).
const std::vector<std::string>& strings() {
  static const std::vector<std::string> s = {
      "NOTSET",  "SAME_UPPER",    "SAME_LOWER", "VALID",      "constant",      "reflect",
      "edge",    "DCR",           "CRD",        "nearest",    "linear",        "cubic",
      "sum",     "mean",          "none",       "max",        "min",           "forward",
      "reverse", "bidirectional", "half_pixel", "asymmetric", "align_corners", "round_prefer_floor",
      "floor",   "tanh",          "Relu",       "Tanh",       "Sigmoid",       "exclude",
      "bogus"};
  return s;
}

void draw_attribute(Rng& rng, const onnx::OpSchema::Attribute& a, onnx::NodeProto& n, int rank) {
  auto* at = n.add_attribute();
  at->set_name(a.name);
  switch (a.type) {
    case onnx::AttributeProto::INT:
      at->set_type(a.type);
      at->set_i(draw_int(rng));
      break;
    case onnx::AttributeProto::INTS:
      at->set_type(a.type);
      for (int k = pick(rng, 0, std::max(1, rank) + 1); k > 0; --k) at->add_ints(draw_int(rng));
      break;
    case onnx::AttributeProto::FLOAT:
      at->set_type(a.type);
      at->set_f(std::uniform_real_distribution<float>(-2, 2)(rng));
      break;
    case onnx::AttributeProto::FLOATS:
      at->set_type(a.type);
      for (int k = pick(rng, 0, 4); k > 0; --k)
        at->add_floats(std::uniform_real_distribution<float>(-2, 2)(rng));
      break;
    case onnx::AttributeProto::STRING:
      at->set_type(a.type);
      at->set_s(strings()[static_cast<std::size_t>(pick(rng, 0, int(strings().size()) - 1))]);
      break;
    case onnx::AttributeProto::STRINGS:
      at->set_type(a.type);
      for (int k = pick(rng, 0, 3); k > 0; --k)
        at->add_strings(
            strings()[static_cast<std::size_t>(pick(rng, 0, int(strings().size()) - 1))]);
      break;
    case onnx::AttributeProto::TENSOR: {
      at->set_type(a.type);
      auto* t = at->mutable_t();
      t->set_data_type(chance(rng, 0.5) ? onnx::TensorProto::FLOAT : onnx::TensorProto::INT64);
      const int k = pick(rng, 0, 3);
      t->add_dims(k);
      for (int i = 0; i < k; ++i)
        if (t->data_type() == onnx::TensorProto::FLOAT)
          t->add_float_data(static_cast<float>(pick(rng, -2, 2)));
        else
          t->add_int64_data(draw_int(rng));
      break;
    }
    default: n.mutable_attribute()->RemoveLast(); break;  // graphs, sparse tensors: not drawn
  }
}

struct Case {
  onnx::ModelProto model;
  std::vector<exec::HostTensor> inputs;
};

/// One node of `s` with random inputs and attributes; false when the op cannot be drawn.
bool draw_case(Rng& rng, const onnx::OpSchema& s, Case& c) {
  c = {};
  c.model.set_ir_version(8);
  auto* opset = c.model.add_opset_import();
  opset->set_version(17);
  auto& g = *c.model.mutable_graph();
  g.set_name("fuzz");
  auto& n = *g.add_node();
  n.set_op_type(s.Name());
  n.set_name("the_node");
  const auto& formals = s.inputs();
  const int max_in = std::min(s.max_input(), s.min_input() + 2);
  const int count = formals.empty() ? 0 : pick(rng, s.min_input(), std::max(s.min_input(), max_in));
  std::map<std::string, int> type_of;  // type parameter -> drawn type (shared by its inputs)
  std::vector<std::int64_t> shared;    // a shape most inputs take, so cases pass the shape checks
  for (int r = pick(rng, 0, 4); r > 0; --r)
    shared.push_back(pick(rng, chance(rng, 0.1) ? 0 : 1, 4));
  for (int i = 0; i < count; ++i) {
    const auto& f = formals[std::min<std::size_t>(static_cast<std::size_t>(i), formals.size() - 1)];
    if (f.GetOption() == onnx::OpSchema::Optional && chance(rng, 0.3)) {
      n.add_input("");
      continue;
    }
    auto it = type_of.find(f.GetTypeStr());
    if (it == type_of.end()) {
      std::vector<int> allowed;
      for (const auto* t : f.GetTypes())
        if (auto d = drawn_types().find(*t); d != drawn_types().end()) allowed.push_back(d->second);
      if (allowed.empty()) return false;
      it = type_of
               .emplace(f.GetTypeStr(),
                        allowed[static_cast<std::size_t>(pick(rng, 0, int(allowed.size()) - 1))])
               .first;
    }
    std::vector<std::int64_t> dims = shared;
    if (chance(rng, 0.4)) {
      dims.clear();
      for (int r = pick(rng, 0, 4); r > 0; --r) dims.push_back(pick(rng, 0, 4));
    }
    const std::string name = "x" + std::to_string(i);
    n.add_input(name);
    auto* v = g.add_input();
    v->set_name(name);
    auto* tt = v->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(it->second);
    for (auto d : dims) tt->mutable_shape()->add_dim()->set_dim_value(d);
    c.inputs.push_back(draw_tensor(rng, name, it->second, dims));
  }
  for (const auto& [name, a] : s.attributes())
    if (a.required || chance(rng, 0.4)) draw_attribute(rng, a, n, static_cast<int>(shared.size()));
  const int outs = std::max(1, std::min(s.max_output(), s.min_output() + 1));
  for (int k = 0; k < outs; ++k) {
    const std::string name = "y" + std::to_string(k);
    n.add_output(name);
    g.add_output()->set_name(name);
  }
  return true;
}

}  // namespace

TEST_CASE("fuzz: every op's kernel on random inputs ends in a value, never a crash", "[fuzz]") {
  const long seconds = env_long("HP_FUZZ_SECONDS", 20);
  // CTest also caps the cases, so that a faster machine runs the same ones, not new ones.
  const long max_cases = env_long("HP_FUZZ_MAX_CASES", 0);
  const auto seed = static_cast<std::uint64_t>(env_long("HP_FUZZ_SEED", 1));
  const char* dir = std::getenv("HP_FUZZ_DIR");
  const fs::path scratch = fs::path(dir && *dir ? dir : fs::temp_directory_path().string()) /
                           ("hp-fuzz-kernel-" + std::to_string(seed));
  fs::create_directories(scratch);
  // Ops of the default domain at opset 17 without subgraphs (If, Loop, Scan: their bodies are
  // models of their own) and without randomness worth nothing here.
  std::vector<const onnx::OpSchema*> ops;
  std::set<std::string> seen;
  for (const auto& s : onnx::OpSchemaRegistry::get_all_schemas()) {
    if (!s.domain().empty() || s.Deprecated() || !seen.insert(s.Name()).second) continue;
    bool graph = false;
    for (const auto& [name, a] : s.attributes())
      graph =
          graph || a.type == onnx::AttributeProto::GRAPH || a.type == onnx::AttributeProto::GRAPHS;
    if (!graph) ops.push_back(onnx::OpSchemaRegistry::Schema(s.Name(), 17, ""));
  }
  ops.erase(std::remove(ops.begin(), ops.end(), nullptr), ops.end());
  REQUIRE(ops.size() > 100);
  auto be = exec::open_backends("cpu", 1, {});
  REQUIRE(be);
  Rng rng(seed);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  long cases = 0, loaded = 0, ran = 0;
  std::set<std::string> ran_ops;
  Case c;
  while (std::chrono::steady_clock::now() < until && (max_cases <= 0 || cases < max_cases)) {
    const onnx::OpSchema& s = *ops[static_cast<std::size_t>(cases % static_cast<long>(ops.size()))];
    ++cases;
    if (!draw_case(rng, s, c)) continue;
    std::string bytes;
    c.model.SerializeToString(&bytes);
    {  // the case on disk first: a crash leaves it behind
      std::ofstream(scratch / "model.onnx", std::ios::binary) << bytes;
      for (std::size_t i = 0; i < c.inputs.size(); ++i)
        (void)exec::write_tensor_file(scratch / ("input_" + std::to_string(i) + ".pb"),
                                      c.inputs[i]);
    }
    model::LoadOptions lo;
    lo.mode = model::LoadMode::require_data;
    auto m = model::parse_model(bytes, scratch / "model.onnx", lo);
    if (!m) continue;
    ++loaded;
    auto ex = exec::Executor::create(*m, {be->primary, be->cpu, nullptr});
    if (!ex) continue;
    auto out = (*ex)->run(c.inputs);
    if (out) ++ran, ran_ops.insert(s.Name());
  }
  fs::remove_all(scratch);
  std::printf(
      "fuzz kernel: seed %llu, %ld cases in %ld s over %zu ops, %ld loaded, %ld ran "
      "(%zu ops), 0 crashes\n",
      static_cast<unsigned long long>(seed), cases, seconds, ops.size(), loaded, ran,
      ran_ops.size());
  CHECK(cases > 0);
  if (cases >= 1000) CHECK(ran_ops.size() > 50);  // the draws reach the kernels of most ops
}

// The models and helpers of the pipeline-stage tests (train_stages_test.cpp,
// train_split_backward_test.cpp): an MLP with LayerNorm, the exported exact GELU, Softmax and Pow;
// a transformer block with an embedding Gather, attention, a residual MLP and a head tied to the
// embedding; two recomputed blocks with a training-mode Dropout; running a model on named tensors
// and comparing the results; check_split, which runs the parts of a split gradient model.
#pragma once

#include <onnx/onnx_pb.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "hp/exec/backends.h"
#include "hp/exec/executor.h"
#include "hp/train/autodiff.h"
#include "hp/train/stages.h"
#include "train_graph_builder.h"

namespace hp::test {

using Tensors = std::map<std::string, exec::HostTensor>;

inline void scalar_const(Builder& b, const std::string& name, float v) {
  auto* a = b.node("Constant", {}, {name})->add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  a->mutable_t()->set_data_type(onnx::TensorProto::FLOAT);
  a->mutable_t()->add_float_data(v);
}

/// The exact GELU as PyTorch exports it.
inline void gelu(Builder& b, const std::string& x, const std::string& y) {
  scalar_const(b, y + ".sqrt2", 1.41421356f);
  scalar_const(b, y + ".one", 1.f);
  scalar_const(b, y + ".half", 0.5f);
  b.node("Div", {x, y + ".sqrt2"}, {y + ".g1"});
  b.node("Erf", {y + ".g1"}, {y + ".g2"});
  b.node("Add", {y + ".g2", y + ".one"}, {y + ".g3"});
  b.node("Mul", {x, y + ".g3"}, {y + ".g4"});
  b.node("Mul", {y + ".g4", y + ".half"}, {y});
}

inline void layer_norm(Builder& b, const std::string& x, const std::string& y, std::int64_t d) {
  b.weight(y + ".s", {d}, 1.0);
  b.weight(y + ".b", {d});
  attr_i(b.node("LayerNormalization", {x, y + ".s", y + ".b"}, {y}), "axis", -1);
}

/// x [4,5,6] -> logits [4,5,7]; the GELU chain's g3 and LayerNorm's h2 feed the same Mul.
inline Builder mlp() {
  Builder b;
  b.input("x", {4, 5, 6});
  b.weight("w1", {8, 6});
  b.weight("b1", {8});
  b.weight("w2", {8, 7});
  b.node("Transpose", {"w1"}, {"w1t"});
  b.node("MatMul", {"x", "w1t"}, {"h0"});
  b.node("Add", {"h0", "b1"}, {"h1"});
  layer_norm(b, "h1", "h2", 8);
  gelu(b, "h2", "g");
  b.node("Tanh", {"g"}, {"h3"});
  b.node("Softmax", {"h3"}, {"h4"});
  scalar_const(b, "two", 2.f);
  b.node("Pow", {"h3", "two"}, {"h3sq"});
  b.node("Mul", {"h4", "h3sq"}, {"h5"});
  b.node("MatMul", {"h5", "w2"}, {"logits"});
  b.output("logits", {4, 5, 7});
  return b;
}

/// ids [2,5] -> logits [2,5,13]: embedding and positions, causal attention, a residual GELU MLP, a
/// final LayerNorm and a head tied to the embedding.
inline Builder transformer() {
  const std::int64_t v = 13, s = 5, d = 8;
  Builder b;
  b.input("ids", {2, s}, onnx::TensorProto::INT64);
  b.weight("emb", {v, d});
  b.weight("pos", {s, d});
  auto* mask = b.g().add_initializer();  // a buffer, frozen
  mask->set_name("mask");
  mask->set_data_type(onnx::TensorProto::FLOAT);
  mask->add_dims(s);
  mask->add_dims(s);
  for (int i = 0; i < s; ++i)
    for (int j = 0; j < s; ++j) mask->add_float_data(j > i ? -1e4f : 0.f);
  b.node("Gather", {"emb", "ids"}, {"e"});
  b.node("Add", {"e", "pos"}, {"x"});
  layer_norm(b, "x", "h", d);
  for (const char* w : {"wq", "wk", "wv", "wo"}) b.weight(w, {d, d});
  b.node("MatMul", {"h", "wq"}, {"q"});
  b.node("Transpose", {"wk"}, {"wkt"});  // nn.Linear's export: a Gemm after the rewrite
  b.node("MatMul", {"h", "wkt"}, {"k"});
  b.node("MatMul", {"h", "wv"}, {"v"});
  auto* kt = b.node("Transpose", {"k"}, {"kt"});
  auto* perm = kt->add_attribute();
  perm->set_name("perm");
  perm->set_type(onnx::AttributeProto::INTS);
  for (int p : {0, 2, 1}) perm->add_ints(p);
  b.node("MatMul", {"q", "kt"}, {"sc"});
  scalar_const(b, "scale", 0.35355339f);
  b.node("Mul", {"sc", "scale"}, {"ss"});
  b.node("Add", {"ss", "mask"}, {"sm"});
  b.node("Softmax", {"sm"}, {"p"});
  b.node("MatMul", {"p", "v"}, {"att"});
  b.node("MatMul", {"att", "wo"}, {"o"});
  b.node("Add", {"x", "o"}, {"r1"});
  layer_norm(b, "r1", "h2", d);
  b.weight("wfc", {d, 2 * d});
  b.weight("bfc", {2 * d});
  b.weight("wpr", {2 * d, d});
  b.node("MatMul", {"h2", "wfc"}, {"f0"});
  b.node("Add", {"f0", "bfc"}, {"f1"});
  gelu(b, "f1", "f2");
  b.node("MatMul", {"f2", "wpr"}, {"m"});
  b.node("Add", {"r1", "m"}, {"r2"});
  layer_norm(b, "r2", "hf", d);
  b.node("Transpose", {"emb"}, {"embt"});
  b.node("MatMul", {"hf", "embt"}, {"logits"});
  b.output("logits", {2, s, v});
  return b;
}

/// Two blocks recomputed in the backward, each with a seeded training-mode Dropout.
inline Builder blocks() {
  Builder b;
  b.input("x", {3, 4});
  auto* r = b.g().add_initializer();
  r->set_name("ratio");
  r->set_data_type(onnx::TensorProto::FLOAT);
  r->add_float_data(0.25f);
  auto* t = b.g().add_initializer();
  t->set_name("training");
  t->set_data_type(onnx::TensorProto::BOOL);
  t->add_int32_data(1);
  std::string h = "x";
  for (int k = 0; k < 2; ++k) {
    const std::string p = "layers." + std::to_string(k) + ".";
    b.weight(p + "w", {4, 4});
    b.weight(p + "b", {4});
    b.node("MatMul", {h, p + "w"}, {p + "mm"}, p + "mm");
    b.node("Add", {p + "mm", p + "b"}, {p + "add"}, p + "add");
    b.node("Tanh", {p + "add"}, {p + "act"}, p + "tanh");
    attr_i(b.node("Dropout", {p + "act", "ratio", "training"}, {p + "out"}, p + "drop"), "seed",
           5 + k);
    h = p + "out";
  }
  b.node("Identity", {h}, {"y"});
  b.output("y", {3, 4});
  return b;
}

/// y = a w and z = -c: c has no path to a loss on y.
inline Builder side_input() {
  Builder b;
  b.input("a", {2, 3});
  b.input("c", {2, 3});
  b.weight("w", {3, 4});
  b.node("MatMul", {"a", "w"}, {"y"});
  b.node("Neg", {"c"}, {"z"});
  b.output("y", {2, 4});
  b.output("z", {2, 3});
  return b;
}

inline const exec::Backends& backends() {
  static auto be = exec::open_backends("cpu", 1, {});
  REQUIRE(be);
  return *be;
}

/// Runs `m` on the tensors of `have` its inputs name, after setting the weights of `weights` it
/// holds; returns its outputs by name.
inline Tensors run(const model::Model& m, const Tensors& have, const Tensors& weights = {}) {
  auto ex = exec::Executor::create(m, {backends().primary, backends().cpu, nullptr});
  INFO((ex ? std::string() : ex.error().str()));
  REQUIRE(ex);
  for (const auto& init : m.proto->graph().initializer())
    if (weights.count(init.name()))
      REQUIRE((*ex)->set_weight(init.name(), weights.at(init.name())));
  std::vector<exec::HostTensor> in;
  for (const auto& io : (*ex)->inputs()) {
    INFO("input " << io.name);
    REQUIRE(have.count(io.name));
    in.push_back(have.at(io.name));
  }
  auto r = (*ex)->run(in);
  INFO((r ? std::string() : r.error().str()));
  REQUIRE(r);
  Tensors out;
  for (std::size_t k = 0; k < r->size(); ++k) out[(*ex)->outputs()[k].name] = (*r)[k];
  return out;
}

/// `zeros_ok`: `want` may be all zeros (elsewhere a gradient of zeros would compare equal to
/// anything broken the same way).
inline void check_close(const exec::HostTensor& got, const exec::HostTensor& want,
                        const std::string& what, bool zeros_ok = false) {
  INFO(what);
  REQUIRE(got.dims == want.dims);
  REQUIRE(got.dtype == HP_F32);
  double diff = 0, scale = 0;
  for (std::int64_t k = 0; k < want.numel(); ++k) {
    diff = std::max(diff, double(std::abs(got.as<float>()[k] - want.as<float>()[k])));
    scale = std::max(scale, double(std::abs(want.as<float>()[k])));
  }
  INFO("max difference " << diff << " of max " << scale);
  CHECK((zeros_ok || scale > 0));
  CHECK(diff <= 1e-5 * scale + 1e-7);
}

inline Tensors mlp_data() {
  std::mt19937 rng(5);
  return {{"x", tensor({4, 5, 6}, HP_F32, rng)}, {"labels", tensor({4, 5}, HP_I64, rng, 7)}};
}

inline Tensors transformer_data() {
  std::mt19937 rng(6);
  return {{"ids", tensor({2, 5}, HP_I64, rng, 13)}, {"labels", tensor({2, 5}, HP_I64, rng, 13)}};
}

inline train::GradSpec ce_spec(const std::vector<std::string>& frozen = {}) {
  train::GradSpec s;
  s.logits = "logits";
  s.frozen = frozen;
  return s;
}

inline bool has(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

inline exec::HostTensor initializer_of(const model::Model& m, const std::string& name) {
  for (const auto& t : m.proto->graph().initializer())
    if (t.name() == name) {
      exec::HostTensor h;
      h.dtype = HP_F32;
      h.dims.assign(t.dims().begin(), t.dims().end());
      if (t.has_raw_data()) {  // as exporters write them
        h.data.assign(t.raw_data().begin(), t.raw_data().end());
        REQUIRE(h.data.size() == static_cast<std::size_t>(h.numel()) * sizeof(float));
        return h;
      }
      h.data.resize(static_cast<std::size_t>(t.float_data_size()) * sizeof(float));
      for (int k = 0; k < t.float_data_size(); ++k) h.as<float>()[k] = t.float_data(k);
      return h;
    }
  FAIL("no initializer " << name);
  return {};
}

inline train::GradGraph grad_graph(const model::Model& m, const train::GradSpec& spec) {
  auto gg = train::build_grad_graph(m, spec);
  INFO((gg ? std::string() : gg.error().str()));
  REQUIRE(gg);
  return std::move(*gg);
}

inline model::Model stage(const model::Model& m, const std::vector<std::vector<std::string>>& cuts,
                          std::size_t index) {
  model::Model rest = m;
  std::vector<model::Model> stages;
  for (const auto& cut : cuts) {
    auto st = train::split_forward_at(rest, cut);
    REQUIRE(st);
    stages.push_back(st->first);
    rest = st->second;
  }
  stages.push_back(rest);
  return stages.at(index);
}

/// Runs the parts of a split in turn, each reading what the data and the parts before it give.
inline Tensors run_parts(const train::GradParts& parts, const Tensors& data,
                         const Tensors& weights = {}) {
  Tensors have = data;
  for (const train::GradPart* p : {&parts.forward, &parts.backward, &parts.weight})
    if (!p->empty())
      for (auto& [name, t] : run(p->model, have, weights)) have[name] = t;
  return have;
}

/// What each part of `parts` holds and passes on, as stages.h promises.
inline void check_structure(const train::GradGraph& gg, const train::GradParts& parts,
                            train::BackwardSplit how) {
  const auto& fw = parts.forward;
  for (const auto& n : fw.model.proto->graph().node()) {
    CHECK(n.domain() != "hp.train");  // no gradient op in the forward
    CHECK(n.op_type() != "SoftmaxCrossEntropyLoss");
  }
  REQUIRE(fw.outputs.size() >= gg.forward_outputs.size());
  CHECK(std::equal(gg.forward_outputs.begin(), gg.forward_outputs.end(), fw.outputs.begin()));
  for (const auto& t : parts.stash) {
    CHECK(has(fw.outputs, t));
    CHECK((has(parts.backward.inputs, t) || has(parts.weight.inputs, t)));
  }
  for (const train::GradPart* p : {&parts.backward, &parts.weight})
    for (const auto& n : p->model.proto->graph().node())
      if (n.op_type() == "Shape") CHECK_FALSE(has(parts.stash, n.input(0)));  // shapes moved
  std::vector<std::string> grads = parts.backward.grads;
  grads.insert(grads.end(), parts.weight.grads.begin(), parts.weight.grads.end());
  std::sort(grads.begin(), grads.end());
  std::vector<std::string> want = gg.grads;
  std::sort(want.begin(), want.end());
  CHECK(grads == want);
  if (how == train::BackwardSplit::whole) {
    CHECK(parts.weight.empty());
    CHECK(parts.carried.empty());
    std::vector<std::string> outs;
    for (const auto& o : gg.model.proto->graph().output()) outs.push_back(o.name());
    CHECK(parts.backward.outputs == outs);
    return;
  }
  for (const auto& t : parts.carried) {
    CHECK(has(parts.backward.outputs, t));
    CHECK(has(parts.weight.inputs, t));
  }
  for (const auto& o : gg.input_grad_outputs) CHECK(has(parts.backward.outputs, o));
  if (!gg.loss.empty()) CHECK(parts.backward.outputs.front() == gg.loss);
}

/// The parts of both splits, run in turn, give the whole gradient model's outputs, also after a
/// weight is changed in every part holding it.
inline void check_split(const train::GradGraph& gg, const Tensors& data,
                        const std::string& weight) {
  std::vector<std::string> outs;
  for (const auto& o : gg.model.proto->graph().output()) outs.push_back(o.name());
  exec::HostTensor w = initializer_of(gg.model, weight);
  for (std::int64_t k = 0; k < w.numel(); ++k) w.as<float>()[k] = 1.5f * w.as<float>()[k] + 0.1f;
  const Tensors moved{{weight, w}};
  const Tensors want = run(gg.model, data), want_moved = run(gg.model, data, moved);
  for (auto how : {train::BackwardSplit::whole, train::BackwardSplit::input_weight}) {
    INFO((how == train::BackwardSplit::whole ? "forward | backward" : "forward | B | W"));
    auto parts = train::split_backward(gg, how);
    INFO((parts ? std::string() : parts.error().str()));
    REQUIRE(parts);
    check_structure(gg, *parts, how);
    for (const train::GradPart* p : {&parts->forward, &parts->backward, &parts->weight}) {
      bool holds = false;
      for (const auto& t : p->model.proto->graph().initializer())
        holds = holds || t.name() == weight;
      CHECK(has(p->params, weight) == holds);
    }
    const Tensors got = run_parts(*parts, data), got_moved = run_parts(*parts, data, moved);
    for (const auto& o : outs) {
      check_close(got.at(o), want.at(o), o, true);
      check_close(got_moved.at(o), want_moved.at(o), o + " after moving " + weight, true);
    }
    if (how == train::BackwardSplit::input_weight && !gg.input_grad_outputs.empty()) {
      CHECK_FALSE(parts->weight.empty());  // weight gradients are left for W
      CHECK_FALSE(parts->carried.empty());
    }
  }
}

}  // namespace hp::test

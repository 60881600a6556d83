// Pipeline stages (hp/train/stages.h, GradSpec::output_grads and input_grads): a model cut into
// stages, each differentiated with the gradient of its outputs arriving from the next and the
// gradient of its inputs sent back, gives the loss and parameter gradients of the whole model; a
// gradient model cut into forward | backward or forward | B | W parts gives its outputs when the
// parts run in turn; malformed names are refused before anything runs. The models: an MLP with
// LayerNorm, the exported exact GELU, Softmax and Pow; a transformer block with an embedding
// Gather, attention, a residual MLP and a head tied to the embedding; two recomputed blocks with a
// training-mode Dropout.
#include <onnx/onnx_pb.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>

#include "hp/exec/backends.h"
#include "hp/exec/executor.h"
#include "hp/train/autodiff.h"
#include "hp/train/stages.h"
#include "train_graph_builder.h"

using namespace hp;
using test::attr_i;
using test::Builder;
using test::tensor;

namespace {

using Tensors = std::map<std::string, exec::HostTensor>;

void scalar_const(Builder& b, const std::string& name, float v) {
  auto* a = b.node("Constant", {}, {name})->add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  a->mutable_t()->set_data_type(onnx::TensorProto::FLOAT);
  a->mutable_t()->add_float_data(v);
}

/// The exact GELU as PyTorch exports it.
void gelu(Builder& b, const std::string& x, const std::string& y) {
  scalar_const(b, y + ".sqrt2", 1.41421356f);
  scalar_const(b, y + ".one", 1.f);
  scalar_const(b, y + ".half", 0.5f);
  b.node("Div", {x, y + ".sqrt2"}, {y + ".g1"});
  b.node("Erf", {y + ".g1"}, {y + ".g2"});
  b.node("Add", {y + ".g2", y + ".one"}, {y + ".g3"});
  b.node("Mul", {x, y + ".g3"}, {y + ".g4"});
  b.node("Mul", {y + ".g4", y + ".half"}, {y});
}

void layer_norm(Builder& b, const std::string& x, const std::string& y, std::int64_t d) {
  b.weight(y + ".s", {d}, 1.0);
  b.weight(y + ".b", {d});
  attr_i(b.node("LayerNormalization", {x, y + ".s", y + ".b"}, {y}), "axis", -1);
}

/// x [4,5,6] -> logits [4,5,7]; the GELU chain's g3 and LayerNorm's h2 feed the same Mul.
Builder mlp() {
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
Builder transformer() {
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
Builder blocks() {
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

const exec::Backends& backends() {
  static auto be = exec::open_backends("cpu", 1, {});
  REQUIRE(be);
  return *be;
}

/// Runs `m` on the tensors of `have` its inputs name, after setting the weights of `weights` it
/// holds; returns its outputs by name.
Tensors run(const model::Model& m, const Tensors& have, const Tensors& weights = {}) {
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

void check_close(const exec::HostTensor& got, const exec::HostTensor& want,
                 const std::string& what) {
  INFO(what);
  REQUIRE(got.dims == want.dims);
  REQUIRE(got.dtype == HP_F32);
  double diff = 0, scale = 0;
  for (std::int64_t k = 0; k < want.numel(); ++k) {
    diff = std::max(diff, double(std::abs(got.as<float>()[k] - want.as<float>()[k])));
    scale = std::max(scale, double(std::abs(want.as<float>()[k])));
  }
  INFO("max difference " << diff << " of max " << scale);
  CHECK(scale > 0);  // a gradient of zeros would compare equal to anything broken the same way
  CHECK(diff <= 1e-5 * scale + 1e-7);
}

struct LossAndGrads {
  exec::HostTensor loss;
  Tensors grads;  ///< by parameter
};

LossAndGrads whole(const model::Model& m, const train::GradSpec& spec, const Tensors& data) {
  auto gg = train::build_grad_graph(m, spec);
  INFO((gg ? std::string() : gg.error().str()));
  REQUIRE(gg);
  Tensors out = run(gg->model, data);
  LossAndGrads r{out.at(gg->loss), {}};
  for (std::size_t k = 0; k < gg->params.size(); ++k) r.grads[gg->params[k]] = out.at(gg->grads[k]);
  return r;
}

/// The model cut at each of `cuts` in turn, run stage by stage forward, then backward from the
/// last stage (the loss) to the first, each stage's input gradients feeding the one before.
LossAndGrads pipelined(const model::Model& m, const std::vector<std::vector<std::string>>& cuts,
                       const train::GradSpec& spec, const Tensors& data,
                       std::vector<std::string>* shared = nullptr) {
  std::vector<model::Model> stages;
  model::Model rest = m;
  for (const auto& cut : cuts) {
    auto st = train::split_forward_at(rest, cut);
    INFO((st ? std::string() : st.error().str()));
    REQUIRE(st);
    stages.push_back(st->first);
    rest = st->second;
    if (shared) shared->insert(shared->end(), st->shared_weights.begin(), st->shared_weights.end());
  }
  stages.push_back(rest);
  Tensors acts = data;
  for (std::size_t i = 0; i + 1 < stages.size(); ++i)
    for (auto& [name, t] : run(stages[i], acts)) acts[name] = t;
  LossAndGrads r;
  for (std::size_t i = stages.size(); i-- > 0;) {
    train::GradSpec s = spec;
    if (i + 1 < stages.size()) {
      s.logits.clear();
      s.output_grads = cuts[i];
    }
    if (i > 0) s.input_grads = cuts[i - 1];
    auto gg = train::build_grad_graph(stages[i], s);
    INFO((gg ? std::string() : gg.error().str()));
    REQUIRE(gg);
    CHECK(gg->loss.empty() == (i + 1 < stages.size()));
    Tensors out = run(gg->model, acts);
    if (!gg->loss.empty()) r.loss = out.at(gg->loss);
    for (std::size_t k = 0; k < gg->params.size(); ++k) {
      const auto& g = out.at(gg->grads[k]);
      auto [it, added] = r.grads.emplace(gg->params[k], g);
      if (!added)  // a weight both stages read: the parts of its gradient add up
        for (std::int64_t e = 0; e < g.numel(); ++e) it->second.as<float>()[e] += g.as<float>()[e];
    }
    for (const auto& name : gg->input_grad_outputs) acts[name] = out.at(name);
  }
  return r;
}

void check_same(const LossAndGrads& got, const LossAndGrads& want) {
  check_close(got.loss, want.loss, "loss");
  REQUIRE(got.grads.size() == want.grads.size());
  for (const auto& [p, g] : want.grads) {
    REQUIRE(got.grads.count(p));
    check_close(got.grads.at(p), g, "gradient of " + p);
  }
}

Tensors mlp_data() {
  std::mt19937 rng(5);
  return {{"x", tensor({4, 5, 6}, HP_F32, rng)}, {"labels", tensor({4, 5}, HP_I64, rng, 7)}};
}

Tensors transformer_data() {
  std::mt19937 rng(6);
  return {{"ids", tensor({2, 5}, HP_I64, rng, 13)}, {"labels", tensor({2, 5}, HP_I64, rng, 13)}};
}

train::GradSpec ce_spec(const std::vector<std::string>& frozen = {}) {
  train::GradSpec s;
  s.logits = "logits";
  s.frozen = frozen;
  return s;
}

}  // namespace

TEST_CASE("an MLP cut into two stages gives the whole model's loss and gradients", "[train]") {
  // g's chain reads h2 twice (Div and Mul): the cut lists both tensors crossing it.
  Builder b = mlp();
  check_same(pipelined(b.model(), {{"h2", "g.g3"}}, ce_spec(), mlp_data()),
             whole(b.model(), ce_spec(), mlp_data()));
}

TEST_CASE("a transformer block cut into two and three stages gives the whole model's gradients",
          "[train]") {
  Builder b = transformer();
  const auto spec = ce_spec({"mask"});
  const LossAndGrads want = whole(b.model(), spec, transformer_data());
  CHECK(want.grads.count("emb") == 1);
  for (const auto& cuts : std::vector<std::vector<std::vector<std::string>>>{
           {{"r1"}}, {{"r1", "h2"}}, {{"r1"}, {"r2"}}, {{"x"}, {"r1", "f2"}}}) {
    INFO("cuts " << cuts.size() << ", first at " << cuts[0][0]);
    std::vector<std::string> shared;
    check_same(pipelined(b.model(), cuts, spec, transformer_data(), &shared), want);
    CHECK(shared == std::vector<std::string>{"emb"});  // embedding and head are tied
  }
}

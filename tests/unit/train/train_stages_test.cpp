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

/// `zeros_ok`: `want` may be all zeros (elsewhere a gradient of zeros would compare equal to
/// anything broken the same way).
void check_close(const exec::HostTensor& got, const exec::HostTensor& want, const std::string& what,
                 bool zeros_ok = false) {
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

namespace {

/// Runs the parts of a split in turn, each reading what the data and the parts before it give.
Tensors run_parts(const train::GradParts& parts, const Tensors& data, const Tensors& weights = {}) {
  Tensors have = data;
  for (const train::GradPart* p : {&parts.forward, &parts.backward, &parts.weight})
    if (!p->empty())
      for (auto& [name, t] : run(p->model, have, weights)) have[name] = t;
  return have;
}

bool has(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

exec::HostTensor initializer_of(const model::Model& m, const std::string& name) {
  for (const auto& t : m.proto->graph().initializer())
    if (t.name() == name) {
      exec::HostTensor h;
      h.dtype = HP_F32;
      h.dims.assign(t.dims().begin(), t.dims().end());
      h.data.resize(static_cast<std::size_t>(t.float_data_size()) * sizeof(float));
      for (int k = 0; k < t.float_data_size(); ++k) h.as<float>()[k] = t.float_data(k);
      return h;
    }
  FAIL("no initializer " << name);
  return {};
}

/// What each part of `parts` holds and passes on, as stages.h promises.
void check_structure(const train::GradGraph& gg, const train::GradParts& parts,
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
void check_split(const train::GradGraph& gg, const Tensors& data, const std::string& weight) {
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

train::GradGraph grad_graph(const model::Model& m, const train::GradSpec& spec) {
  auto gg = train::build_grad_graph(m, spec);
  INFO((gg ? std::string() : gg.error().str()));
  REQUIRE(gg);
  return std::move(*gg);
}

model::Model stage(const model::Model& m, const std::vector<std::vector<std::string>>& cuts,
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

}  // namespace

TEST_CASE("forward | backward and forward | B | W parts give the gradient model's outputs",
          "[train]") {
  std::mt19937 rng(12);
  const auto spec = ce_spec({"mask"});
  const model::Model tf = transformer().model();
  SECTION("a whole transformer block with its loss") {
    auto gg = grad_graph(tf, spec);
    check_split(gg, transformer_data(), "wfc");
    // Without input gradients, B is the loss alone and W the whole backward.
    auto parts = train::split_backward(gg, train::BackwardSplit::input_weight);
    REQUIRE(parts);
    CHECK(parts->backward.outputs.front() == gg.loss);
    CHECK(parts->weight.grads.size() + parts->backward.grads.size() == gg.grads.size());
  }
  SECTION("the last stage: loss and input gradients") {
    train::GradSpec s = spec;
    s.input_grads = {"r1"};
    auto gg = grad_graph(stage(tf, {{"r1"}}, 1), s);
    Tensors data = transformer_data();
    data["r1"] = tensor({2, 5, 8}, HP_F32, rng);
    check_split(gg, data, "wfc");
    auto parts = train::split_backward(gg, train::BackwardSplit::input_weight);
    REQUIRE(parts);
    // The MLP's weight gradients wait in W; LayerNorm's come out of B with its input gradient.
    auto grad_of = [&](const std::string& w) {
      auto k = std::find(gg.params.begin(), gg.params.end(), w) - gg.params.begin();
      REQUIRE(k < static_cast<long>(gg.params.size()));
      return gg.grads[static_cast<std::size_t>(k)];
    };
    for (const char* w : {"wfc", "wpr", "bfc", "emb"}) CHECK(has(parts->weight.grads, grad_of(w)));
    for (const char* w : {"h2.s", "h2.b"}) CHECK(has(parts->backward.grads, grad_of(w)));
    CHECK(parts->weight.params.empty());  // weight gradients read activations, not weights
  }
  SECTION("the first stage: output gradients only, so B is empty") {
    train::GradSpec s = spec;
    s.logits.clear();
    s.output_grads = {"r1"};
    auto gg = grad_graph(stage(tf, {{"r1"}}, 0), s);
    CHECK(gg.loss.empty());
    CHECK(gg.inputs == std::vector<std::string>{"ids", "r1.grad"});
    Tensors data = transformer_data();
    data["r1.grad"] = tensor({2, 5, 8}, HP_F32, rng);
    check_split(gg, data, "wq");
    auto parts = train::split_backward(gg, train::BackwardSplit::input_weight);
    REQUIRE(parts);
    CHECK(parts->backward.empty());
    CHECK(parts->backward.model.proto->graph().node_size() == 0);
    CHECK(parts->weight.grads.size() == gg.grads.size());
  }
  SECTION("a middle stage: output gradients in, input gradients out") {
    train::GradSpec s = spec;
    s.logits.clear();
    s.output_grads = {"r1", "f2"};
    s.input_grads = {"x"};
    auto gg = grad_graph(stage(tf, {{"x"}, {"r1", "f2"}}, 1), s);
    CHECK(gg.input_grad_outputs == std::vector<std::string>{"x.grad"});
    CHECK(gg.model.proto->graph().output().rbegin()->name() == "x.grad");
    Tensors data;
    data["x"] = tensor({2, 5, 8}, HP_F32, rng);
    data["r1.grad"] = tensor({2, 5, 8}, HP_F32, rng);
    data["f2.grad"] = tensor({2, 5, 16}, HP_F32, rng);
    check_split(gg, data, "wv");
  }
  SECTION("an MLP") { check_split(grad_graph(mlp().model(), ce_spec()), mlp_data(), "w2"); }
  SECTION("recomputed blocks: the Dropout masks are stashed, the blocks' inputs too") {
    train::GradSpec s;
    s.logits = "y";
    s.loss = train::LossKind::mse;
    s.recompute_blocks = {0, 1};
    s.input_grads = {"x"};
    auto gg = grad_graph(blocks().model(), s);
    REQUIRE(gg.recomputed_nodes > 0);
    Tensors data{{"x", tensor({3, 4}, HP_F32, rng)}, {"labels", tensor({3, 4}, HP_F32, rng)}};
    check_split(gg, data, "layers.1.w");
    auto parts = train::split_backward(gg, train::BackwardSplit::whole);
    REQUIRE(parts);
    CHECK(has(parts->stash, "layers.0.out/mask"));
    CHECK(has(parts->stash, "layers.0.out"));        // block 1's input
    CHECK_FALSE(has(parts->stash, "layers.0.act"));  // recomputed, not kept
  }
}

TEST_CASE("an input without a path to the loss sends back zeros", "[train]") {
  Builder b;
  b.input("a", {2, 3});
  b.input("c", {2, 3});
  b.weight("w", {3, 4});
  b.node("MatMul", {"a", "w"}, {"y"});
  b.node("Neg", {"c"}, {"z"});
  b.output("y", {2, 4});
  b.output("z", {2, 3});
  train::GradSpec s;
  s.logits = "y";
  s.loss = train::LossKind::mse;
  s.input_grads = {"c", "a"};
  auto gg = grad_graph(b.model(), s);
  CHECK(gg.input_grad_outputs == std::vector<std::string>{"c.grad", "a.grad"});
  std::mt19937 rng(2);
  Tensors data{{"a", tensor({2, 3}, HP_F32, rng)},
               {"c", tensor({2, 3}, HP_F32, rng)},
               {"labels", tensor({2, 4}, HP_F32, rng)}};
  Tensors out = run(gg.model, data);
  REQUIRE(out.at("c.grad").dims == std::vector<std::int64_t>{2, 3});
  for (std::int64_t k = 0; k < 6; ++k) CHECK(out.at("c.grad").as<float>()[k] == 0.f);
  // a's gradient is dL/dy w^T with dL/dy = 2 (y - t) / 8.
  const exec::HostTensor y = run(b.model(), data).at("y");
  const auto w = initializer_of(b.model(), "w");
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) {
      double want = 0;
      for (int k = 0; k < 4; ++k)
        want += 2.0 * (y.as<float>()[i * 4 + k] - data.at("labels").as<float>()[i * 4 + k]) / 8 *
                w.as<float>()[j * 4 + k];
      CHECK(out.at("a.grad").as<float>()[i * 3 + j] == Approx(want).epsilon(1e-5));
    }
  check_split(gg, data, "w");
}

namespace {

/// The error's diagnostics, one per line.
std::string all_messages(const Error& e) {
  std::string s;
  for (const auto& d : e.all()) s += d.message + "\n";
  return s;
}

}  // namespace

TEST_CASE("malformed stage names are refused, every one named, before anything runs", "[train]") {
  const model::Model tf = transformer().model();
  auto refused = [&](const model::Model& m, const train::GradSpec& s) {
    auto r = train::build_grad_graph(m, s);
    REQUIRE_FALSE(r);
    CHECK(r.error().code == Errc::bad_input);
    return all_messages(r.error());
  };
  train::GradSpec s = ce_spec({"mask"});
  s.output_grads = {"nope", "r1"};  // r1 is a tensor, not a graph output
  s.input_grads = {"ids", "emb", "zz"};
  const std::string m = refused(tf, s);
  INFO(m);
  CHECK(m.find("output_grads names 'nope', which is no graph output (the outputs: logits)") !=
        std::string::npos);
  CHECK(m.find("output_grads names 'r1', which is no graph output") != std::string::npos);
  CHECK(m.find("input_grads names 'ids', a int64 input: only floating-point inputs") !=
        std::string::npos);
  CHECK(m.find("input_grads names 'emb', an initializer") != std::string::npos);
  CHECK(m.find("input_grads names 'zz', which is no graph input (the inputs: ids)") !=
        std::string::npos);

  train::GradSpec none = ce_spec();
  none.logits.clear();
  CHECK(refused(tf, none).find("no loss and no output_grads") != std::string::npos);

  train::GradSpec twice = ce_spec();
  twice.output_grads = {"logits", "logits"};
  CHECK(refused(tf, twice).find("output_grads names 'logits' twice") != std::string::npos);

  Builder b;  // an integer output, and a tensor already called "<output>.grad"
  b.input("x", {2, 3});
  b.weight("w", {3, 4});
  b.node("MatMul", {"x", "w"}, {"y"});
  b.node("Relu", {"y"}, {"y.grad"});
  b.node("Add", {"y", "y.grad"}, {"u"});
  attr_i(b.node("ArgMax", {"u"}, {"idx"}), "axis", 1);
  b.output("u", {2, 4});
  b.output("idx", {2, 1}, onnx::TensorProto::INT64);
  b.output("y", {2, 4});
  train::GradSpec t;
  t.logits.clear();
  t.output_grads = {"idx", "y"};
  const std::string mt = refused(b.model(), t);
  INFO(mt);
  CHECK(mt.find("output_grads names 'idx', a int64 output") != std::string::npos);
  CHECK(mt.find("the name 'y.grad' for the gradient of 'y' is already a tensor") !=
        std::string::npos);
  t.output_grads = {"u"};  // fine: u.grad is free
  CHECK(train::build_grad_graph(b.model(), t));
}

TEST_CASE("malformed cuts and gradient models are refused", "[train]") {
  const model::Model tf = transformer().model();
  auto refused = [&](const std::vector<std::string>& cut) {
    auto r = train::split_forward_at(tf, cut);
    REQUIRE_FALSE(r);
    CHECK(r.error().code == Errc::bad_input);
    return all_messages(r.error());
  };
  CHECK(refused({}).find("the cut names no tensor") != std::string::npos);
  CHECK(refused({"nope"}).find("'nope', which no node of the model writes") != std::string::npos);
  CHECK(refused({"ids"}).find("'ids', which no node of the model writes") != std::string::npos);
  CHECK(refused({"r1", "r1"}).find("names 'r1' twice") != std::string::npos);
  // Cut at the attention output alone, the residual x crosses the cut: the embedding would run in
  // both stages.
  const std::string m = refused({"att"});
  INFO(m);
  CHECK(m.find("does not separate the stages: node 'e_node' (Gather) reading weight 'emb'") !=
        std::string::npos);
  CHECK(m.find("node 'x_node' (Add) reading weight 'pos'") != std::string::npos);
  // The MLP's GELU reads the LayerNorm output twice: cutting at one reader's input is not a cut.
  auto half = train::split_forward_at(mlp().model(), {"g.g3"});
  REQUIRE_FALSE(half);
  INFO(all_messages(half.error()));
  CHECK(all_messages(half.error())
            .find("node 'h2_node' (LayerNormalization) reading weight 'h2.s'") !=
        std::string::npos);

  auto gg = train::build_grad_graph(tf, ce_spec({"mask"}));
  REQUIRE(gg);
  for (int bad : {-1, gg->model.proto->graph().node_size() + 1}) {
    train::GradGraph broken = *gg;
    broken.forward_nodes = bad;
    auto r = train::split_backward(broken, train::BackwardSplit::whole);
    REQUIRE_FALSE(r);
    CHECK(r.error().code == Errc::bad_input);
  }
}

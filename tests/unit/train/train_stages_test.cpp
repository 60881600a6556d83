// Pipeline stages (hp/train/stages.h, GradSpec::output_grads and input_grads): a model cut into
// stages, each differentiated with the gradient of its outputs arriving from the next and the
// gradient of its inputs sent back, gives the loss and parameter gradients of the whole model (two
// and three stages, on the models of train_stage_models.h); an input off the loss's path sends
// back zeros; malformed stage names and cuts are refused, every one named, before anything runs.
#include <onnx/onnx_pb.h>
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "hp/train/autodiff.h"
#include "hp/train/stages.h"
#include "train_stage_models.h"

using namespace hp;
using namespace hp::test;

namespace {

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

namespace {}  // namespace

TEST_CASE("an output read by the loss and by the next stage gets the sum of both gradients",
          "[train]") {
  // Gradients are linear in what arrives: (loss and g) = (loss and 0) + (g alone).
  const model::Model m = mlp().model();
  std::mt19937 rng(14);
  Tensors data = mlp_data();
  train::GradSpec both = ce_spec(), alone = ce_spec();
  both.output_grads = alone.output_grads = {"logits"};
  alone.logits.clear();
  auto gb = grad_graph(m, both), ga = grad_graph(m, alone);
  REQUIRE(gb.inputs == std::vector<std::string>{"x", "labels", "logits.grad"});
  REQUIRE(ga.inputs == std::vector<std::string>{"x", "logits.grad"});
  REQUIRE(gb.params == ga.params);
  const LossAndGrads loss_only = whole(m, ce_spec(), data);
  data["logits.grad"] = tensor({4, 5, 7}, HP_F32, rng);
  const Tensors with = run(gb.model, data), from_g = run(ga.model, data);
  check_close(with.at(gb.loss), loss_only.loss, "loss");
  for (std::size_t k = 0; k < gb.params.size(); ++k) {
    exec::HostTensor sum = from_g.at(ga.grads[k]);
    const auto& l = loss_only.grads.at(gb.params[k]);
    for (std::int64_t e = 0; e < sum.numel(); ++e) sum.as<float>()[e] += l.as<float>()[e];
    check_close(with.at(gb.grads[k]), sum, "gradient of " + gb.params[k]);
  }
}

TEST_CASE("an input without a path to the loss sends back zeros", "[train]") {
  Builder b = side_input();
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
  CHECK(m.find("input_grads names 'ids', an input of type int64: only floating-point inputs") !=
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
  CHECK(mt.find("output_grads names 'idx', an output of type int64") != std::string::npos);
  CHECK(mt.find("the name 'y.grad' for the gradient of 'y' is already a tensor") !=
        std::string::npos);
  t.output_grads = {"u"};  // fine: u.grad is free
  CHECK(train::build_grad_graph(b.model(), t));
}

TEST_CASE("split_pipeline cuts a model into stages and names the weights they share", "[train]") {
  const model::Model tf = transformer().model();
  auto p = train::split_pipeline(tf, {{"r1"}, {"r2"}});
  INFO((p ? std::string() : p.error().str()));
  REQUIRE(p);
  REQUIRE(p->stages.size() == 3);
  // The embedding is read by the first stage (Gather) and the last (the tied head), not the middle.
  CHECK(p->shared == std::map<std::string, std::vector<int>>{{"emb", {0, 2}}});
  CHECK(p->stages[1].proto->graph().input(0).name() == "r1");
  CHECK(p->stages[1].proto->graph().output(0).name() == "r2");
  // The last stage would read r1 (r2 = r1 + m) past the middle stage.
  auto skip = train::split_pipeline(tf, {{"r1"}, {"m"}});
  REQUIRE_FALSE(skip);
  INFO(skip.error().str());
  CHECK(skip.error().code == Errc::not_implemented);
  CHECK(skip.error().message().find("'r1' goes from stage 0 to stage 2") != std::string::npos);
  // split_forward_at's refusals come through.
  auto bad = train::split_pipeline(tf, {{"r1"}, {"nothing"}});
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code == Errc::bad_input);
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
  {
    Builder b;  // a Split cut at one of its outputs
    b.input("x", {2, 4});
    b.weight("w", {4, 4});
    b.node("MatMul", {"x", "w"}, {"h"});
    auto* sp = b.node("Split", {"h"}, {"lo", "hi"}, "the_split");
    attr_i(sp, "axis", 1);
    b.node("Mul", {"lo", "hi"}, {"y"});
    b.output("y", {2, 2});
    auto r = train::split_forward_at(b.model(), {"lo"});
    REQUIRE_FALSE(r);
    CHECK(r.error().message().find("node 'the_split' (Split) writes the cut tensor 'lo'") !=
          std::string::npos);
    CHECK(train::split_forward_at(b.model(), {"lo", "hi"}));
  }
  // The MLP's GELU reads the LayerNorm output twice: cutting at one reader's input is not a cut.
  auto half = train::split_forward_at(mlp().model(), {"g.g3"});
  REQUIRE_FALSE(half);
  INFO(all_messages(half.error()));
  CHECK(all_messages(half.error())
            .find("node 'h2_node' (LayerNormalization) reading weight 'h2.s'") !=
        std::string::npos);
}

#ifdef HP_SYSTEM_PYTHON3
namespace {

// A two-block GPT as PyTorch users write it (token and position embeddings, causal attention, GELU
// MLPs, a final LayerNorm and head), exported for training (no constant folding, so the position
// ids and the causal mask are computed from the ids' shape); cut.txt names block 0's output.
const char* kGpt = R"PY(
import math, sys, os
import torch, torch.nn as nn, torch.nn.functional as F
import onnx
out = sys.argv[1]
class Block(nn.Module):
    def __init__(self, d, h=2):
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = [z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in (q, k, v)]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.h)
        att = att.masked_fill(~torch.tril(torch.ones(t, t, dtype=torch.bool)), float("-inf"))
        x = x + self.proj((att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))
class GPT(nn.Module):
    def __init__(self, v=23, d=16, t=8):
        super().__init__()
        self.emb, self.pos = nn.Embedding(v, d), nn.Embedding(t, d)
        self.blocks = nn.ModuleList([Block(d), Block(d)])
        self.lnf, self.head = nn.LayerNorm(d), nn.Linear(d, v, bias=False)
    def forward(self, ids):
        x = self.emb(ids) + self.pos(torch.arange(ids.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.lnf(x))
torch.manual_seed(0)
m = GPT()
ids = torch.randint(0, 23, (2, 8))
torch.onnx.export(m, (ids,), os.path.join(out, "gpt.onnx"), input_names=["ids"],
                  output_names=["logits"], opset_version=17,
                  training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
g = onnx.load(os.path.join(out, "gpt.onnx")).graph
cut = [n.output[0] for n in g.node if n.name.startswith("/blocks.0/")][-1]
open(os.path.join(out, "cut.txt"), "w").write(cut)
)PY";

}  // namespace

TEST_CASE("a PyTorch GPT export cut between its blocks gives the whole model's gradients",
          "[train]") {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("hp_train_stages_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "export.py") << kGpt;
  const std::string cmd = std::string(HP_SYSTEM_PYTHON3) + " " + (dir / "export.py").string() +
                          " " + dir.string() + " > " + (dir / "py.log").string() + " 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    std::ifstream log(dir / "py.log");
    const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    if (text.find("ModuleNotFoundError") != std::string::npos) {
      WARN("torch or onnx missing, not checked: " + text);
      return;
    }
    FAIL("export failed: " + text);
  }
  model::LoadOptions lo;
  lo.mode = model::LoadMode::require_data;
  auto m = model::load_model(dir / "gpt.onnx", lo);
  REQUIRE(m);
  std::string cut;
  std::ifstream(dir / "cut.txt") >> cut;
  REQUIRE(cut == "/blocks.0/Add_2_output_0");
  std::mt19937 rng(21);
  const Tensors data{{"ids", tensor({2, 8}, HP_I64, rng, 23)},
                     {"labels", tensor({2, 8}, HP_I64, rng, 23)}};
  const LossAndGrads want = whole(*m, ce_spec(), data);
  CHECK(want.grads.size() == 29);
  check_same(pipelined(*m, {{cut}}, ce_spec(), data), want);

  // Both stages' gradient models split into forward | B | W run as the unsplit ones.
  train::GradSpec last = ce_spec();
  last.input_grads = {cut};
  Tensors data1 = data;
  data1[cut] = tensor({2, 8, 16}, HP_F32, rng);
  check_split(grad_graph(stage(*m, {{cut}}, 1), last), data1, "blocks.1.fc.weight");
  train::GradSpec first = ce_spec();
  first.logits.clear();
  first.output_grads = {cut};
  Tensors data0{{"ids", data.at("ids")}, {cut + ".grad", tensor({2, 8, 16}, HP_F32, rng)}};
  check_split(grad_graph(stage(*m, {{cut}}, 0), first), data0, "blocks.0.qkv.weight");
  fs::remove_all(dir);
}
#endif

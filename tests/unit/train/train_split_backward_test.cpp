// split_backward (hp/train/stages.h): a gradient model cut into forward | backward or forward | B |
// W parts gives the gradient model's outputs when the parts run in turn, also after a weight is
// changed in every part holding it; each part holds and passes what stages.h says; the zero-bubble
// cut leaves the weight gradients that need no input gradient to W. The models are those of
// train_stage_models.h, whole and as pipeline stages.
#include <onnx/onnx_pb.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>

#include "hp/train/autodiff.h"
#include "hp/train/stages.h"
#include "train_stage_models.h"

using namespace hp;
using namespace hp::test;

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
  SECTION("an input off the loss's path: its zeros' Shape moves to the forward") {
    train::GradSpec s;
    s.logits = "y";
    s.loss = train::LossKind::mse;
    s.input_grads = {"c", "a"};
    auto gg = grad_graph(side_input().model(), s);
    Tensors data{{"a", tensor({2, 3}, HP_F32, rng)},
                 {"c", tensor({2, 3}, HP_F32, rng)},
                 {"labels", tensor({2, 4}, HP_F32, rng)}};
    check_split(gg, data, "w");
    auto parts = train::split_backward(gg, train::BackwardSplit::input_weight);
    REQUIRE(parts);
    CHECK_FALSE(has(parts->backward.inputs, "c"));  // only its shape is stashed
    CHECK(has(parts->forward.inputs, "c"));
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

TEST_CASE("split_backward refuses a gradient model whose forward_nodes is out of range",
          "[train]") {
  const model::Model tf = transformer().model();
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

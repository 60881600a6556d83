// Tensor names as users give them (hp/model/names.h): exact names, PyTorch parameter names that
// torch.onnx renamed (the committed exports of tests/data/models are real torch 1.13 exports), and
// the "did you mean" list.
#include <catch2/catch.hpp>

#include "hp/model/graph.h"
#include "hp/model/names.h"

using namespace hp;
using namespace hp::model;

namespace {

Graph graph_of(const std::string& name) {
  auto m = load_model(std::string(HP_SOURCE_DIR) + "/tests/data/models/" + name + ".onnx");
  REQUIRE(m);
  auto g = build_graph(*m, {});
  REQUIRE(g);
  return std::move(*g);
}

}  // namespace

TEST_CASE("names: an exact name is found as it is, with no note", "[model]") {
  const Graph g = graph_of("user-llama-static");
  auto m = resolve_tensor_name(g, "embed_tokens.weight");
  REQUIRE(m);
  CHECK(g.tensor(m->tensor).name == "embed_tokens.weight");
  CHECK(m->note.empty());
}

TEST_CASE("names: a PyTorch name the exporter renamed is found through its reader's scope",
          "[model]") {
  const Graph g = graph_of("user-llama-static");
  // torch.onnx folded o_proj's transpose into onnx::MatMul_551, read by
  // /layers.0/self_attn/o_proj/MatMul.
  auto m = resolve_tensor_name(g, "layers.0.self_attn.o_proj.weight");
  REQUIRE(m);
  CHECK(g.tensor(m->tensor).name == "onnx::MatMul_551");
  CHECK(m->note.find("exported it as 'onnx::MatMul_551' [64, 64]") != std::string::npos);
  CHECK(m->note.find("node '/layers.0/self_attn/o_proj/MatMul'") != std::string::npos);
  auto down = resolve_tensor_name(g, "layers.1.mlp.down_proj.weight");
  REQUIRE(down);
  CHECK(g.tensor(down->tensor).name == "onnx::MatMul_578");
  // A scope with no renamed initializer resolves nothing (its parameters kept their names).
  auto norm = resolve_tensor_name(g, "layers.0.input_layernorm.bias");
  REQUIRE(!norm);
  CHECK(norm.error().code == Errc::bad_input);
}

TEST_CASE("names: an unknown name gets the closest names as suggestions", "[model]") {
  const Graph g = graph_of("user-llama-static");
  auto typo = resolve_tensor_name(g, "embed_token.weight");
  REQUIRE(!typo);
  CHECK(typo.error().message() == "the model has no tensor 'embed_token.weight'");
  CHECK(typo.error().what.hint.find("did you mean 'embed_tokens.weight'") == 0);
  // The trailing part of a real name.
  auto tail = similar_tensor_names(g, "input_layernorm.weight");
  REQUIRE(!tail.empty());
  CHECK(tail.front() == "layers.0.input_layernorm.weight");
  auto nothing = resolve_tensor_name(g, "zzzzzzzzzzzzzzzzzzzzzzzzzzzzz");
  REQUIRE(!nothing);
  CHECK(nothing.error().what.hint.find("did you mean") == std::string::npos);
}

TEST_CASE("names: flattened scopes (c_attn, c_attn_1) are suggested, not picked", "[model]") {
  // masked-gpt2's blocks were called from a plain list: their scopes lost the "h.N" above them.
  const Graph g = graph_of("masked-gpt2");
  auto m = resolve_tensor_name(g, "h.1.c_attn.weight");
  REQUIRE(!m);
  CHECK(m.error().what.hint.find("did you mean 'onnx::MatMul_235', 'onnx::MatMul_242'") == 0);
  // A misspelt module path suggests the name under the scope that resolves it.
  const Graph llama = graph_of("user-llama-static");
  auto typo = resolve_tensor_name(llama, "layers.0.self_atn.o_proj.weight");
  REQUIRE(!typo);
  CHECK(typo.error().what.hint.find("did you mean 'layers.0.self_attn.o_proj.weight'") == 0);
}

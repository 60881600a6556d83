// hp model-skeleton's generator (hp/model/skeleton.h): the presets summarize like the skeletons
// recipes/skeletons/gen_skeletons.py wrote (parameters, FLOPs and blocks from the model loader),
// parameter counts follow the closed-form formula for other sizes, config.json files and KEY=VALUE
// settings resolve in order, and malformed input is refused with the documented codes.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "hp/model/skeleton.h"
#include "hp/model/summary.h"
#include "model_test_util.h"

using namespace hp;
using namespace hp::model;
using namespace hp::model::test;

namespace {

ModelSummary summarize(const std::filesystem::path& p, std::int64_t seq) {
  auto s = summarize_model({p, {{"batch", 1}, {"seq", seq}}, false});
  INFO(p.string() << ": " << (s.ok() ? std::string() : s.error().str()));
  REQUIRE(s.ok());
  return std::move(*s);
}

SkeletonReport write(SkeletonOptions o) {
  auto r = write_skeleton(o);
  INFO((r.ok() ? std::string() : r.error().str()));
  REQUIRE(r.ok());
  return std::move(*r);
}

// Weights of a llama-style decoder, written out from the architecture (not from the generator).
std::int64_t llama_params(std::int64_t L, std::int64_t h, std::int64_t heads, std::int64_t kv,
                          std::int64_t ffn, std::int64_t vocab) {
  const std::int64_t hd = h / heads;
  const std::int64_t attn = 2 * h * h + 2 * h * kv * hd;
  return vocab * h * 2 + h + L * (attn + 3 * h * ffn + 2 * h);
}

}  // namespace

TEST_CASE("presets summarize like the checked-in gen_skeletons.py skeletons") {
  const auto dir = scratch_dir("model_skeleton_presets");
  const auto recipes = std::filesystem::path(HP_SOURCE_DIR) / "recipes/skeletons";
  for (const auto& name : skeleton_presets()) {
    INFO(name);
    SkeletonOptions o;
    o.preset = name;
    o.output = dir / (name + ".onnx");
    SkeletonReport r = write(o);
    ModelSummary mine = summarize(o.output, 512);
    ModelSummary theirs = summarize(recipes / (name + ".onnx"), 512);
    CHECK(mine.parameters == theirs.parameters);
    CHECK(r.parameters == theirs.parameters);
    CHECK(mine.flops == Approx(theirs.flops).epsilon(1e-12));
    CHECK(mine.matmul_flops == Approx(theirs.matmul_flops).epsilon(1e-12));
    CHECK(mine.layering.blocks.size() == theirs.layering.blocks.size());
    CHECK(mine.missing_external_data == theirs.missing_external_data);
    CHECK(r.bytes == std::filesystem::file_size(o.output));
  }
}

TEST_CASE("llama parameters follow the closed form for other sizes") {
  const auto dir = scratch_dir("model_skeleton_llama");
  SkeletonOptions o;
  o.arch = "llama";
  o.settings = {"layers=3", "hidden=256", "heads=8", "kv_heads=2", "ffn=704", "vocab=1000"};
  o.output = dir / "small.onnx";
  SkeletonReport r = write(o);
  const std::int64_t want = llama_params(3, 256, 8, 2, 704, 1000);
  CHECK(r.parameters == want);
  ModelSummary s = summarize(o.output, 16);
  CHECK(s.parameters == want);
  CHECK(s.layering.blocks.size() == 3);
  CHECK(s.unsupported_ops.empty());
  // 2*M*N*K per matmul: q,o (h x h), k,v (h x kv*hd), three MLP projections, the lm_head and the
  // two attention products (per head: s x hd x s), at batch 1, seq 16.
  const double T = 16, h = 256, kvhd = 64, ffn = 704, V = 1000, S = 16;
  const double per_layer = 2 * T * (2 * h * h + 2 * h * kvhd + 3 * h * ffn) + 2 * 2 * S * S * h;
  CHECK(s.matmul_flops == Approx(3 * per_layer + 2 * T * h * V));
}

TEST_CASE("gpt follows hidden for its MLP and heads for its key/value heads") {
  auto c = resolve_skeleton_config({"gpt", "", {}, {"hidden=512", "heads=8", "layers=2"}, "x"});
  REQUIRE(c.ok());
  CHECK(c->ffn == 2048);
  CHECK(c->kv_heads == 8);
  CHECK(c->tied);
  CHECK(c->positions == 2048);
  std::int64_t params = 0;
  REQUIRE(build_skeleton(*c, "g", &params).ok());
  const std::int64_t h = 512, f = 2048;
  const std::int64_t layer = 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h;
  CHECK(params == 50257 * h + 2048 * h + 2 * layer + 2 * h);
}

TEST_CASE("a Hugging Face config.json: Mixtral-style moe and llama") {
  const auto dir = scratch_dir("model_skeleton_hf");
  {
    std::ofstream(dir / "mixtral.json") << R"({"model_type": "mixtral", "hidden_size": 4096,
      "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
      "intermediate_size": 14336, "vocab_size": 32000, "max_position_embeddings": 32768,
      "num_local_experts": 8, "num_experts_per_tok": 2, "tie_word_embeddings": false})";
  }
  SkeletonOptions o;
  o.hf_config = dir / "mixtral.json";
  auto c = resolve_skeleton_config(o);
  REQUIRE(c.ok());
  CHECK(c->arch == SkeletonArch::moe);
  CHECK(c->experts == 8);
  CHECK(c->top_k == 2);
  CHECK(c->ffn == 14336);
  CHECK(c->dense_layers == 0);
  CHECK(c->shared == 0);
  CHECK(c->kv_heads == 8);
  o.output = dir / "mixtral.onnx";
  SkeletonReport r = write(o);
  // Embedding and lm_head, final norm, and per layer q/o, k/v, router, 8 experts' SwiGLU and two
  // norms: 46,702,792,704, the 46.7B Mistral publishes for Mixtral-8x7B.
  const std::int64_t h = 4096, L = 32;
  const std::int64_t want =
      2 * 32000 * h + h + L * (2 * h * h + 2 * h * 1024 + h * 8 + 8 * 3 * h * 14336 + 2 * h);
  CHECK(want == 46702792704);
  CHECK(r.parameters == want);
  CHECK(summarize(o.output, 64).parameters == want);

  std::ofstream(dir / "llama.json") << R"({"model_type": "llama", "hidden_size": 2048,
    "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
    "intermediate_size": 8192, "vocab_size": 128256, "tie_word_embeddings": true})";
  o.hf_config = dir / "llama.json";
  o.settings = {"layers=2"};  // settings win over the config
  c = resolve_skeleton_config(o);
  REQUIRE(c.ok());
  CHECK(c->arch == SkeletonArch::llama);
  CHECK(c->layers == 2);
  CHECK(c->ffn == 8192);
  CHECK(c->tied);
}

TEST_CASE("malformed skeleton input is refused with its code") {
  const auto dir = scratch_dir("model_skeleton_bad");
  auto code = [](SkeletonOptions o) {
    auto c = resolve_skeleton_config(o);
    REQUIRE_FALSE(c.ok());
    INFO(c.error().str());
    return c.error().code;
  };
  CHECK(code({"bert", "", {}, {}, ""}) == Errc::usage);
  CHECK(code({"", "llama3-9b", {}, {}, ""}) == Errc::usage);
  CHECK(code({"gpt", "llama3-8b", {}, {}, ""}) == Errc::usage);
  CHECK(code({"", "", {}, {}, ""}) == Errc::usage);
  CHECK(code({"llama", "", {}, {"depth=3"}, ""}) == Errc::usage);
  CHECK(code({"llama", "", {}, {"layers"}, ""}) == Errc::usage);
  CHECK(code({"llama", "", {}, {"layers=three"}, ""}) == Errc::bad_input);
  CHECK(code({"llama", "", {}, {"layers=3x"}, ""}) == Errc::bad_input);
  CHECK(code({"llama", "", {}, {"layers=99999999999999999999"}, ""}) == Errc::bad_input);
  CHECK(code({"llama", "", {}, {"tied=2"}, ""}) == Errc::bad_input);
  CHECK(code({"llama", "", {}, {"layers=0"}, ""}) == Errc::bad_input);
  CHECK(code({"llama", "", {}, {"hidden=4001", "heads=32"}, ""}) == Errc::bad_input);
  CHECK(code({"llama", "", {}, {"kv_heads=5"}, ""}) == Errc::bad_input);
  CHECK(code({"moe", "", {}, {"top_k=300"}, ""}) == Errc::bad_input);
  CHECK(code({"moe", "", {}, {"dense_layers=62"}, ""}) == Errc::bad_input);
  CHECK(code({"llama", "", {}, {"hidden=2147483647", "heads=1", "ffn=2147483647"}, ""}) ==
        Errc::bad_input);
  CHECK(code({"gpt",
              "",
              {},
              {"hidden=2147483647", "heads=1", "positions=2147483647", "vocab=1", "ffn=1"},
              ""}) == Errc::bad_input);
  // Every problem of one configuration at once.
  auto many = resolve_skeleton_config({"llama", "", {}, {"layers=0", "hidden=100", "heads=3"}, ""});
  REQUIRE_FALSE(many.ok());
  CHECK(many.error().all().size() >= 2);

  auto bad_json = [&](const char* name, const char* text) {
    std::ofstream(dir / name) << text;
    return code({"", "", dir / name, {}, ""});
  };
  CHECK(bad_json("trunc.json", R"({"hidden_size": 4096,)") == Errc::bad_input);
  CHECK(bad_json("array.json", "[1, 2]") == Errc::bad_input);
  CHECK(bad_json("string.json", R"({"model_type": "llama", "hidden_size": "4096"})") ==
        Errc::bad_input);
  CHECK(bad_json("float.json", R"({"model_type": "llama", "hidden_size": 4096.5})") ==
        Errc::bad_input);
  CHECK(bad_json("unknown.json", R"({"model_type": "t5", "hidden_size": 512})") == Errc::usage);
  CHECK(code({"", "", dir / "absent.json", {}, ""}) != Errc::internal);
  // No output file.
  auto w = write_skeleton({"llama", "", {}, {}, ""});
  REQUIRE_FALSE(w.ok());
  CHECK(w.error().code == Errc::usage);
}

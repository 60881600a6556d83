// Weight-less ONNX skeletons of decoder-only language models, behind `hp model-skeleton`.
//
// Planning a large model needs its graph and every weight's shape, not the weights: a user who has
// only a Hugging Face config.json (or a paper's table) should not have to export hundreds of GB of
// ONNX first. A skeleton has the real graph structure and each weight as a float16 initializer
// whose bytes live in an external file that does not exist (<name>.weights); the loader keeps the
// shapes, `hp plan` plans it like the full model and `hp plan --require-data` refuses it. The
// graphs are the ones recipes/skeletons/gen_skeletons.py writes (same ops, names and shapes; that
// script's docstring lists the simplifications: LayerNormalization for RMSNorm, no rotary
// embedding, balanced expert dispatch), so the checked-in recipe skeletons and these agree.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "hp/core/expected.h"

namespace hp::model {

enum class SkeletonArch {
  llama,  ///< pre-norm, grouped-query attention, SwiGLU MLP, no biases, untied lm_head
  gpt,    ///< GPT-2/3: biases, GELU MLP of 4 x hidden, learned positions, lm_head tied
  moe,    ///< llama-style attention; dense SwiGLU layers first, then routed + shared experts
};

/// Every number that shapes a skeleton. Sizes are counts (not bytes).
struct SkeletonConfig {
  SkeletonArch arch = SkeletonArch::llama;
  std::int64_t layers = 32;
  std::int64_t hidden = 4096;
  std::int64_t heads = 32;
  std::int64_t kv_heads = 8;  ///< key/value heads; must divide `heads`
  std::int64_t ffn = 14336;   ///< MLP width (moe: one routed expert's width)
  std::int64_t vocab = 128256;
  std::int64_t positions = 0;     ///< learned position table rows; 0 = none (rotary)
  bool tied = false;              ///< lm_head is the transposed token embedding
  bool bias = false;              ///< linear layers and norms carry biases
  std::int64_t dense_layers = 0;  ///< moe: the first layers with a dense MLP
  std::int64_t dense_ffn = 0;     ///< moe: their MLP width
  std::int64_t experts = 0;       ///< moe: routed experts per layer
  std::int64_t top_k = 0;         ///< moe: routed experts per token
  std::int64_t shared = 0;        ///< moe: always-on shared experts (each of width `ffn`)
};

/// `hp model-skeleton`'s command line.
struct SkeletonOptions {
  std::string arch;                   ///< llama | gpt | moe; empty: from the preset or config
  std::string preset;                 ///< llama3-8b | llama3-70b | gpt3-175b | deepseek-v3-moe
  std::filesystem::path hf_config;    ///< a Hugging Face config.json, optional
  std::vector<std::string> settings;  ///< KEY=VALUE overrides, applied last
  std::filesystem::path output;       ///< FILE.onnx (written atomically)
};

struct SkeletonReport {
  std::filesystem::path output;
  SkeletonConfig config;
  std::int64_t parameters = 0;  ///< sum of the weights' element counts
  std::size_t bytes = 0;        ///< size of the .onnx file
  std::string summary;          ///< what `hp model-skeleton` prints
};

/// The preset names, in the order `--help` lists them.
std::vector<std::string> skeleton_presets();

/// Resolves the configuration: the preset (or the architecture's default preset), then the
/// config.json's fields, then KEY=VALUE settings; validates the result. Errors: Errc::usage for
/// an unknown architecture, preset or key, Errc::bad_input for a non-numeric value, an unreadable
/// or malformed config.json and inconsistent sizes (heads not dividing hidden, ...).
Expected<SkeletonConfig> resolve_skeleton_config(const SkeletonOptions& opts);

/// Validates `c` (every problem at once; Errc::bad_input).
Status validate_skeleton_config(const SkeletonConfig& c);

/// A serialized ONNX ModelProto. `name` is the graph's name; the weights point at the absent
/// external file "<name>.weights". `parameters`, when given, receives the weights' element count.
Expected<std::string> build_skeleton(const SkeletonConfig& c, const std::string& name,
                                     std::int64_t* parameters = nullptr);

/// resolve_skeleton_config + build_skeleton (named after the output file's stem) + atomic write.
Expected<SkeletonReport> write_skeleton(const SkeletonOptions& opts);

}  // namespace hp::model

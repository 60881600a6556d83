// Where a skeleton's numbers come from: a named preset, a Hugging Face config.json, KEY=VALUE
// settings, in that order (later wins), then one validation pass that reports every problem.
//
// The presets are the models of recipes/skeletons/gen_skeletons.py with that script's numbers.
// config.json files name the same quantities differently per family (Llama/Mistral/Mixtral/
// DeepSeek use hidden_size, num_hidden_layers, ...; GPT-2 uses n_embd, n_layer, ...), so each of
// our keys has a list of the field names that may carry it; the first one present is taken.
#include <fmt/core.h>
#include <fmt/format.h>

#include <charconv>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "hp/core/fs.h"
#include "hp/model/skeleton.h"

namespace hp::model {
namespace {

struct Preset {
  const char* name;
  SkeletonConfig config;
};

SkeletonConfig llama(std::int64_t layers, std::int64_t h, std::int64_t ffn, std::int64_t heads,
                     std::int64_t kv) {
  SkeletonConfig c;
  c.arch = SkeletonArch::llama;
  c.layers = layers, c.hidden = h, c.ffn = ffn, c.heads = heads, c.kv_heads = kv;
  c.vocab = 128256;
  return c;
}

SkeletonConfig gpt3() {
  SkeletonConfig c;
  c.arch = SkeletonArch::gpt;
  c.layers = 96, c.hidden = 12288, c.heads = c.kv_heads = 96, c.ffn = 4 * 12288;
  c.vocab = 50257, c.positions = 2048, c.tied = true, c.bias = true;
  return c;
}

SkeletonConfig deepseek_v3() {
  SkeletonConfig c;
  c.arch = SkeletonArch::moe;
  c.layers = 61, c.hidden = 7168, c.heads = c.kv_heads = 128, c.vocab = 129280;
  c.dense_layers = 3, c.dense_ffn = 18432, c.experts = 256, c.top_k = 8, c.ffn = 2048;
  c.shared = 1;
  return c;
}

// The first preset of each architecture is its default.
const Preset kPresets[] = {
    {"llama3-8b", llama(32, 4096, 14336, 32, 8)},
    {"llama3-70b", llama(80, 8192, 28672, 64, 8)},
    {"gpt3-175b", gpt3()},
    {"deepseek-v3-moe", deepseek_v3()},
};

const char* arch_name(SkeletonArch a) {
  switch (a) {
    case SkeletonArch::gpt: return "gpt";
    case SkeletonArch::moe: return "moe";
    case SkeletonArch::llama: break;
  }
  return "llama";
}

std::optional<SkeletonArch> parse_arch(const std::string& s) {
  for (auto a : {SkeletonArch::llama, SkeletonArch::gpt, SkeletonArch::moe})
    if (s == arch_name(a)) return a;
  return std::nullopt;
}

// Our keys, the field that holds each, and the config.json names that may carry it.
struct Key {
  const char* name;
  std::int64_t SkeletonConfig::*field;
  bool flag;  // 0 or 1
  std::vector<const char*> hf;
  const char* help;
};

const std::vector<Key>& keys() {
  static const std::vector<Key> k = {
      {"layers", &SkeletonConfig::layers, false, {"num_hidden_layers", "n_layer"}, "blocks"},
      {"hidden", &SkeletonConfig::hidden, false, {"hidden_size", "n_embd"}, "model width"},
      {"heads", &SkeletonConfig::heads, false, {"num_attention_heads", "n_head"}, "query heads"},
      {"kv_heads", &SkeletonConfig::kv_heads, false, {"num_key_value_heads"}, "key/value heads"},
      {"ffn", &SkeletonConfig::ffn, false, {}, "MLP width (moe: one expert's)"},
      {"vocab", &SkeletonConfig::vocab, false, {"vocab_size"}, "vocabulary"},
      {"positions", &SkeletonConfig::positions, false, {}, "learned position rows (0: none)"},
      {"dense_layers",
       &SkeletonConfig::dense_layers,
       false,
       {"first_k_dense_replace"},
       "moe: leading dense layers"},
      {"dense_ffn", &SkeletonConfig::dense_ffn, false, {}, "moe: their MLP width"},
      {"experts",
       &SkeletonConfig::experts,
       false,
       {"n_routed_experts", "num_local_experts"},
       "moe: routed experts"},
      {"top_k", &SkeletonConfig::top_k, false, {"num_experts_per_tok"}, "moe: experts per token"},
      {"shared", &SkeletonConfig::shared, false, {"n_shared_experts"}, "moe: shared experts"},
  };
  return k;
}

std::string key_names() {
  std::string s;
  for (const auto& k : keys()) s += (s.empty() ? "" : ", ") + std::string(k.name);
  return s + ", tied, bias";
}

Expected<std::int64_t> parse_count(const std::string& key, const std::string& text,
                                   const std::string& where) {
  std::int64_t v = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || p != end)
    return Error(Errc::bad_input, fmt::format("'{}' needs a whole number, got '{}'", key, text),
                 where);
  return v;
}

// Which architecture a config.json describes, from its experts fields and model_type.
std::optional<SkeletonArch> hf_arch(const nlohmann::json& j) {
  if (j.contains("n_routed_experts") || j.contains("num_local_experts")) return SkeletonArch::moe;
  const std::string type = j.value("model_type", std::string());
  if (type == "gpt2" || type == "openai-gpt") return SkeletonArch::gpt;
  if (type == "llama" || type == "mistral" || type == "qwen2") return SkeletonArch::llama;
  return std::nullopt;
}

Expected<nlohmann::json> read_hf(const std::filesystem::path& path) {
  HP_ASSIGN_OR_RETURN(std::string text, read_file(path));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return Error(Errc::bad_input, fmt::format("not valid JSON: {}", e.what()), path.string());
  }
  if (!j.is_object())
    return Error(Errc::bad_input, "a config.json holds one JSON object", path.string());
  return j;
}

// The integer field `name` of `j`, if present; an error if present but not a whole number.
Expected<std::optional<std::int64_t>> hf_int(const nlohmann::json& j, const char* name,
                                             const std::string& where) {
  if (!j.contains(name) || j[name].is_null()) return std::optional<std::int64_t>();
  const auto& v = j[name];
  if (v.is_boolean()) return std::optional<std::int64_t>(v.get<bool>() ? 1 : 0);
  if (!v.is_number_integer())
    return Error(Errc::bad_input,
                 fmt::format("'{}' must be a whole number, got {}", name, v.dump()), where);
  return std::optional<std::int64_t>(v.get<std::int64_t>());
}

Status apply_hf(const nlohmann::json& j, const std::string& where, SkeletonConfig& c) {
  for (const auto& k : keys()) {
    for (const char* f : k.hf) {
      HP_ASSIGN_OR_RETURN(auto v, hf_int(j, f, where));
      if (v) {
        c.*k.field = *v;
        break;
      }
    }
  }
  // Per-family meanings of the MLP widths and defaults that differ from our presets'.
  HP_ASSIGN_OR_RETURN(auto inter, hf_int(j, "intermediate_size", where));
  HP_ASSIGN_OR_RETURN(auto n_inner, hf_int(j, "n_inner", where));
  HP_ASSIGN_OR_RETURN(auto moe_inter, hf_int(j, "moe_intermediate_size", where));
  HP_ASSIGN_OR_RETURN(auto kv, hf_int(j, "num_key_value_heads", where));
  HP_ASSIGN_OR_RETURN(auto tied, hf_int(j, "tie_word_embeddings", where));
  HP_ASSIGN_OR_RETURN(auto npos, hf_int(j, "max_position_embeddings", where));
  HP_ASSIGN_OR_RETURN(auto npos2, hf_int(j, "n_positions", where));
  if (!kv) c.kv_heads = c.heads;  // Hugging Face: absent means multi-head attention
  if (tied) c.tied = *tied != 0;
  switch (c.arch) {
    case SkeletonArch::gpt:
      c.ffn = n_inner ? *n_inner : 4 * c.hidden;
      if (npos2 || npos) c.positions = npos2 ? *npos2 : *npos;
      if (!tied) c.tied = true;  // GPT-2's default
      break;
    case SkeletonArch::moe:
      // DeepSeek: intermediate_size is the dense layers' width, moe_intermediate_size an
      // expert's. Mixtral: intermediate_size is an expert's and every layer is routed.
      if (moe_inter) {
        c.ffn = *moe_inter;
        if (inter) c.dense_ffn = *inter;
      } else if (inter) {
        c.ffn = *inter;
      }
      if (!j.contains("first_k_dense_replace")) c.dense_layers = 0;
      if (!j.contains("n_shared_experts")) c.shared = 0;
      break;
    case SkeletonArch::llama:
      if (inter) c.ffn = *inter;
      break;
  }
  return {};
}

Status apply_setting(const std::string& s, SkeletonConfig& c, std::set<std::string>& given) {
  const auto eq = s.find('=');
  if (eq == std::string::npos || eq == 0)
    return Error(Errc::usage, fmt::format("'{}' is not KEY=VALUE", s), "",
                 fmt::format("keys: {}", key_names()));
  const std::string key = s.substr(0, eq), text = s.substr(eq + 1);
  given.insert(key);
  if (key == "tied" || key == "bias") {
    HP_ASSIGN_OR_RETURN(std::int64_t v, parse_count(key, text, s));
    if (v != 0 && v != 1)
      return Error(Errc::bad_input, fmt::format("'{}' is 0 or 1, got {}", key, v), s);
    (key == "tied" ? c.tied : c.bias) = v == 1;
    return {};
  }
  for (const auto& k : keys()) {
    if (key != k.name) continue;
    HP_ASSIGN_OR_RETURN(c.*k.field, parse_count(key, text, s));
    return {};
  }
  return Error(Errc::usage, fmt::format("unknown key '{}'", key), s,
               fmt::format("keys: {}", key_names()));
}

}  // namespace

std::vector<std::string> skeleton_presets() {
  std::vector<std::string> out;
  for (const auto& p : kPresets) out.emplace_back(p.name);
  return out;
}

Status validate_skeleton_config(const SkeletonConfig& c) {
  std::vector<Diagnostic> d;
  auto need = [&](bool ok, std::string msg) {
    if (!ok) d.push_back({"", std::move(msg), ""});
  };
  // Each size stays below 2^31 so products of a few of them (a weight's element count, the
  // offsets into the absent file) cannot overflow int64.
  constexpr std::int64_t kMax = std::numeric_limits<std::int32_t>::max();
  auto positive = [&](const char* k, std::int64_t v) {
    need(v >= 1 && v <= kMax, fmt::format("{} must be between 1 and {}, got {}", k, kMax, v));
  };
  positive("layers", c.layers);
  positive("hidden", c.hidden);
  positive("heads", c.heads);
  positive("kv_heads", c.kv_heads);
  positive("ffn", c.ffn);
  positive("vocab", c.vocab);
  need(c.positions >= 0 && c.positions <= kMax,
       fmt::format("positions must be between 0 and {}, got {}", kMax, c.positions));
  if (c.heads >= 1 && c.hidden % c.heads != 0)
    d.push_back({"", fmt::format("heads ({}) must divide hidden ({})", c.heads, c.hidden), ""});
  if (c.kv_heads >= 1 && c.heads % c.kv_heads != 0)
    d.push_back({"", fmt::format("kv_heads ({}) must divide heads ({})", c.kv_heads, c.heads), ""});
  if (c.arch == SkeletonArch::moe) {
    positive("experts", c.experts);
    positive("top_k", c.top_k);
    need(c.top_k <= c.experts,
         fmt::format("top_k ({}) must not exceed experts ({})", c.top_k, c.experts));
    need(c.dense_layers >= 0 && c.dense_layers <= c.layers,
         fmt::format("dense_layers must be between 0 and layers ({}), got {}", c.layers,
                     c.dense_layers));
    if (c.dense_layers > 0) positive("dense_ffn", c.dense_ffn);
    need(c.shared >= 0 && c.shared <= 64,
         fmt::format("shared must be between 0 and 64, got {}", c.shared));
  }
  if (!d.empty()) return collect_errors(Errc::bad_input, std::move(d));
  // The weights' total must fit the int64 offsets of the external data.
  const double h = static_cast<double>(c.hidden);
  const double per_layer =
      4 * h * h + 3 * h * std::max(c.ffn, c.dense_ffn) *
                      static_cast<double>(std::max<std::int64_t>(1, c.experts + c.shared));
  const double tables = h * static_cast<double>(2 * c.vocab + c.positions);
  if ((per_layer * static_cast<double>(c.layers) + tables) * 2 > 4e18)
    return Error(Errc::bad_input, "the skeleton would have more than 2^61 bytes of weights");
  return {};
}

Expected<SkeletonConfig> resolve_skeleton_config(const SkeletonOptions& opts) {
  std::optional<SkeletonArch> arch;
  if (!opts.arch.empty()) {
    arch = parse_arch(opts.arch);
    if (!arch)
      return Error(Errc::usage, fmt::format("unknown architecture '{}'", opts.arch), "--arch",
                   "one of: llama, gpt, moe");
  }
  std::optional<nlohmann::json> hf;
  if (!opts.hf_config.empty()) {
    HP_ASSIGN_OR_RETURN(hf, read_hf(opts.hf_config));
    if (!arch) arch = hf_arch(*hf);
    if (!arch)
      return Error(Errc::usage, "cannot tell the architecture of this config.json",
                   opts.hf_config.string(), "pass --arch llama|gpt|moe");
  }
  const Preset* preset = nullptr;
  if (!opts.preset.empty()) {
    // "deepseek-v3" is the model's own name; the preset says "-moe" like its recipe skeleton.
    const std::string want = opts.preset == "deepseek-v3" ? "deepseek-v3-moe" : opts.preset;
    for (const auto& p : kPresets)
      if (want == p.name) preset = &p;
    if (!preset)
      return Error(Errc::usage, fmt::format("unknown preset '{}'", opts.preset), "--preset",
                   fmt::format("one of: {}", fmt::join(skeleton_presets(), ", ")));
    if (arch && *arch != preset->config.arch)
      return Error(Errc::usage,
                   fmt::format("preset '{}' is a {} model, not {}", preset->name,
                               arch_name(preset->config.arch), arch_name(*arch)),
                   "--arch");
  } else if (arch) {
    for (const auto& p : kPresets)
      if (p.config.arch == *arch && !preset) preset = &p;
  } else {
    return Error(Errc::usage, "say which model: --arch, --preset or --hf-config", "",
                 "e.g. hp model-skeleton --preset llama3-8b -o llama3-8b.onnx");
  }
  SkeletonConfig c = preset->config;
  if (hf) HP_TRY(apply_hf(*hf, opts.hf_config.string(), c));
  std::set<std::string> given;
  for (const auto& s : opts.settings) HP_TRY(apply_setting(s, c, given));
  // Sizes that follow others unless given: GPT's MLP is 4 x hidden, and a multi-head preset
  // (GPT-3, DeepSeek-V3) keeps one key/value head per query head when only heads= changes.
  if (c.arch == SkeletonArch::gpt && !given.count("ffn") && !(hf && hf->contains("n_inner")))
    c.ffn = 4 * c.hidden;
  if (!hf && !given.count("kv_heads") && preset->config.kv_heads == preset->config.heads)
    c.kv_heads = c.heads;
  HP_TRY(validate_skeleton_config(c));
  return c;
}

Expected<SkeletonReport> write_skeleton(const SkeletonOptions& opts) {
  if (opts.output.empty())
    return Error(Errc::usage, "no output file", "-o", "hp model-skeleton ... -o FILE.onnx");
  HP_ASSIGN_OR_RETURN(SkeletonConfig c, resolve_skeleton_config(opts));
  const std::string name = opts.output.stem().string();
  SkeletonReport r;
  HP_ASSIGN_OR_RETURN(std::string bytes, build_skeleton(c, name, &r.parameters));
  HP_TRY(write_file_atomic(opts.output, bytes));
  r.output = opts.output;
  r.config = c;
  r.bytes = bytes.size();
  r.summary = fmt::format(
      "wrote {}: {} model, {} layers, hidden {}, {} / {} heads, vocab {}{}; {} parameters "
      "({:.2f}B), {} bytes; weights absent ({}.weights)\n",
      opts.output.string(), arch_name(c.arch), c.layers, c.hidden, c.heads, c.kv_heads, c.vocab,
      c.arch == SkeletonArch::moe ? fmt::format(", {} experts (top {}, {} shared), expert ffn {}",
                                                c.experts, c.top_k, c.shared, c.ffn)
                                  : fmt::format(", ffn {}", c.ffn),
      r.parameters, static_cast<double>(r.parameters) / 1e9, r.bytes, name);
  return r;
}

}  // namespace hp::model

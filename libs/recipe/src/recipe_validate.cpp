// Semantic checks of a recipe. Parsing guarantees types; this file checks that the values make a
// runnable plan: degrees are positive, the schedule's constraints hold (interleaving needs virtual
// stages and micro-batches in multiples of pp, zbv exactly 2 virtual stages), stages partition the
// layers and have dp*tp ranks each, layouts are well-formed meshes (docs/shard.md, "Validation"),
// MPMD groups tile the world ranks in order (mpirun app contexts are consecutive rank blocks), and
// [offload] figures say where they came from. Checks that need the cluster (rank counts) are in
// validate_recipe_on_cluster().
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>

#include <fmt/core.h>

#include "hp/core/checked.h"
#include "hp/core/dtype.h"
#include "hp/core/optimizer.h"
#include "hp/recipe/names.h"
#include "hp/recipe/recipe.h"
#include "hp/recipe/toml_writer.h"
#include "toml_reader.h"

namespace hp::recipe {
namespace {

struct Checker {
  const SourceMap& where;
  std::vector<Diagnostic> out;
  void fail(std::string_view key, std::string message, std::string hint = {}) {
    out.push_back(Diagnostic{where.at(key), std::move(message), std::move(hint)});
  }
  void at_least(std::string_view key, std::int64_t v, std::int64_t min) {
    if (v < min) fail(key, fmt::format("'{}' must be at least {}, got {}", key, min, v));
  }
  // Degrees and counts are capped so that products of them (dp*tp*pp) cannot overflow.
  void in_range(std::string_view key, std::int64_t v, std::int64_t min,
                std::int64_t max = kMaxCount) {
    if (v < min)
      fail(key, fmt::format("'{}' must be at least {}, got {}", key, min, v));
    else if (v > max)
      fail(key, fmt::format("'{}' must be at most {}, got {}", key, max, v));
  }
  static constexpr std::int64_t kMaxCount = std::int64_t{1} << 20;
};

void check_parallel(Checker& ck, const Parallel& p) {
  ck.in_range("parallel.dp", p.dp, 1);
  ck.in_range("parallel.tp", p.tp, 1);
  ck.in_range("parallel.pp", p.pp, 1);
  ck.in_range("parallel.micro_batch_size", p.micro_batch_size, 1);
  ck.in_range("parallel.micro_batches", p.micro_batches, 1);
  ck.in_range("parallel.virtual_stages", p.virtual_stages, 1);
  ck.in_range("parallel.expert_parallel", p.expert_parallel, 1);
  // Checks that multiply degrees run only when the degrees are in range (no overflow, no noise).
  bool degrees_ok = true;
  for (auto v : {p.dp, p.tp, p.pp}) degrees_ok &= v >= 1 && v <= Checker::kMaxCount;
  if (p.optimizer_shard < 0 || p.optimizer_shard > 3)
    ck.fail("parallel.optimizer_shard",
            fmt::format("'parallel.optimizer_shard' must be 0..3, got {}", p.optimizer_shard),
            "levels: 0 none, 1 optimizer, 2 gradients, 3 parameters");
  if (p.shard_group < 0)
    ck.fail("parallel.shard_group",
            fmt::format("'parallel.shard_group' must be 0 (the whole data-parallel group) or more, "
                        "got {}",
                        p.shard_group));
  if (p.shard_group > 0 && p.dp >= 1 && p.dp % p.shard_group != 0)
    ck.fail(
        "parallel.shard_group",
        fmt::format("'parallel.shard_group' ({}) must divide dp ({})", p.shard_group, p.dp),
        "HSDP shards over groups of shard_group data-parallel ranks and replicates across them");
  if (p.shard_group > 0 && p.shard_group != p.dp && p.optimizer_shard == 0)
    ck.fail("parallel.shard_group",
            fmt::format("'parallel.shard_group' is {} but nothing is sharded (optimizer_shard is "
                        "none)",
                        p.shard_group),
            "HSDP needs optimizer_shard 1..3, or remove shard_group");
  if (p.zero3_per_step && p.optimizer_shard != 3)
    ck.fail("parallel.zero3_gather",
            fmt::format("'parallel.zero3_gather' is per-step but the parameters are not sharded "
                        "(optimizer_shard is {})",
                        optimizer_shard_name(p.optimizer_shard)),
            "set optimizer_shard = 3 (\"parameters\"), or remove zero3_gather");
  if (!(p.bucket_mb > 0) || p.bucket_mb > 1 << 20)
    ck.fail("parallel.bucket_mb",
            fmt::format("'parallel.bucket_mb' must be more than 0 MiB and at most 1 TiB, got {}",
                        p.bucket_mb),
            "the gradient bucket size in MiB; 16 by default, PyTorch DDP's default is 25");
  if (p.schedule == Schedule::zbv && p.virtual_stages != 2)
    ck.fail("parallel.virtual_stages",
            fmt::format("the zbv schedule runs 2 model chunks per rank, but "
                        "'parallel.virtual_stages' is {}",
                        p.virtual_stages),
            "leave virtual_stages out or set it to 2 (stages pp*2: the V of docs/schedules.md)");
  if (p.virtual_stages > 1 && p.schedule != Schedule::interleaved && p.schedule != Schedule::zbv)
    ck.fail("parallel.virtual_stages",
            fmt::format("'parallel.virtual_stages' is {} but the schedule is '{}'",
                        p.virtual_stages, schedule_name(p.schedule)),
            "virtual stages need schedule = \"interleaved\" (or \"zbv\", with 2)");
  if (p.schedule == Schedule::interleaved) {
    if (p.virtual_stages < 2)
      ck.fail("parallel.schedule",
              "the interleaved schedule needs 'parallel.virtual_stages' of at least 2",
              "set virtual_stages, or use schedule = \"1f1b\"");
    if (p.pp >= 1 && p.micro_batches % p.pp != 0)
      ck.fail("parallel.micro_batches",
              fmt::format("'parallel.micro_batches' ({}) must be a multiple of pp ({}) for the "
                          "interleaved schedule",
                          p.micro_batches, p.pp));
  }
  if (p.sequence_parallel && p.tp == 1)
    ck.fail("parallel.sequence_parallel", "sequence parallelism needs tp > 1",
            "it splits activations over the tensor-parallel group; set tp or sequence_parallel = "
            "false");
  if (degrees_ok && p.expert_parallel > 1 && (p.dp * p.tp) % p.expert_parallel != 0)
    ck.fail("parallel.expert_parallel",
            fmt::format("'parallel.expert_parallel' ({}) must divide dp*tp ({})", p.expert_parallel,
                        p.dp * p.tp));
}

void check_rank_list(Checker& ck, const std::string& key, const std::vector<std::int64_t>& ranks) {
  std::set<std::int64_t> seen;
  for (auto r : ranks) {
    if (r < 0) ck.fail(key, fmt::format("'{}' has negative rank {}", key, r));
    if (!seen.insert(r).second) ck.fail(key, fmt::format("'{}' lists rank {} twice", key, r));
  }
}

void check_stages(Checker& ck, const Recipe& r) {
  if (r.stages.empty()) return;
  const Parallel& p = r.parallel;
  for (auto v : {p.dp, p.tp, p.pp, p.virtual_stages})
    if (v < 1 || v > Checker::kMaxCount) return;  // reported by check_parallel
  std::int64_t want = p.pp * p.virtual_stages;
  if (static_cast<std::int64_t>(r.stages.size()) != want)
    ck.fail(
        "stages",
        fmt::format("the recipe has {} stages but pp*virtual_stages is {}", r.stages.size(), want),
        "write one [[stages]] entry per pipeline stage (and per virtual stage when interleaved)");
  std::map<std::int64_t, std::int64_t> layer_owner;
  std::set<std::int64_t> indices;
  for (std::size_t i = 0; i < r.stages.size(); ++i) {
    const Stage& s = r.stages[i];
    std::string key = fmt::format("stages[{}]", i);
    if (s.index != static_cast<std::int64_t>(i))
      ck.fail(key + ".index", fmt::format("'{}.index' is {}, expected {}", key, s.index, i),
              "stages are listed in order, starting at 0");
    indices.insert(s.index);
    if (s.layers.empty()) ck.fail(key + ".layers", fmt::format("stage {} has no layers", s.index));
    if (!std::is_sorted(s.layers.begin(), s.layers.end()))
      ck.fail(key + ".layers",
              fmt::format("the layers of stage {} are not in ascending order", s.index));
    for (auto l : s.layers) {
      if (l < 0)
        ck.fail(key + ".layers", fmt::format("stage {} has negative layer {}", s.index, l));
      auto [it, fresh] = layer_owner.emplace(l, s.index);
      if (!fresh)
        ck.fail(key + ".layers",
                fmt::format("layer {} is in stage {} and stage {}", l, it->second, s.index));
    }
    // Overrides name layers of this stage, each at most once.
    std::map<std::int64_t, Recompute> overridden;
    for (const auto& [mode, layers] : s.recompute_layers)
      for (auto l : layers) {
        if (!std::binary_search(s.layers.begin(), s.layers.end(), l))
          ck.fail(key + ".recompute_layers",
                  fmt::format("'{}.recompute_layers.{}' names layer {}, which is not in stage {}",
                              key, recompute_name(mode), l, s.index),
                  "list only layers of the stage's 'layers'");
        else if (auto [it, fresh] = overridden.emplace(l, mode); !fresh)
          ck.fail(key + ".recompute_layers",
                  fmt::format("layer {} of stage {} is both '{}' and '{}' in 'recompute_layers'", l,
                              s.index, recompute_name(it->second), recompute_name(mode)));
      }
    if (!s.ranks.empty() && static_cast<std::int64_t>(s.ranks.size()) != p.dp * p.tp)
      ck.fail(key + ".ranks", fmt::format("stage {} has {} ranks but dp*tp is {}", s.index,
                                          s.ranks.size(), p.dp * p.tp));
    check_rank_list(ck, key + ".ranks", s.ranks);
  }
  // Layers must be covered without gaps: a missing layer would silently drop part of the model.
  std::int64_t expect = 0;
  for (auto [layer, stage] : layer_owner) {
    if (layer != expect) {
      ck.fail("stages", fmt::format("layer {} is in no stage", expect),
              "stages must cover layers 0..N-1");
      break;
    }
    ++expect;
  }
  // Without interleaving, a rank runs exactly one stage.
  if (p.virtual_stages == 1) {
    std::map<std::int64_t, std::int64_t> rank_stage;
    for (std::size_t i = 0; i < r.stages.size(); ++i)
      for (auto rank : r.stages[i].ranks)
        if (auto [it, fresh] = rank_stage.emplace(rank, r.stages[i].index);
            !fresh && it->second != r.stages[i].index)
          ck.fail(fmt::format("stages[{}].ranks", i),
                  fmt::format("rank {} runs stage {} and stage {}", rank, it->second,
                              r.stages[i].index));
  }
}

void check_layout(Checker& ck, const std::string& name, const Layout& l) {
  std::string key = "layouts." + toml_key(name);
  auto fail = [&](std::string_view sub, std::string msg, std::string hint = {}) {
    ck.fail(key + "." + std::string(sub), fmt::format("layout '{}': {}", name, msg),
            std::move(hint));
  };
  if (l.device_matrix.size() != l.alias_name.size())
    fail("alias_name", fmt::format("device_matrix has {} axes but alias_name has {}",
                                   l.device_matrix.size(), l.alias_name.size()));
  std::int64_t devices = 1;
  for (std::size_t i = 0; i < l.device_matrix.size(); ++i) {
    if (l.device_matrix[i] < 1 || l.device_matrix[i] > Checker::kMaxCount) {
      fail("device_matrix", fmt::format("axis {} has size {}", i, l.device_matrix[i]));
      devices = 0;
    } else if (devices > 0 && devices > Checker::kMaxCount / l.device_matrix[i]) {
      fail("device_matrix", fmt::format("the mesh has more than {} devices", Checker::kMaxCount));
      devices = 0;
    } else if (devices > 0) {
      devices *= l.device_matrix[i];
    }
  }
  std::set<std::string> aliases;
  for (const auto& a : l.alias_name) {
    if (a.empty() || a == "None")
      fail("alias_name", fmt::format("'{}' is not a valid axis name", a));
    if (!aliases.insert(a).second) fail("alias_name", fmt::format("alias '{}' appears twice", a));
  }
  std::set<std::string> used;
  for (std::size_t d = 0; d < l.tensor_map.size(); ++d)
    for (const auto& a : l.tensor_map[d]) {
      if (!aliases.count(a)) fail("tensor_map", fmt::format("axis '{}' is not in alias_name", a));
      if (!used.insert(a).second)
        fail("tensor_map", fmt::format("axis '{}' shards more than one dimension", a));
    }
  if (!l.rank_list.empty() && devices > 0 &&
      static_cast<std::int64_t>(l.rank_list.size()) != devices)
    fail("rank_list",
         fmt::format("rank_list has {} entries, mesh has {} devices", l.rank_list.size(), devices));
  check_rank_list(ck, key + ".rank_list", l.rank_list);
}

// Names become paths (runs/<name>/...) and words of launcher files (mpirun app files, srun
// --multi-prog), so they are identifiers: nothing a file system or a launcher would read as syntax.
void check_identifier(Checker& ck, const std::string& key, const std::string& v) {
  if (v.empty()) return;  // reported as empty by the caller
  if (auto why = identifier_problem(v))
    ck.fail(key, fmt::format("'{}' is not a valid name: {}", key, *why),
            fmt::format("use up to {} letters, digits, '-', '_' and '.', not starting with '.'",
                        kMaxNameLength));
}

// A recipe's group environment may not choose the code a rank loads (the dynamic loader's
// variables, hp's own plugin and library paths) unless the user trusts it on the command line.
void check_group_env(Checker& ck, const std::string& key, const Group& g) {
  for (const auto& [k, v] : g.env) {
    const std::string at = key + ".env." + toml_key(k);
    if (!is_env_name(k))
      ck.fail(at,
              fmt::format("group '{}': '{}' is not a valid environment variable name", g.name, k),
              "names are letters, digits and '_', not starting with a digit");
    else if (is_loader_env(k) && !recipe_env_allowed(k))
      ck.fail(at,
              fmt::format("group '{}' sets {}, which chooses code the ranks load; a recipe may not "
                          "set it",
                          g.name, k),
              fmt::format("if you trust this recipe, pass --allow-recipe-env {}", k));
    if (v.find_first_of(std::string("\0\n\r", 3)) != std::string::npos)
      ck.fail(at, fmt::format("group '{}': the value of {} holds a NUL or line break", g.name, k));
  }
}

void check_groups(Checker& ck, const Recipe& r) {
  std::set<std::string> names;
  std::int64_t next = 0;  // MPMD app contexts are consecutive rank blocks, in order
  for (std::size_t i = 0; i < r.groups.size(); ++i) {
    const Group& g = r.groups[i];
    std::string key = fmt::format("groups[{}]", i);
    if (g.name.empty()) ck.fail(key + ".name", fmt::format("'{}.name' must not be empty", key));
    check_identifier(ck, key + ".name", g.name);
    check_group_env(ck, key, g);
    if (!names.insert(g.name).second)
      ck.fail(key + ".name", fmt::format("group '{}' appears twice", g.name));
    if (g.ranks.empty()) {
      ck.fail(key + ".ranks", fmt::format("group '{}' has no ranks", g.name));
      continue;
    }
    std::vector<std::int64_t> want(g.ranks.size());
    std::iota(want.begin(), want.end(), next);
    if (g.ranks != want)
      ck.fail(key + ".ranks",
              fmt::format("group '{}' has ranks {} but must have {}", g.name,
                          format_ranges(g.ranks), format_ranges(want)),
              "groups are mpirun app contexts: consecutive rank blocks, in the order listed");
    next += static_cast<std::int64_t>(g.ranks.size());
  }
}

void check_offload(Checker& ck, const Offload& o) {
  static const std::set<std::string> targets{"parameters", "gradients", "optimizer", "activations",
                                             "kv_cache"};
  for (const auto& t : o.targets)
    if (!targets.count(t))
      ck.fail("offload.targets", fmt::format("unknown offload target '{}'", t),
              "targets: parameters, gradients, optimizer, activations, kv_cache");
  if (!(o.margin >= 0 && o.margin <= 0.5))  // also false for nan
    ck.fail("offload.margin",
            fmt::format("'offload.margin' must be between 0 and 0.5, got {}", o.margin));
  ck.in_range("offload.prefetch_lookahead", o.prefetch_lookahead, 1);
  if (!(o.device_budget >= 0) || !std::isfinite(o.device_budget))
    ck.fail("offload.device_budget",
            "'offload.device_budget' must be a finite, non-negative number of bytes");
  for (auto [key, v] : {std::pair{"h2d_bandwidth", &o.h2d_bandwidth},
                        {"d2h_bandwidth", &o.d2h_bandwidth},
                        {"host_memory", &o.host_memory}}) {
    std::string k = std::string("offload.") + key;
    if (!(v->value >= 0) || !std::isfinite(v->value))
      ck.fail(k, fmt::format("'{}' must be a finite, non-negative number", k));
    const std::string& s = v->source;
    bool known = s == "table" || s == "user" || s == "unknown" ||
                 (s.rfind("measured:", 0) == 0 && s.size() > 9);
    if (!known)
      ck.fail(k + "_source", fmt::format("'{}_source' is '{}'", k, s),
              "write \"table\", \"user\", \"unknown\" or \"measured:<probe> <date>\"");
  }
}

// The workload's names are checked with the parsers every tool uses, and its batch against the
// degrees: a recipe edited to a new dp but the old global batch would be priced for one step and
// run another.
void check_workload(Checker& ck, const Recipe& r) {
  const Workload& w = *r.workload;
  if (w.mode != "train" && w.mode != "infer")
    ck.fail("workload.mode",
            fmt::format("'workload.mode' must be train or infer, got '{}'", w.mode));
  if (auto d = parse_dtype(w.dtype); !d)
    ck.fail("workload.dtype", d.error().message(), d.error().what.hint);
  if (auto o = parse_optimizer(w.optimizer); !o)
    ck.fail("workload.optimizer", o.error().message(), o.error().what.hint);
  if (w.seq < 0) ck.fail("workload.seq", fmt::format("'workload.seq' must be >= 0, got {}", w.seq));
  if (w.global_batch < 0)
    ck.fail("workload.global_batch",
            fmt::format("'workload.global_batch' must be >= 0, got {}", w.global_batch));
  const Parallel& p = r.parallel;
  // Checked: each degree is validated on its own, so their product may still overflow.
  const auto dp_mbs = checked_mul(p.dp, p.micro_batch_size);
  const auto product = dp_mbs ? checked_mul(*dp_mbs, p.micro_batches) : std::nullopt;
  const std::int64_t step = product ? *product : 0;
  if (w.global_batch > 0 && !product)
    ck.fail("workload.global_batch",
            fmt::format("dp x micro_batch_size x micro_batches = {} x {} x {} overflows", p.dp,
                        p.micro_batch_size, p.micro_batches),
            "re-plan, or make the degrees agree with workload.global_batch");
  if (w.global_batch > 0 && step > 0 && w.global_batch != step)
    ck.fail("workload.global_batch",
            fmt::format("'workload.global_batch' is {} but dp x micro_batch_size x micro_batches "
                        "= {} x {} x {} = {}",
                        w.global_batch, p.dp, p.micro_batch_size, p.micro_batches, step),
            "re-plan, or make the two agree");
}

// [train]: names against the lists libs/train parses (hp/train/autodiff.h, optimizer.h; the recipe
// library sits below it, so the lists are repeated here), numbers against torch.optim's own checks
// (lr > 0, betas in [0, 1), eps > 0, ...). The comparisons are written so that NaN fails them.
void check_train(Checker& ck, const Recipe& r) {
  const Train& t = *r.train;
  auto one_of = [&](std::string_view key, const std::string& v,
                    std::initializer_list<std::string_view> names) {
    for (auto n : names)
      if (v == n) return;
    std::string list;
    for (auto n : names) list += (list.empty() ? "" : ", ") + std::string(n);
    std::string hint = detail::did_you_mean(v, std::vector<std::string_view>(names));
    ck.fail(key, fmt::format("'{}' must be one of {}, got '{}'", key, list, v),
            hint.empty() ? "valid values: " + list : hint);
  };
  one_of("train.loss", t.loss, {"cross_entropy", "mse"});
  one_of("train.optimizer", t.optimizer, {"adamw", "sgd"});
  one_of("train.lr_schedule", t.lr_schedule, {"constant", "cosine"});
  if (t.logits.empty()) ck.fail("train.logits", "'train.logits' must name a graph output");
  if (t.labels.empty()) ck.fail("train.labels", "'train.labels' must name the labels tensor");
  auto positive = [&](std::string_view key, double v) {
    if (!(v > 0) || !std::isfinite(v))
      ck.fail(key, fmt::format("'{}' must be a finite number > 0, got {}", key, v));
  };
  auto non_negative = [&](std::string_view key, double v) {
    if (!(v >= 0) || !std::isfinite(v))
      ck.fail(key, fmt::format("'{}' must be a finite number >= 0, got {}", key, v));
  };
  auto unit = [&](std::string_view key, double v) {
    if (!(v >= 0 && v < 1)) ck.fail(key, fmt::format("'{}' must be in [0, 1), got {}", key, v));
  };
  positive("train.lr", t.lr);
  if (t.betas.size() != 2) {
    ck.fail("train.betas", fmt::format("'train.betas' must hold 2 numbers, got {}", t.betas.size()),
            "write betas = [beta1, beta2], e.g. [0.9, 0.999]");
  } else {
    unit("train.betas", t.betas[0]);
    unit("train.betas", t.betas[1]);
  }
  positive("train.eps", t.eps);
  non_negative("train.weight_decay", t.weight_decay);
  unit("train.momentum", t.momentum);
  non_negative("train.clip_norm", t.clip_norm);
  non_negative("train.min_lr", t.min_lr);
  if (t.min_lr > t.lr && t.lr > 0)
    ck.fail("train.min_lr",
            fmt::format("'train.min_lr' is {} but 'train.lr' is only {}", t.min_lr, t.lr),
            "the cosine schedule decays from lr down to min_lr");
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  ck.in_range("train.warmup_steps", t.warmup_steps, 0, kMax);
  ck.in_range("train.steps", t.steps, 1, kMax);
  ck.in_range("train.seed", t.seed, 0, kMax);
  for (std::size_t i = 0; i < t.frozen.size(); ++i)
    if (t.frozen[i].empty())
      ck.fail("train.frozen", fmt::format("'train.frozen[{}]' is an empty pattern", i));
  // An inference plan holds no gradients or optimizer states: training would not fit its memory.
  if (r.workload && r.workload->mode == "infer")
    ck.fail("train", "the recipe has a [train] table but was planned for inference",
            "re-plan with hp plan --mode train, or remove [train]");
}

}  // namespace

std::vector<Diagnostic> validate_recipe(const Recipe& r, const SourceMap& where) {
  Checker ck{where, {}};
  if (r.name.empty()) ck.fail("recipe.name", "'recipe.name' must not be empty");
  check_identifier(ck, "recipe.name", r.name);
  if (r.model.empty())
    ck.fail("recipe.model", "'recipe.model' must not be empty",
            "give the ONNX file, relative to the recipe");
  if (r.cluster.empty())
    ck.fail("recipe.cluster", "'recipe.cluster' must not be empty",
            "give a preset name or a cluster file");
  ck.in_range("recipe.nodes", r.nodes, 1);
  for (const auto& [dim, v] : r.dims)
    if (v < 1)
      ck.fail("model.dims." + dim, fmt::format("dim '{}' must be at least 1, got {}", dim, v));
  check_parallel(ck, r.parallel);
  check_stages(ck, r);
  for (const auto& [name, layout] : r.layouts) check_layout(ck, name, layout);
  check_groups(ck, r);
  if (r.offload) check_offload(ck, *r.offload);
  if (r.workload) check_workload(ck, r);
  if (r.train) check_train(ck, r);
  return std::move(ck.out);
}

std::vector<Diagnostic> validate_recipe_on_cluster(const Recipe& r, const SourceMap& where,
                                                   std::int64_t cluster_ranks,
                                                   const std::string& cluster_name,
                                                   bool cpu_ranks) {
  Checker ck{where, {}};
  const Parallel& p = r.parallel;
  if (!r.groups.empty() && r.device_ranks(cpu_ranks) != cluster_ranks)
    ck.fail(
        "groups",
        fmt::format("the [[groups]] hold {} {}ranks but cluster '{}' has {} ranks on {} node(s)",
                    r.device_ranks(cpu_ranks), cpu_ranks ? "" : "device (non-cpu) ", cluster_name,
                    cluster_ranks, r.nodes),
        "make [recipe] nodes give the cluster as many ranks as the groups hold");
  else if (r.groups.empty() && r.ranks() != cluster_ranks)
    ck.fail(
        "parallel",
        fmt::format("dp*tp*pp = {}*{}*{} = {} ranks but cluster '{}' has {} ranks on {} node(s)",
                    p.dp, p.tp, p.pp, r.ranks(), cluster_name, cluster_ranks, r.nodes),
        "make dp*tp*pp equal the cluster's ranks, or change [recipe] nodes");
  auto in_range = [&](const std::string& key, const std::vector<std::int64_t>& ranks) {
    for (auto rank : ranks)
      if (rank >= cluster_ranks) {
        ck.fail(key, fmt::format("'{}' names rank {} but cluster '{}' has ranks 0..{}", key, rank,
                                 cluster_name, cluster_ranks - 1));
        return;
      }
  };
  for (std::size_t i = 0; i < r.stages.size(); ++i)
    in_range(fmt::format("stages[{}].ranks", i), r.stages[i].ranks);
  for (const auto& [name, l] : r.layouts)
    in_range("layouts." + toml_key(name) + ".rank_list", l.rank_list);
  return std::move(ck.out);
}

}  // namespace hp::recipe

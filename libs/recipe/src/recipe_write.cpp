// Writing recipes. The output is deterministic and fully explicit: every section hp knows is
// written in the documented order with every key, defaults included, so a diff between two plans
// shows every decision that changed. Layers and ranks are written as range strings ("0-11") because
// a 384-rank stage as an integer array would swamp the file. parse_recipe(format_recipe(r)) == r is
// a tested invariant (tests/unit/recipe/recipe_test.cpp).
#include <fmt/core.h>
#include <algorithm>

#include "hp/core/fs.h"
#include "hp/recipe/recipe.h"
#include "hp/recipe/toml_writer.h"

namespace hp::recipe {

const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::gpipe: return "gpipe";
    case Schedule::one_f_one_b: return "1f1b";
    case Schedule::interleaved: return "interleaved";
    case Schedule::zb_h1: return "zb-h1";
    case Schedule::zbv: return "zbv";
  }
  return "1f1b";
}

Recompute Stage::recompute_of(std::int64_t layer) const {
  for (const auto& [mode, layers] : recompute_layers)
    if (std::find(layers.begin(), layers.end(), layer) != layers.end()) return mode;
  return recompute;
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::none: return "none";
    case Recompute::selective: return "selective";
    case Recompute::full: return "full";
  }
  return "none";
}

const char* optimizer_shard_name(int level) {
  static const char* names[] = {"none", "optimizer", "gradients", "parameters"};
  return level >= 0 && level <= 3 ? names[level] : "none";
}

namespace {

void format_layout(TomlWriter& w, const std::string& name, const Layout& l) {
  w.table("layouts", name)
      .value("device_matrix", toml_int_array(l.device_matrix))
      .value("alias_name", toml_string_array(l.alias_name));
  std::vector<std::string> map;  // per dim: "None", one alias, or a list of aliases
  for (const auto& axes : l.tensor_map)
    map.push_back(axes.empty()       ? toml_string("None")
                  : axes.size() == 1 ? toml_string(axes[0])
                                     : toml_string_array(axes));
  w.value("tensor_map", toml_array(map));
  if (!l.rank_list.empty()) w.value("rank_list", toml_int_array(l.rank_list));
}

void format_group(TomlWriter& w, const Group& g) {
  w.array_table("groups")
      .string("name", g.name)
      .string("ranks", format_ranges(g.ranks))
      .string("module", g.module)
      .string("backend", g.backend)
      .value("inputs", toml_string_array(g.inputs))
      .value("outputs", toml_string_array(g.outputs));
  std::vector<std::pair<std::string, std::string>> env;
  for (const auto& [k, v] : g.env) env.emplace_back(k, toml_string(v));
  w.value("env", toml_inline_table(env));
}

void format_offload(TomlWriter& w, const Offload& o) {
  w.table("offload").boolean("enabled", o.enabled).value("targets", toml_string_array(o.targets));
  for (auto [key, v] : {std::pair{"h2d_bandwidth", &o.h2d_bandwidth},
                        {"d2h_bandwidth", &o.d2h_bandwidth},
                        {"host_memory", &o.host_memory}})
    w.number(key, v->value).string(std::string(key) + "_source", v->source);
  w.number("margin", o.margin)
      .integer("prefetch_lookahead", o.prefetch_lookahead)
      .number("device_budget", o.device_budget);
}

void format_train(TomlWriter& w, const Train& t) {
  std::vector<std::string> betas;
  for (double b : t.betas) betas.push_back(toml_float(b));
  w.table("train")
      .string("loss", t.loss)
      .string("logits", t.logits)
      .string("labels", t.labels)
      .string("optimizer", t.optimizer)
      .number("lr", t.lr)
      .value("betas", toml_array(betas))
      .number("eps", t.eps)
      .number("weight_decay", t.weight_decay)
      .number("momentum", t.momentum)
      .number("clip_norm", t.clip_norm)
      .string("lr_schedule", t.lr_schedule)
      .integer("warmup_steps", t.warmup_steps)
      .number("min_lr", t.min_lr)
      .integer("steps", t.steps)
      .integer("seed", t.seed)
      .value("frozen", toml_string_array(t.frozen));
}

}  // namespace

std::string format_recipe(const Recipe& r) {
  TomlWriter w;
  w.comment("hp recipe (see hp-recipe(5)); paths are relative to this file");
  w.table("recipe")
      .integer("version", r.version)
      .string("name", r.name)
      .string("model", r.model)
      .string("cluster", r.cluster)
      .integer("nodes", r.nodes);
  std::vector<std::pair<std::string, std::string>> dims;
  for (const auto& [k, v] : r.dims) dims.emplace_back(k, toml_int(v));
  w.table("model").value("dims", toml_inline_table(dims));
  const Parallel& p = r.parallel;
  w.table("parallel")
      .integer("dp", p.dp)
      .integer("tp", p.tp)
      .integer("pp", p.pp)
      .string("optimizer_shard", optimizer_shard_name(p.optimizer_shard));
  if (p.shard_group > 0) w.integer("shard_group", p.shard_group);
  if (p.bucket_mb != Parallel{}.bucket_mb) w.number("bucket_mb", p.bucket_mb);
  w.integer("micro_batch_size", p.micro_batch_size)
      .integer("micro_batches", p.micro_batches)
      .string("schedule", schedule_name(p.schedule))
      .integer("virtual_stages", p.virtual_stages)
      .boolean("sequence_parallel", p.sequence_parallel)
      .integer("expert_parallel", p.expert_parallel);
  if (!p.routed_experts) w.string("expert_dispatch", "gather");
  if (p.zero3_per_step) w.string("zero3_gather", "per-step");
  for (const auto& st : r.stages) {
    w.array_table("stages")
        .integer("index", st.index)
        .string("layers", format_ranges(st.layers))
        .string("recompute", recompute_name(st.recompute));
    if (!st.recompute_layers.empty()) {
      std::vector<std::pair<std::string, std::string>> o;
      for (const auto& [mode, layers] : st.recompute_layers)
        o.emplace_back(recompute_name(mode), toml_string(format_ranges(layers)));
      w.value("recompute_layers", toml_inline_table(o));
    }
    w.string("ranks", format_ranges(st.ranks));
  }
  for (const auto& [name, l] : r.layouts) format_layout(w, name, l);
  for (const auto& g : r.groups) format_group(w, g);
  if (r.offload) format_offload(w, *r.offload);
  if (r.workload) {
    const Workload& wl = *r.workload;
    w.table("workload")
        .string("mode", wl.mode)
        .string("dtype", wl.dtype)
        .string("optimizer", wl.optimizer)
        .integer("global_batch", wl.global_batch)
        .integer("seq", wl.seq);
    if (!wl.command.empty()) w.string("command", wl.command);
  }
  if (r.train) format_train(w, *r.train);
  return std::move(w).str();
}

Status write_recipe(const Recipe& r, const std::filesystem::path& path) {
  return write_file_atomic(path, format_recipe(r));
}

}  // namespace hp::recipe

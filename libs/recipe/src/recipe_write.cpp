// Writing recipes. The output is deterministic and fully explicit: every section hp knows is written
// in the documented order with every key, defaults included, so a diff between two plans shows every
// decision that changed. Layers and ranks are written as range strings ("0-11") because a 384-rank
// stage as an integer array would swamp the file. parse_recipe(format_recipe(r)) == r is a tested
// invariant (tests/unit/recipe/recipe_test.cpp).
#include <algorithm>
#include <fmt/core.h>

#include "hp/core/fs.h"
#include "hp/recipe/recipe.h"
#include "toml_reader.h"
#include "toml_text.h"

namespace hp::recipe {

using detail::int_array;
using detail::key_text;
using detail::number;
using detail::quote;
using detail::string_array;

const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::gpipe: return "gpipe";
    case Schedule::one_f_one_b: return "1f1b";
    case Schedule::interleaved: return "interleaved";
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

std::string format_layout(const std::string& name, const Layout& l) {
  std::string s = fmt::format("\n[layouts.{}]\ndevice_matrix = {}\nalias_name = {}\n", key_text(name),
                              int_array(l.device_matrix), string_array(l.alias_name));
  std::string map = "[";
  for (std::size_t d = 0; d < l.tensor_map.size(); ++d) {
    const auto& axes = l.tensor_map[d];
    map += d ? ", " : "";
    if (axes.empty())
      map += "\"None\"";
    else if (axes.size() == 1)
      map += quote(axes[0]);
    else
      map += string_array(axes);
  }
  s += "tensor_map = " + map + "]\n";
  if (!l.rank_list.empty()) s += "rank_list = " + int_array(l.rank_list) + "\n";
  return s;
}

std::string format_group(const Group& g) {
  std::string s = fmt::format("\n[[groups]]\nname = {}\nranks = {}\nmodule = {}\nbackend = {}\n", quote(g.name),
                              quote(format_ranges(g.ranks)), quote(g.module), quote(g.backend));
  s += fmt::format("inputs = {}\noutputs = {}\n", string_array(g.inputs), string_array(g.outputs));
  std::string env;
  for (const auto& [k, v] : g.env) env += fmt::format("{}{} = {}", env.empty() ? "" : ", ", key_text(k), quote(v));
  s += "env = {" + (env.empty() ? std::string() : " " + env + " ") + "}\n";
  return s;
}

std::string format_offload(const Offload& o) {
  std::string s = fmt::format("\n[offload]\nenabled = {}\ntargets = {}\n", o.enabled ? "true" : "false",
                              string_array(o.targets));
  for (auto [key, v] : {std::pair{"h2d_bandwidth", &o.h2d_bandwidth}, {"d2h_bandwidth", &o.d2h_bandwidth},
                        {"host_memory", &o.host_memory}})
    s += fmt::format("{} = {}\n{}_source = {}\n", key, number(v->value), key, quote(v->source));
  s += fmt::format("margin = {}\nprefetch_lookahead = {}\ndevice_budget = {}\n", number(o.margin),
                   o.prefetch_lookahead, number(o.device_budget));
  return s;
}

}  // namespace

std::string format_recipe(const Recipe& r) {
  std::string s = "# hp recipe (see hp-recipe(5)); paths are relative to this file\n";
  s += fmt::format("[recipe]\nversion = {}\nname = {}\nmodel = {}\ncluster = {}\nnodes = {}\n", r.version, quote(r.name),
                   quote(r.model), quote(r.cluster), r.nodes);
  std::string dims;
  for (const auto& [k, v] : r.dims) dims += fmt::format("{}{} = {}", dims.empty() ? "" : ", ", key_text(k), v);
  s += "\n[model]\ndims = {" + (dims.empty() ? std::string() : " " + dims + " ") + "}\n";
  const Parallel& p = r.parallel;
  s += fmt::format("\n[parallel]\ndp = {}\ntp = {}\npp = {}\noptimizer_shard = {}\nmicro_batch_size = {}\n", p.dp, p.tp,
                   p.pp, quote(optimizer_shard_name(p.optimizer_shard)), p.micro_batch_size);
  s += fmt::format("micro_batches = {}\nschedule = {}\nvirtual_stages = {}\nsequence_parallel = {}\nexpert_parallel = {}\n",
                   p.micro_batches, quote(schedule_name(p.schedule)), p.virtual_stages,
                   p.sequence_parallel ? "true" : "false", p.expert_parallel);
  for (const auto& st : r.stages) {
    s += fmt::format("\n[[stages]]\nindex = {}\nlayers = {}\nrecompute = {}\n", st.index,
                     quote(format_ranges(st.layers)), quote(recompute_name(st.recompute)));
    if (!st.recompute_layers.empty()) {
      std::string o;
      for (const auto& [mode, layers] : st.recompute_layers)
        o += fmt::format("{}{} = {}", o.empty() ? "" : ", ", recompute_name(mode), quote(format_ranges(layers)));
      s += "recompute_layers = { " + o + " }\n";
    }
    s += fmt::format("ranks = {}\n", quote(format_ranges(st.ranks)));
  }
  for (const auto& [name, l] : r.layouts) s += format_layout(name, l);
  for (const auto& g : r.groups) s += format_group(g);
  if (r.offload) s += format_offload(*r.offload);
  return s;
}

Status write_recipe(const Recipe& r, const std::filesystem::path& path) {
  return write_file_atomic(path, format_recipe(r));
}

}  // namespace hp::recipe

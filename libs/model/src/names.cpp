// Resolving user-given tensor names (hp/model/names.h): exact names, PyTorch parameter names that
// torch.onnx renamed, and "did you mean" suggestions.
#include "hp/model/names.h"

#include <fmt/core.h>
#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <string_view>
#include <tuple>

namespace hp::model {
namespace {

// torch.onnx names a constant it creates (a folded Transpose of a parameter, a constant operand)
// "onnx::<consumer op>_<number>"; a parameter it keeps has its state_dict name.
bool renamed_by_exporter(const Tensor& t) {
  return t.kind == TensorKind::initializer && t.name.rfind("onnx::", 0) == 0;
}

// The module path of a node named by torch.onnx's scopes: "/blocks.0/attn/MatMul" ->
// "blocks.0.attn" (a ModuleList child is one segment, "blocks.0"). Nodes of other exporters, or
// without a scope, have none.
std::optional<std::string> module_of(const Node& n) {
  if (n.name.size() < 2 || n.name[0] != '/') return std::nullopt;
  const auto last = n.name.rfind('/');
  std::string path = n.name.substr(1, last == 0 ? 0 : last - 1);
  std::replace(path.begin(), path.end(), '/', '.');
  return path;
}

// The exporter-renamed initializers read by nodes directly in `module` (not in its submodules), in
// graph order, each with the first node reading it.
std::vector<std::pair<int, int>> renamed_in(const Graph& g, const std::string& module) {
  std::vector<std::pair<int, int>> out;
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (module_of(n) != module) continue;
    for (int t : n.inputs)
      if (t >= 0 && renamed_by_exporter(g.tensor(t)) &&
          std::none_of(out.begin(), out.end(), [&](const auto& p) { return p.first == t; }))
        out.emplace_back(t, static_cast<int>(i));
  }
  return out;
}

// The renamed initializers read in scopes named like the last segment of `module`, when the
// exporter dropped the path above it (modules called through a ModuleDict or a plain list become
// "/c_attn/", "/c_attn_1/", ... in call order): candidates to suggest, never to pick.
std::vector<int> renamed_in_like(const Graph& g, const std::string& module) {
  const std::string leaf = module.substr(module.rfind('.') + 1);
  std::vector<int> out;
  if (leaf.empty()) return out;
  for (const Node& n : g.nodes) {
    const auto m = module_of(n);
    if (!m || m->find('.') != std::string::npos || m->rfind(leaf, 0) != 0) continue;
    const std::string_view rest = std::string_view(*m).substr(leaf.size());
    const bool numbered = rest.size() > 1 && rest[0] == '_' &&
                          rest.find_first_not_of("0123456789", 1) == std::string_view::npos;
    if (!rest.empty() && !numbered) continue;
    for (int t : n.inputs)
      if (t >= 0 && renamed_by_exporter(g.tensor(t)) &&
          std::find(out.begin(), out.end(), t) == out.end())
        out.push_back(t);
  }
  return out;
}

// "blocks.0.attn.in_proj_weight" -> "blocks.0.attn"; "" for a name without a module.
std::string module_part(const std::string& name) {
  const auto dot = name.rfind('.');
  return dot == std::string::npos ? std::string() : name.substr(0, dot);
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::size_t common_suffix(std::string_view a, std::string_view b) {
  std::size_t n = 0;
  while (n < a.size() && n < b.size() && a[a.size() - 1 - n] == b[b.size() - 1 - n]) ++n;
  return n;
}

std::string dims_text(const Tensor& t) {
  std::vector<std::string> d;
  for (const auto& x : t.dims) d.push_back(x.known() ? std::to_string(x.value) : x.symbol);
  return fmt::format("[{}]", fmt::join(d, ", "));
}

}  // namespace

std::vector<std::string> similar_tensor_names(const Graph& g, const std::string& name,
                                              std::size_t limit) {
  std::vector<std::string> out;
  const std::string module = module_part(name);
  for (const auto& [t, node] : renamed_in(g, module))
    if (out.size() < limit) out.push_back(g.tensor(t).name);
  if (out.empty() && !module.empty()) {
    // A misspelt module path: the same parameter in the nearest scope that would resolve it.
    std::vector<std::pair<std::size_t, std::string>> scopes;
    const std::size_t near_scope = std::max<std::size_t>(1, module.size() / 4);
    for (const Node& n : g.nodes) {
      const auto m = module_of(n);
      if (!m || m->empty() ||
          std::any_of(scopes.begin(), scopes.end(), [&](const auto& s) { return s.second == *m; }))
        continue;
      if (const std::size_t d = edit_distance(module, *m);
          d <= near_scope && renamed_in(g, *m).size() == 1)
        scopes.emplace_back(d, *m);
    }
    std::sort(scopes.begin(), scopes.end());
    const std::string leaf = name.substr(module.size());
    for (const auto& [d, m] : scopes)
      if (out.size() < limit) out.push_back(m + leaf);
    for (int t : renamed_in_like(g, module))
      if (out.size() < limit) out.push_back(g.tensor(t).name);
  }
  // (a suffix of the name given? 0 : 1, distance, -common suffix, name) for names close enough to
  // be a typo, or of which the name given is the trailing part ("attn.in_proj_bias").
  std::vector<std::tuple<int, std::size_t, std::size_t, std::string>> ranked;
  const std::size_t near = std::max<std::size_t>(2, name.size() / 3);
  for (const auto& t : g.tensors) {
    if (std::find(out.begin(), out.end(), t.name) != out.end()) continue;
    const bool tail = t.name.size() > name.size() && common_suffix(t.name, name) == name.size() &&
                      t.name[t.name.size() - name.size() - 1] == '.';
    const std::size_t d = edit_distance(name, t.name);
    if (tail || d <= near)
      ranked.emplace_back(tail ? 0 : 1, d, name.size() - common_suffix(t.name, name), t.name);
  }
  std::sort(ranked.begin(), ranked.end());
  for (const auto& r : ranked)
    if (out.size() < limit) out.push_back(std::get<3>(r));
  return out;
}

Expected<NameMatch> resolve_tensor_name(const Graph& g, const std::string& name) {
  if (int t = g.find_tensor(name); t >= 0) return NameMatch{t, {}};
  const std::string module = module_part(name);
  const auto renamed = module.empty() ? decltype(renamed_in(g, "")){} : renamed_in(g, module);
  if (renamed.size() == 1) {
    const auto [t, node] = renamed.front();
    const Tensor& held = g.tensor(t);
    const std::string& reader = g.node(node).name;
    return NameMatch{
        t, fmt::format(
               "'{}' is not in the model under that name: torch.onnx exported it as '{}' "
               "{}, the one initializer it renamed among those read in scope '{}' "
               "(node '{}'); its dims are the parameter's transposed when the exporter folded a "
               "Transpose into it",
               name, held.name, dims_text(held), reader.substr(0, reader.rfind('/') + 1), reader)};
  }
  const auto close = similar_tensor_names(g, name);
  std::string hint;
  for (std::size_t i = 0; i < close.size(); ++i)
    hint += fmt::format("{}'{}'", i == 0 ? "" : i + 1 == close.size() ? " or " : ", ", close[i]);
  return Error(Errc::bad_input, fmt::format("the model has no tensor '{}'", name), "",
               hint.empty() ? std::string("'hp plan MODEL --summary' lists the model's layers")
                            : fmt::format("did you mean {}?", hint));
}

}  // namespace hp::model

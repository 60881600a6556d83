// Layer discovery: finding the repeated blocks of a model by structure.
//
// A pipeline stage boundary is cheap where exactly one tensor crosses it, and the models we plan
// are stacks of identical blocks joined by such tensors (the residual stream of a transformer, the
// hidden vector of an MLP). So the method is:
//
//  1. Spine. Take the activation nodes (those depending on input data; shape arithmetic and
//  constant
//     folding are side computations, see graph.cpp) in topological order, and compute for each gap
//     between consecutive nodes how many activation tensors are live across it. A gap where exactly
//     one tensor is live is a single-tensor cut: every path from the inputs to the outputs goes
//     through that tensor (it dominates the rest of the graph), so the graph can be split there
//     whatever the node order. Graph inputs and graph outputs do not count as live (a stage reads
//     inputs and emits outputs itself), and neither do "side" tensors: those computed only from
//     secondary inputs (an attention mask; the primary inputs are those read by a weighted op, like
//     token ids by the embedding), and those read all over the graph (a rotary table from
//     position ids, read by every layer).
//  2. Fingerprints. Between consecutive cuts lie segments. A segment's fingerprint is the sequence
//     of its activation nodes' op types with the shapes of the parameters they read (through the
//     Identity nodes by which exporters share equal initializers) — independent of names, so an
//     anonymised graph fingerprints the same, and blind to other constants, which exporters fold
//     in one layer and compute from shapes in the next. A pre-norm transformer layer gives two
//     segments (attention + residual add, MLP + residual add), an MLP layer two (Gemm, Relu).
//  3. Repetition. The blocks are the longest run of a repeated fingerprint pattern: for every
//  period
//     p we look for maximal stretches where segment i equals segment i+p; the run covering the most
//     segments wins (ties: smaller period, then a phase whose block starts with a weighted op, then
//     the earliest). What precedes the run is the prologue, what follows the epilogue.
//     Without any repetition (layers of different shapes), segments are grouped by the
//     "<word>.<index>" tokens of their node and weight names instead, when the graph has them.
//  4. Side nodes. Shape arithmetic and constant computations are attached to the unit (prologue,
//     block, epilogue) that consumes them; one consumed by several units goes to the earliest unit
//     that could compute it, so masks and rotary tables shared by all layers land in the prologue.
//
// Apart from that fallback, names only label blocks ("h.3", "layers.3") when the nodes or weights
// of every block agree on a "<word>.<index>" token; otherwise blocks are "block.<i>".
#include "hp/model/layers.h"

#include <algorithm>
#include <map>
#include <regex>
#include <set>

#include <fmt/core.h>

namespace hp::model {
namespace {

bool is_activation_node(const Graph& g, const Node& n) {
  for (int o : n.outputs)
    if (o >= 0 && g.tensor(o).kind == TensorKind::activation) return true;
  return false;
}

bool reads_data(const Node& n) { return n.op_type != "Shape" && n.op_type != "Size"; }

struct Spine {
  std::vector<int> order;             ///< activation node indices, topological
  std::vector<int> pos;               ///< node index -> position in order, -1 if not activation
  std::vector<std::size_t> cut_gaps;  ///< gap i lies between order[i] and order[i+1]
};

// A side tensor: read by many nodes spread over much of the graph (an attention mask built once
// from an input and read by every layer). `pos` is a provisional order of all activation nodes.
// Its readers must also form at least three clusters (readers closer than spread / (2 x readers)
// are one): the residual stream is read by a norm (two readers a few nodes apart) and by the
// residual add a sublayer later, two clusters, which in a two-layer model also spread over much of
// the graph.
bool is_side_tensor(const Graph& g, const Tensor& t, const std::vector<int>& pos, int n) {
  std::vector<int> at;
  for (int c : t.consumers) {
    int cp = pos[static_cast<std::size_t>(c)];
    if (cp < 0 || !reads_data(g.node(c))) continue;
    at.push_back(cp);
  }
  if (at.size() < 3) return false;
  std::sort(at.begin(), at.end());
  const int spread = at.back() - at.front();
  const int gap = spread / (2 * static_cast<int>(at.size()));
  int clusters = 1;
  for (std::size_t i = 1; i < at.size(); ++i) clusters += at[i] - at[i - 1] > gap;
  return clusters >= 3 && spread * 10 > n * 3;
}

bool has_weight_input(const Graph& g, const Node& n) {
  for (int i : n.inputs)
    if (i >= 0 &&
        (g.tensor(i).kind == TensorKind::initializer || g.tensor(i).kind == TensorKind::constant) &&
        g.tensor(i).is_float())
      return true;
  return false;
}

// Which nodes depend on a primary input: one read directly by a weighted op (token ids by the
// embedding Gather, pixels by the patch Conv). Inputs such as an attention mask are read by
// weightless ops (Cast, Unsqueeze) first; what is computed from them alone is side work, like shape
// arithmetic. When no input qualifies, all are primary.
std::vector<bool> primary_nodes(const Graph& g) {
  std::vector<bool> primary_tensor(g.tensors.size(), false);
  bool any = false;
  for (int in : g.inputs)
    for (int c : g.tensor(in).consumers)
      if (has_weight_input(g, g.node(c))) primary_tensor[static_cast<std::size_t>(in)] = any = true;
  if (!any)
    for (int in : g.inputs) primary_tensor[static_cast<std::size_t>(in)] = true;
  std::vector<bool> primary(g.nodes.size(), false);
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    for (int t : n.inputs)
      primary[i] = primary[i] || (t >= 0 && primary_tensor[static_cast<std::size_t>(t)]);
    if (!reads_data(n)) primary[i] = false;
    for (int o : n.outputs)
      if (o >= 0) primary_tensor[static_cast<std::size_t>(o)] = primary[i];
  }
  return primary;
}

// Side nodes: those not depending on a primary input, and those that only feed side tensors (the
// mask's own Cast/Sub/Mul chain). They are placed like shape arithmetic rather than splitting the
// spine.
std::vector<bool> find_side_nodes(const Graph& g) {
  std::vector<int> pos(g.nodes.size(), -1);
  int n = 0;
  for (std::size_t i = 0; i < g.nodes.size(); ++i)
    if (is_activation_node(g, g.nodes[i])) pos[i] = n++;
  std::vector<bool> primary = primary_nodes(g);
  std::vector<bool> side(g.nodes.size(), false);
  for (std::size_t i = g.nodes.size(); i-- > 0;) {
    if (pos[i] < 0) continue;
    if (!primary[i]) {
      side[i] = true;
      continue;
    }
    bool all_side = true, any_output = false;
    for (int o : g.nodes[i].outputs) {
      if (o < 0 || g.tensor(o).kind != TensorKind::activation) continue;
      const Tensor& t = g.tensor(o);
      bool only_side_readers = !t.consumers.empty();
      for (int c : t.consumers)
        only_side_readers = only_side_readers && side[static_cast<std::size_t>(c)];
      any_output = true;
      all_side = all_side && (is_side_tensor(g, t, pos, n) || only_side_readers);
    }
    side[i] = any_output && all_side;
  }
  return side;
}

Spine find_spine(const Graph& g) {
  Spine s;
  s.pos.assign(g.nodes.size(), -1);
  std::vector<bool> side = find_side_nodes(g);
  for (std::size_t i = 0; i < g.nodes.size(); ++i)
    if (is_activation_node(g, g.nodes[i]) && !side[i]) {
      s.pos[i] = static_cast<int>(s.order.size());
      s.order.push_back(static_cast<int>(i));
    }
  const auto n = static_cast<int>(s.order.size());
  if (n < 2) return s;
  // live: activation tensors produced at <= i and read at > i; id_sum: the sum of their ids + 1.
  std::vector<int> delta(static_cast<std::size_t>(n) + 1, 0);
  std::vector<long long> id_sum(static_cast<std::size_t>(n) + 1, 0);
  for (std::size_t t = 0; t < g.tensors.size(); ++t) {
    const Tensor& tensor = g.tensors[t];
    if (tensor.kind != TensorKind::activation || tensor.producer < 0) continue;
    int p = s.pos[static_cast<std::size_t>(tensor.producer)];
    if (p < 0) continue;
    int last = p;
    for (int c : tensor.consumers) {
      int cp = s.pos[static_cast<std::size_t>(c)];
      if (cp >= 0 && reads_data(g.node(c))) last = std::max(last, cp);
    }
    if (last <= p) continue;
    delta[static_cast<std::size_t>(p)] += 1;
    delta[static_cast<std::size_t>(last)] -= 1;
    id_sum[static_cast<std::size_t>(p)] += static_cast<long long>(t) + 1;
    id_sum[static_cast<std::size_t>(last)] -= static_cast<long long>(t) + 1;
  }
  int live = 0;
  long long live_id = 0, prev_id = -1;
  for (int i = 0; i + 1 < n; ++i) {
    live += delta[static_cast<std::size_t>(i)];
    live_id += id_sum[static_cast<std::size_t>(i)];
    // With one live tensor, id_sum is its id: consecutive gaps carrying the same tensor are one
    // cut.
    if (live == 1 && live_id != prev_id) s.cut_gaps.push_back(static_cast<std::size_t>(i));
    prev_id = live == 1 ? live_id : -1;
  }
  return s;
}

// The parameter an input reads, following the Identity nodes through which exporters share equal
// initializers between layers; -1 when the input is not a float initializer (shape constants, masks
// and zeros the exporter folded into Constants in one layer and computes in another).
int parameter_of(const Graph& g, int t) {
  for (int hops = 0; t >= 0 && hops < 8; ++hops) {
    const Tensor& tensor = g.tensor(t);
    if (tensor.kind == TensorKind::initializer) return tensor.is_float() ? t : -1;
    if (tensor.producer < 0 || g.node(tensor.producer).op_type != "Identity") return -1;
    t = g.node(tensor.producer).inputs.empty() ? -1 : g.node(tensor.producer).inputs[0];
  }
  return -1;
}

// A segment's weight-bearing structure: its activation ops with the shapes of the parameters they
// read. Other constant inputs are left out, as they differ between layers of one export.
std::string fingerprint(const Graph& g, const std::vector<int>& nodes) {
  std::string f;
  for (int i : nodes) {
    const Node& n = g.node(i);
    f += n.domain + ":" + n.op_type + "(";
    for (std::size_t k = 0; k < n.inputs.size(); ++k)
      if (n.inputs[k] >= 0 && parameter_of(g, n.inputs[k]) >= 0) f += n.weight_shapes[k] + ",";
    f += ");";
  }
  return f;
}

struct Run {
  std::size_t start = 0, period = 0, repeats = 0;
};

bool starts_weighted(const Graph& g, const std::vector<int>& seg) {
  if (seg.empty()) return false;
  for (const auto& w : g.node(seg.front()).weight_shapes)
    if (!w.empty()) return true;
  return false;
}

Run find_run(const Graph& g, const std::vector<std::vector<int>>& segs) {
  std::vector<std::size_t> id;
  std::map<std::string, std::size_t> ids;
  for (const auto& s : segs) id.push_back(ids.emplace(fingerprint(g, s), ids.size()).first->second);
  const std::size_t m = segs.size();
  Run best;
  auto better = [&](const Run& r) {
    std::size_t cov = r.period * r.repeats, best_cov = best.period * best.repeats;
    if (cov != best_cov) return cov > best_cov;
    if (r.period != best.period) return r.period < best.period;
    bool w = starts_weighted(g, segs[r.start]), bw = starts_weighted(g, segs[best.start]);
    if (w != bw) return w;
    return r.start < best.start;
  };
  for (std::size_t p = 1; p * 2 <= m; ++p) {
    std::size_t i = 0;
    while (i + p < m) {
      if (id[i] != id[i + p]) {
        ++i;
        continue;
      }
      std::size_t a = i;
      while (i + p < m && id[i] == id[i + p]) ++i;
      std::size_t len = i - a;  // segments a..a+len-1 equal their p-th successor
      std::size_t repeats = len / p + 1;
      for (std::size_t phase = 0; phase <= len % p; ++phase) {
        Run r{a + phase, p, repeats};
        if (repeats >= 2 && better(r)) best = r;
      }
    }
  }
  return best;
}

// "h.3" from nodes "/h.3/attn/MatMul" or weights "h.3.attn.c_attn.weight"; empty when absent.
std::string name_token(const Graph& g, const std::vector<int>& nodes) {
  static const std::regex token(R"(([A-Za-z_][A-Za-z0-9_]*)\.(\d+))");
  std::map<std::string, int> count;
  auto scan = [&](const std::string& s) {
    std::set<std::string> once;
    for (std::sregex_iterator it(s.begin(), s.end(), token), end; it != end; ++it)
      once.insert(it->str());
    for (const auto& t : once) ++count[t];
  };
  for (int i : nodes) {
    scan(g.node(i).name);
    for (int in : g.node(i).inputs)
      if (in >= 0 && g.tensor(in).kind == TensorKind::initializer) scan(g.tensor(in).name);
  }
  std::string best;
  int best_n = 0;
  for (const auto& [t, n] : count)
    if (n > best_n) best = t, best_n = n;
  return best_n * 2 >= static_cast<int>(nodes.size()) / 4 ? best : std::string();
}

// Fallback when no structural repetition exists (layers that differ in shape, say): group the
// segments by the "<word>.<index>" token of their names. Segments without a token join the group
// before them; those before the first group are the prologue, after the last the epilogue.
// Returns the unit of every segment (0 prologue, 1..n blocks, n+1 epilogue) and n, or n = 0.
int units_from_names(const Graph& g, const std::vector<std::vector<int>>& segs,
                     std::vector<int>& unit) {
  std::vector<std::string> tokens;
  std::map<std::string, int> words;
  for (const auto& seg : segs) {
    tokens.push_back(name_token(g, seg));
    if (!tokens.back().empty()) ++words[tokens.back().substr(0, tokens.back().rfind('.'))];
  }
  std::string word;
  int best = 0;
  for (const auto& [w, n] : words)
    if (n > best) word = w, best = n;
  if (word.empty()) return 0;
  unit.assign(segs.size(), 0);
  int blocks = 0;
  long last_index = -1;
  std::size_t last_named = 0;
  for (std::size_t s = 0; s < segs.size(); ++s) {
    const std::string& t = tokens[s];
    bool ours = !t.empty() && t.substr(0, t.rfind('.')) == word;
    if (ours) {
      long index = std::stol(t.substr(t.rfind('.') + 1));
      if (index < last_index) return 0;  // indices must run forward in execution order
      if (index != last_index) ++blocks;
      last_index = index;
      last_named = s;
    }
    unit[s] = blocks;
  }
  if (blocks < 2) return 0;
  for (std::size_t s = last_named + 1; s < segs.size(); ++s) unit[s] = blocks + 1;
  return blocks;
}

void name_blocks(const Graph& g, std::vector<Block>& blocks) {
  std::set<std::string> seen;
  std::string word;
  std::vector<std::string> tokens;
  bool ok = true;
  for (const auto& b : blocks) {
    std::string t = name_token(g, b.nodes);
    std::string w = t.substr(0, t.rfind('.'));
    ok = ok && !t.empty() && seen.insert(t).second && (word.empty() || w == word);
    word = w;
    tokens.push_back(t);
  }
  for (std::size_t i = 0; i < blocks.size(); ++i)
    blocks[i].name = ok ? tokens[i] : fmt::format("block.{}", i);
}

}  // namespace

// Defined in units.cpp: side-node placement, per-unit costs, cut tensors.
void place_side_nodes(const Graph& g, std::vector<int>& unit_of, int units);
void fill_units(const Graph& g, const std::vector<int>& unit_of, Layering& l);
void fill_cuts(const Graph& g, const std::vector<int>& unit_of, Layering& l);

Layering discover_layers(const Graph& g) {
  Layering l;
  l.prologue.name = "prologue";
  l.epilogue.name = "epilogue";
  Spine spine = find_spine(g);
  l.spine_tensors = static_cast<int>(spine.cut_gaps.size());
  std::vector<std::vector<int>> segs(1);
  std::size_t next_cut = 0;
  for (std::size_t i = 0; i < spine.order.size(); ++i) {
    segs.back().push_back(spine.order[i]);
    if (next_cut < spine.cut_gaps.size() && spine.cut_gaps[next_cut] == i) {
      segs.emplace_back();
      ++next_cut;
    }
  }
  Run run = find_run(g, segs);
  // Unit numbering: 0 prologue, 1..blocks, blocks+1 epilogue.
  int blocks = static_cast<int>(run.repeats);
  std::vector<int> seg_unit(segs.size(), 0);
  for (std::size_t s = 0; blocks > 0 && s < segs.size(); ++s) {
    if (s < run.start) continue;
    std::size_t k = (s - run.start) / run.period;
    seg_unit[s] = k < run.repeats ? static_cast<int>(k) + 1 : blocks + 1;
  }
  l.method = blocks > 0 ? "structure" : "none";
  if (blocks == 0 && (blocks = units_from_names(g, segs, seg_unit)) > 0) l.method = "names";
  std::vector<int> unit_of(g.nodes.size(), -1);
  for (std::size_t s = 0; s < segs.size(); ++s)
    for (int n : segs[s]) unit_of[static_cast<std::size_t>(n)] = seg_unit[s];
  l.blocks.resize(static_cast<std::size_t>(blocks));
  place_side_nodes(g, unit_of, blocks + 2);
  fill_units(g, unit_of, l);
  name_blocks(g, l.blocks);
  fill_cuts(g, unit_of, l);
  return l;
}

}  // namespace hp::model

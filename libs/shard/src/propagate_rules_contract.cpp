// Contraction rules (docs/shard.md, "Propagation"): MatMul/Gemm (column- and row-parallel, a split
// contracting dim gives Partial(sum)), Einsum, Gather as vocabulary-parallel embedding, Conv over
// batch and output channels.
#include <algorithm>
#include <map>
#include <set>

#include "hp/shard/propagate.h"
#include "propagate_rule_util.h"
#include "propagate_rules.h"

namespace hp::shard::detail {
namespace {

// MatMul / Gemm (docs/shard.md, "Propagation"). Index maps say where M, K (of A) and K, N (of B)
// sit.
struct MMIdx {
  int aM, aK, bK, bN;
};

bool is_graph_output(const model::Graph& g, int t) {
  return std::find(g.outputs.begin(), g.outputs.end(), t) != g.outputs.end();
}

// The k of a fused projection (propagate.h): the MatMul's output, through an Add of a 1-D weight
// bias read nowhere else, is read only by Splits of its last dim into k equal parts or Reshapes to
// [.., k, H, D, ..] with H divisible by `n`, and each of the k blocks divides by n. 0 otherwise.
std::int64_t fused_blocks(const RuleContext& c, std::int64_t n) {
  const auto& g = *c.graph;
  if (c.node_index < 0) return 0;
  const auto& mm = g.node(c.node_index);
  if (mm.outputs.empty() || mm.outputs[0] < 0) return 0;
  int y = mm.outputs[0];
  auto shape = global_shape(g.tensor(y));
  if (shape.size() < 2) return 0;
  std::size_t R = shape.size();
  std::int64_t N = shape[R - 1];
  int z = y;
  const auto& yc = g.tensor(y).consumers;
  if (is_graph_output(g, y) || yc.empty()) return 0;
  if (yc.size() == 1 && g.node(yc[0]).op_type == "Add" && g.node(yc[0]).inputs.size() == 2) {
    const auto& add = g.node(yc[0]);
    int other = add.inputs[0] == y ? add.inputs[1] : add.inputs[0];
    const auto& b = g.tensor(other);
    if (other >= 0 && b.kind == model::TensorKind::initializer && b.dims.size() == 1 &&
        b.dims[0].value == N && b.consumers.size() == 1 && !add.outputs.empty() &&
        add.outputs[0] >= 0)
      z = add.outputs[0];
  }
  if (z == y && yc.size() == 1 && g.node(yc[0]).op_type == "Add")
    return 0;  // an Add this does not know
  const auto& zc = g.tensor(z).consumers;
  if (is_graph_output(g, z) || zc.empty()) return 0;
  std::int64_t k = 0;
  for (int ci : zc) {
    const auto& n2 = g.node(ci);
    const auto& pn = c.proto->node(ci);
    std::int64_t kk = 0;
    if (n2.op_type == "Split" && !n2.inputs.empty() && n2.inputs[0] == z) {
      if (norm_axis(attr_int(pn, "axis", 0), R) != static_cast<int>(R - 1) || n2.outputs.size() < 2)
        return 0;
      kk = static_cast<std::int64_t>(n2.outputs.size());
      for (int o : n2.outputs) {
        if (o < 0) return 0;
        auto os = global_shape(g.tensor(o));
        if (os.size() != R || os[R - 1] * kk != N) return 0;
      }
    } else if (n2.op_type == "Reshape" && !n2.inputs.empty() && n2.inputs[0] == z &&
               !n2.outputs.empty() && n2.outputs[0] >= 0) {
      auto os = global_shape(g.tensor(n2.outputs[0]));
      // [.., k, heads, head_dim]: a plain head reshape [.., heads, head_dim] is not fused.
      if (os.size() < R + 2 || !std::equal(shape.begin(), shape.end() - 1, os.begin())) return 0;
      std::int64_t rest = 1;
      for (std::size_t d = R; d < os.size(); ++d) rest *= os[d];
      kk = os[R - 1];
      if (kk * rest != N || os[R] % n != 0) return 0;
    } else {
      return 0;
    }
    if (k != 0 && kk != k) return 0;
    k = kk;
  }
  if (k < 2 || N % k != 0 || (N / k) % n != 0) return 0;
  return k;
}

}  // namespace

RuleResult matmul(const RuleContext& c, bool gemm) {
  RuleResult r = base(c);
  const auto& A = c.in[0];
  const auto& B = c.in[1];
  std::size_t ra = A.shape.size(), rb = B.shape.size();
  if (ra < 2 || rb < 2) return replicate_all(c);
  MMIdx ix{static_cast<int>(ra) - 2, static_cast<int>(ra) - 1, static_cast<int>(rb) - 2,
           static_cast<int>(rb) - 1};
  if (gemm) {
    bool ta = attr_int(*c.node, "transA", 0) != 0, tb = attr_int(*c.node, "transB", 0) != 0;
    ix = MMIdx{ta ? 1 : 0, ta ? 0 : 1, tb ? 1 : 0, tb ? 0 : 1};
  }
  Sharding sa = A.flexible ? Sharding::replicated(ra) : A.cur;
  Sharding sb = B.flexible ? Sharding::replicated(rb) : B.cur;
  sa.partial.clear();
  sb.partial.clear();
  std::size_t R = std::max(ra, rb);
  std::size_t nb = R - 2;  // batch dims of the output
  auto batch_of = [&](const Sharding& s, std::size_t rs, std::size_t d) -> const Entry* {
    // output batch dim d -> the operand's dim, right-aligned; nullptr when absent
    if (d + rs < R) return nullptr;
    return &s.dims[d + rs - R];
  };
  const bool tp = c.tp_axis >= 0 && c.mesh->dims[static_cast<std::size_t>(c.tp_axis)] > 1;
  // Default layout of a weight operand, from the activation reaching it.
  if (B.flexible && !A.flexible) {
    const Entry& aK = sa.dims[static_cast<std::size_t>(ix.aK)];
    bool a_batch_tp = false;
    for (std::size_t d = 0; d + 2 < ra; ++d)
      if (std::find(sa.dims[d].begin(), sa.dims[d].end(), c.tp_axis) != sa.dims[d].end())
        a_batch_tp = true;
    std::int64_t n = B.shape[static_cast<std::size_t>(ix.bN)];
    if (!aK.empty()) {
      sb.dims[static_cast<std::size_t>(ix.bK)] = aK;
      r.why[1] =
          std::find(aK.begin(), aK.end(), c.tp_axis) != aK.end() ? "row-parallel" : "follows input";
    } else if (tp && rb == 2 && !a_batch_tp && c.replicate && c.replicate->count(B.tensor)) {
      r.why[1] = "replicated (its column split would cut a head)";
    } else if (tp && rb == 2 && !a_batch_tp &&
               n % c.mesh->dims[static_cast<std::size_t>(c.tp_axis)] == 0) {
      sb.dims[static_cast<std::size_t>(ix.bN)] = Entry{c.tp_axis};
      r.why[1] = "column-parallel";
      std::int64_t k = (c.no_fuse && c.no_fuse->count(B.tensor)) || gemm
                           ? 0
                           : fused_blocks(c, c.mesh->dims[static_cast<std::size_t>(c.tp_axis)]);
      if (k > 0) {
        r.req_blocked[1] = ix.bN;
        r.out_blocked[0] = static_cast<int>(std::max(ra, rb) - 1);
        r.blocks = k;
      }
    } else {
      r.why[1] = "replicated";
    }
  }
  if (A.flexible && !B.flexible)
    sa.dims[static_cast<std::size_t>(ix.aK)] = sb.dims[static_cast<std::size_t>(ix.bK)];
  Entry aK = sa.dims[static_cast<std::size_t>(ix.aK)],
        bK = sb.dims[static_cast<std::size_t>(ix.bK)];
  Entry k;
  if (aK == bK)
    k = aK;
  else if (B.is_weight && !A.is_weight)
    k = bK;
  else if (A.is_weight && !B.is_weight)
    k = aK;
  // A bias added inside Gemm must become a partial sum too; only a weight can be stored that way.
  bool has_c = gemm && c.in.size() > 2 && c.in[2].present;
  if (has_c && !k.empty() && !c.in[2].flexible) k.clear();
  std::vector<Entry> out(R);
  for (std::size_t d = 0; d < nb; ++d) {
    const Entry* ea = gemm ? nullptr : batch_of(sa, ra, d);
    const Entry* eb = gemm ? nullptr : batch_of(sb, rb, d);
    std::size_t ia = d + ra - R, ib = d + rb - R;
    bool a_bc = !ea || A.shape[ia] == 1, b_bc = !eb || B.shape[ib] == 1;
    Entry e;
    if (!a_bc && !b_bc)
      e = (*ea == *eb || eb->empty()) ? *ea : (ea->empty() ? *eb : Entry{});
    else if (!a_bc)
      e = *ea;
    else if (!b_bc)
      e = *eb;
    out[d] = e;
  }
  out[R - 2] = sa.dims[static_cast<std::size_t>(ix.aM)];
  out[R - 1] = sb.dims[static_cast<std::size_t>(ix.bN)];
  // Order of precedence when two dims want the same axis: contracting, N, batch, M.
  std::set<int> used(k.begin(), k.end());
  std::vector<int> order{static_cast<int>(R - 1)};
  for (std::size_t d = 0; d < nb; ++d) order.push_back(static_cast<int>(d));
  order.push_back(static_cast<int>(R - 2));
  make_unique(out, order, used);
  Sharding ra_s = Sharding::replicated(ra), rb_s = Sharding::replicated(rb);
  for (std::size_t d = 0; d < nb; ++d) {
    if (d + ra >= R && A.shape[d + ra - R] != 1) ra_s.dims[d + ra - R] = out[d];
    if (d + rb >= R && B.shape[d + rb - R] != 1) rb_s.dims[d + rb - R] = out[d];
  }
  ra_s.dims[static_cast<std::size_t>(ix.aM)] = out[R - 2];
  ra_s.dims[static_cast<std::size_t>(ix.aK)] = k;
  rb_s.dims[static_cast<std::size_t>(ix.bK)] = k;
  rb_s.dims[static_cast<std::size_t>(ix.bN)] = out[R - 1];
  r.req[0] = ra_s;
  r.req[1] = rb_s;
  if (has_c) {
    const auto& C = c.in[2];
    std::size_t rc = C.shape.size();
    Sharding sc = Sharding::replicated(rc);
    for (std::size_t i = 0; i < rc; ++i) {
      std::size_t d = i + 2 - rc;
      if (C.shape[i] != 1) sc.dims[i] = out[d];
    }
    sc.partial = sum_over(k);
    r.req[2] = sc;
    if (C.flexible) r.why[2] = k.empty() ? "follows output" : "partial sum (bias / n)";
  }
  r.out[0] = make(out, sum_over(k));
  return r;
}

// Einsum without ellipsis: every letter takes the split of the activations carrying it; a weight's
// free letter is split over tp when nothing else is; contracted split letters give a partial sum.
RuleResult einsum(const RuleContext& c) {
  auto eq_attr = find_attr(*c.node, "equation");
  if (!eq_attr) return replicate_all(c);
  std::string eq;
  for (char ch : eq_attr->s())
    if (ch != ' ') eq += ch;
  if (eq.find("...") != std::string::npos) return replicate_all(c);
  auto arrow = eq.find("->");
  if (arrow == std::string::npos) return replicate_all(c);
  std::vector<std::string> terms;
  std::string lhs = eq.substr(0, arrow), rhs = eq.substr(arrow + 2);
  for (std::size_t p = 0;;) {
    auto q = lhs.find(',', p);
    terms.push_back(lhs.substr(p, q == std::string::npos ? std::string::npos : q - p));
    if (q == std::string::npos) break;
    p = q + 1;
  }
  if (terms.size() != c.in.size()) return replicate_all(c);
  std::map<char, std::int64_t> size;
  for (std::size_t k = 0; k < terms.size(); ++k) {
    if (terms[k].size() != c.in[k].shape.size()) return replicate_all(c);
    for (std::size_t i = 0; i < terms[k].size(); ++i)
      size[terms[k][i]] = std::max(size[terms[k][i]], c.in[k].shape[i]);
  }
  std::map<char, Entry> ent;
  std::set<char> conflict;
  for (std::size_t k = 0; k < terms.size(); ++k) {
    const auto& in = c.in[k];
    if (in.flexible) continue;
    for (std::size_t i = 0; i < terms[k].size(); ++i) {
      char l = terms[k][i];
      if (in.shape[i] == 1 && size[l] != 1) continue;
      const Entry& e = in.cur.dims[i];
      auto it = ent.find(l);
      if (it == ent.end() || it->second.empty())
        ent[l] = e;
      else if (!e.empty() && e != it->second)
        conflict.insert(l);
    }
  }
  for (char l : conflict) ent[l].clear();
  RuleResult r = base(c);
  const bool tp = c.tp_axis >= 0 && c.mesh->dims[static_cast<std::size_t>(c.tp_axis)] > 1;
  auto axis_used = [&]() {
    std::set<int> u;
    for (auto& [l, e] : ent) u.insert(e.begin(), e.end());
    return u;
  };
  for (std::size_t k = 0; k < terms.size() && tp; ++k) {
    if (!c.in[k].flexible || !c.in[k].is_weight) continue;
    if (axis_used().count(c.tp_axis)) break;
    for (auto it = terms[k].rbegin(); it != terms[k].rend(); ++it) {
      char l = *it;
      bool free_letter = rhs.find(l) != std::string::npos && (!ent.count(l) || ent[l].empty());
      if (free_letter && size[l] % c.mesh->dims[static_cast<std::size_t>(c.tp_axis)] == 0) {
        ent[l] = Entry{c.tp_axis};
        r.why[k] = "split over tp on einsum letter " + std::string(1, l);
        break;
      }
    }
  }
  // No axis on two letters: output letters first (in output order), then contracted ones.
  std::set<int> used;
  std::string order = rhs;
  for (auto& t : terms)
    for (char l : t)
      if (order.find(l) == std::string::npos) order += l;
  for (char l : order) {
    Entry& e = ent[l];
    if (std::any_of(e.begin(), e.end(), [&](int a) { return used.count(a) > 0; })) e.clear();
    used.insert(e.begin(), e.end());
  }
  Entry contracted;
  for (char l : order)
    if (rhs.find(l) == std::string::npos)
      contracted.insert(contracted.end(), ent[l].begin(), ent[l].end());
  for (std::size_t k = 0; k < terms.size(); ++k) {
    Sharding s = Sharding::replicated(terms[k].size());
    for (std::size_t i = 0; i < terms[k].size(); ++i)
      if (!(c.in[k].shape[i] == 1 && size[terms[k][i]] != 1)) s.dims[i] = ent[terms[k][i]];
    r.req[k] = s;
  }
  std::vector<Entry> o;
  for (char l : rhs) o.push_back(ent[l]);
  r.out[0] = make(o, sum_over(contracted));
  return r;
}

RuleResult gather(const RuleContext& c) {
  RuleResult r = base(c);
  const auto& data = c.in[0];
  const auto& idx = c.in[1];
  std::size_t rd = data.shape.size();
  int axis = norm_axis(attr_int(*c.node, "axis", 0), rd);
  Sharding sd = data.flexible ? Sharding::replicated(rd) : data.cur;
  sd.partial.clear();
  Sharding si = idx.cur;
  si.partial.clear();
  // Vocabulary-parallel embedding (Megatron): the table's rows split over tp; each rank looks up
  // the indices in its range, zeroes the rest, and the output is a partial sum over tp.
  const bool tp = c.tp_axis >= 0 && c.mesh->dims[static_cast<std::size_t>(c.tp_axis)] > 1;
  bool idx_tp = false;
  for (const auto& e : si.dims)
    idx_tp = idx_tp || std::find(e.begin(), e.end(), c.tp_axis) != e.end();
  if (data.flexible && data.is_weight && idx.is_activation && tp && axis == 0 && rd == 2 &&
      !idx_tp && data.shape[0] % c.mesh->dims[static_cast<std::size_t>(c.tp_axis)] == 0) {
    sd.dims[0] = Entry{c.tp_axis};
    r.why[0] = "vocab-parallel";
  }
  Entry rows = sd.dims[static_cast<std::size_t>(axis)];
  std::set<int> idx_axes;
  for (const auto& e : si.dims) idx_axes.insert(e.begin(), e.end());
  if (!data.is_weight ||
      std::any_of(rows.begin(), rows.end(), [&](int a) { return idx_axes.count(a) > 0; }))
    rows.clear();
  sd.dims[static_cast<std::size_t>(axis)] = rows;
  std::vector<Entry> o;
  for (int d = 0; d < axis; ++d) o.push_back(sd.dims[static_cast<std::size_t>(d)]);
  for (const auto& e : si.dims) o.push_back(e);
  for (std::size_t d = static_cast<std::size_t>(axis) + 1; d < rd; ++d) o.push_back(sd.dims[d]);
  std::set<int> used(rows.begin(), rows.end());
  // Indices first: they carry the batch split.
  std::vector<int> order;
  for (std::size_t d = 0; d < si.dims.size(); ++d) order.push_back(axis + static_cast<int>(d));
  for (std::size_t d = 0; d < o.size(); ++d)
    if (d < static_cast<std::size_t>(axis) || d >= static_cast<std::size_t>(axis) + si.dims.size())
      order.push_back(static_cast<int>(d));
  make_unique(o, order, used);
  for (int d = 0; d < axis; ++d)
    sd.dims[static_cast<std::size_t>(d)] = o[static_cast<std::size_t>(d)];
  for (std::size_t d = static_cast<std::size_t>(axis) + 1; d < rd; ++d)
    sd.dims[d] = o[d + si.dims.size() - 1];
  r.req[0] = sd;
  r.req[1] = si;
  if (o.size() == c.out_shapes[0].size())
    r.out[0] = make(o, sum_over(rows));
  else
    return replicate_all(c);
  return r;
}

// Conv: the batch dim keeps its split; with tp, a weight splits its output channels (the output's
// channel dim follows, no communication); input channels and spatial dims must be whole.
RuleResult conv(const RuleContext& c) {
  RuleResult r = base(c);
  const auto& X = c.in[0];
  const auto& W = c.in[1];
  std::size_t rx = X.shape.size(), rw = W.shape.size();
  if (rx < 3 || rw != rx || c.out_shapes.empty() || c.out_shapes[0].size() != rx)
    return replicate_all(c);
  Sharding sx = X.flexible ? Sharding::replicated(rx) : X.cur;
  sx.partial.clear();
  for (std::size_t d = 1; d < rx; ++d) sx.dims[d].clear();
  Sharding sw = W.flexible ? Sharding::replicated(rw) : W.cur;
  sw.partial.clear();
  for (std::size_t d = 1; d < rw; ++d) sw.dims[d].clear();
  const bool tp = c.tp_axis >= 0 && c.mesh->dims[static_cast<std::size_t>(c.tp_axis)] > 1;
  bool grouped = attr_int(*c.node, "group", 1) != 1;
  if (W.flexible && tp && !grouped &&
      W.shape[0] % c.mesh->dims[static_cast<std::size_t>(c.tp_axis)] == 0) {
    sw.dims[0] = Entry{c.tp_axis};
    r.why[1] = "output-channel parallel";
  }
  const Entry& b = sx.dims[0];
  if (grouped || std::any_of(sw.dims[0].begin(), sw.dims[0].end(),
                             [&](int a) { return std::find(b.begin(), b.end(), a) != b.end(); }))
    sw.dims[0].clear();
  r.req[0] = sx;
  r.req[1] = sw;
  if (c.in.size() > 2 && c.in[2].present) r.req[2] = make({sw.dims[0]});
  std::vector<Entry> o(rx);
  o[0] = sx.dims[0];
  o[1] = sw.dims[0];
  r.out[0] = make(o);
  return r;
}

}  // namespace hp::shard::detail

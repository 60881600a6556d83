// Per-op sharding rules (shard.md §8 for MatMul/Gemm; the rest follow the same principle: a dim an op
// mixes across — a normalised, reduced, softmaxed, split or concatenated dim — must be whole on every
// rank, every other dim keeps the split it arrives with).
#include "propagate_rules.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <set>

namespace hp::shard::detail {
namespace {

const onnx::AttributeProto* find_attr(const onnx::NodeProto& n, const char* name) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

std::int64_t attr_int(const onnx::NodeProto& n, const char* name, std::int64_t dflt) {
  const auto* a = find_attr(n, name);
  return a ? a->i() : dflt;
}

std::vector<std::int64_t> attr_ints(const onnx::NodeProto& n, const char* name) {
  const auto* a = find_attr(n, name);
  if (!a) return {};
  return {a->ints().begin(), a->ints().end()};
}

int norm_axis(std::int64_t axis, std::size_t rank) {
  return static_cast<int>(axis < 0 ? axis + static_cast<std::int64_t>(rank) : axis);
}

std::int64_t axes_size(const Mesh& m, const Entry& e) {
  std::int64_t n = 1;
  for (int a : e) n *= m.dims[static_cast<std::size_t>(a)];
  return n;
}

bool divides(const Mesh& m, const Entry& e, std::int64_t size) {
  std::int64_t n = axes_size(m, e);
  return n > 0 && size % n == 0;
}

Sharding make(std::vector<Entry> dims, std::vector<PartialAxis> partial = {}) {
  return Sharding{std::move(dims), std::move(partial)};
}

std::vector<PartialAxis> sum_over(const Entry& axes) {
  std::vector<PartialAxis> p;
  for (int a : axes) p.push_back({a, ReduceOp::sum});
  return p;
}

// Clears entries whose axes an earlier dim (in `order`) already uses, so no axis splits two dims.
void make_unique(std::vector<Entry>& dims, const std::vector<int>& order, std::set<int> used = {}) {
  for (int d : order) {
    auto& e = dims[static_cast<std::size_t>(d)];
    bool clash = std::any_of(e.begin(), e.end(), [&](int a) { return used.count(a) > 0; });
    if (clash) e.clear();
    used.insert(e.begin(), e.end());
  }
}

std::vector<int> iota_order(std::size_t n) {
  std::vector<int> o(n);
  for (std::size_t i = 0; i < n; ++i) o[i] = static_cast<int>(i);
  return o;
}

RuleResult base(const RuleContext& c) {
  RuleResult r;
  r.req.resize(c.in.size());
  r.why.resize(c.in.size());
  for (std::size_t k = 0; k < c.in.size(); ++k) r.req[k] = c.in[k].cur;  // no requirement
  r.out.resize(c.out_shapes.size());
  for (std::size_t j = 0; j < c.out_shapes.size(); ++j) r.out[j] = Sharding::replicated(c.out_shapes[j].size());
  return r;
}

// Replicated inputs and outputs: correct for any op.
RuleResult replicate_all(const RuleContext& c) {
  RuleResult r = base(c);
  for (std::size_t k = 0; k < c.in.size(); ++k) r.req[k] = Sharding::replicated(c.in[k].shape.size());
  return r;
}

// Numpy-broadcasting elementwise ops over any number of inputs.
RuleResult elementwise(const RuleContext& c, const std::vector<int>& slots) {
  RuleResult r = base(c);
  if (c.out_shapes.empty()) return replicate_all(c);
  const auto& os = c.out_shapes[0];
  std::size_t R = os.size();
  std::vector<Entry> ent(R);
  bool partial_tp = false;
  for (std::size_t d = 0; d < R; ++d) {
    bool have = false, conflict = false;
    Entry chosen;
    for (int k : slots) {
      const auto& in = c.in[static_cast<std::size_t>(k)];
      if (!in.present || in.flexible) continue;
      std::size_t rk = in.shape.size();
      if (d + rk < R) continue;
      std::size_t ik = d + rk - R;
      if (in.shape[ik] == 1 && os[d] != 1) continue;
      const Entry& e = in.cur.dims[ik];
      if (!have) { chosen = e; have = true; }
      else if (e != chosen) {
        // One side split, the other whole: slicing the whole one is free, gathering is not.
        if (chosen.empty()) chosen = e;
        else if (!e.empty()) conflict = true;
      }
    }
    ent[d] = conflict ? Entry{} : chosen;
  }
  for (int k : slots) {
    const auto& in = c.in[static_cast<std::size_t>(k)];
    if (!in.present) continue;
    for (const auto& p : in.cur.partial)
      if (p.axis == c.tp_axis) partial_tp = true;
  }
  make_unique(ent, iota_order(R));
  // Sequence parallelism: a row-parallel partial sum entering the residual stream is reduce-scattered
  // over the sequence dim ([b, s, h]: dim R-2) instead of all-reduced.
  if (c.sequence_parallel && partial_tp && R >= 3 && c.tp_axis >= 0) {
    std::set<int> used;
    for (auto& e : ent) used.insert(e.begin(), e.end());
    Entry& sd = ent[R - 2];
    if (!used.count(c.tp_axis) && sd.empty() && os[R - 2] % c.mesh->dims[static_cast<std::size_t>(c.tp_axis)] == 0)
      sd = Entry{c.tp_axis};
  }
  for (int k : slots) {
    const auto& in = c.in[static_cast<std::size_t>(k)];
    if (!in.present) continue;
    std::size_t rk = in.shape.size();
    Sharding s = Sharding::replicated(rk);
    for (std::size_t ik = 0; ik < rk; ++ik) {
      std::size_t d = ik + R - rk;
      if (in.shape[ik] == 1 && os[d] != 1) continue;
      s.dims[ik] = ent[d];
    }
    r.req[static_cast<std::size_t>(k)] = s;
  }
  for (auto& o : r.out) o = make(ent);
  return r;
}

RuleResult elementwise_all(const RuleContext& c) {
  return elementwise(c, iota_order(c.in.size()));
}

// Keeps the arriving split everywhere except `whole` dims; outputs of the same rank get the same.
RuleResult keep_except(const RuleContext& c, const std::set<int>& whole, bool keep_partial = false) {
  RuleResult r = base(c);
  const auto& in = c.in[0];
  Sharding s = in.cur;
  if (in.flexible) s = Sharding::replicated(in.shape.size());
  for (int d : whole)
    if (d >= 0 && static_cast<std::size_t>(d) < s.dims.size()) s.dims[static_cast<std::size_t>(d)].clear();
  if (!keep_partial) s.partial.clear();
  r.req[0] = s;
  for (std::size_t j = 0; j < r.out.size(); ++j)
    if (c.out_shapes[j].size() == s.dims.size()) r.out[j] = s;
  return r;
}

// Reshape as a regrouping of row-major dims: a split dim survives when it is the major non-trivial
// dim of its group on both sides and the output's major dim divides by its shard count (so
// [b, s, h*d] -> [b, s, h, d] keeps the split on h, and back).
RuleResult reshape(const RuleContext& c) {
  RuleResult r = base(c);
  const auto& in = c.in[0];
  const auto& I = in.shape;
  const auto& O = c.out_shapes[0];
  Sharding s = in.flexible ? Sharding::replicated(I.size()) : in.cur;
  std::vector<Entry> out(O.size());
  std::size_t i = 0, j = 0;
  while (i < I.size() || j < O.size()) {
    std::size_t ia = i, ja = j;
    std::int64_t pi = 1, pj = 1;
    if (i < I.size()) pi *= I[i++];
    if (j < O.size()) pj *= O[j++];
    while (pi != pj) {
      if (pi < pj && i < I.size()) pi *= I[i++];
      else if (pj < pi && j < O.size()) pj *= O[j++];
      else break;
    }
    // Major non-trivial dims of the group on each side.
    std::size_t im = ia, om = ja;
    while (im < i && I[im] == 1) ++im;
    while (om < j && O[om] == 1) ++om;
    for (std::size_t k = ia; k < i; ++k) {
      Entry& e = s.dims[k];
      if (e.empty()) continue;
      bool ok = pi == pj && k == im && om < j && divides(*c.mesh, e, O[om]);
      if (ok) out[om] = e;
      else e.clear();
    }
  }
  r.req[0] = s;
  r.out[0] = make(out, s.partial);
  return r;
}

RuleResult transpose(const RuleContext& c) {
  RuleResult r = base(c);
  const auto& in = c.in[0];
  std::size_t R = in.shape.size();
  auto perm = attr_ints(*c.node, "perm");
  if (perm.empty())
    for (std::size_t i = 0; i < R; ++i) perm.push_back(static_cast<std::int64_t>(R - 1 - i));
  Sharding s = in.flexible ? Sharding::replicated(R) : in.cur;
  r.req[0] = s;
  Sharding o = s;
  for (std::size_t i = 0; i < R && i < perm.size(); ++i) o.dims[i] = s.dims[static_cast<std::size_t>(perm[i])];
  r.out[0] = o;
  return r;
}

std::vector<int> reduce_axes(const RuleContext& c, std::size_t rank) {
  std::vector<std::int64_t> axes = attr_ints(*c.node, "axes");
  if (axes.empty() && c.node->input_size() > 1 && !c.node->input(1).empty())
    axes = const_ints(*c.proto, c.node->input(1));
  if (axes.empty() && find_attr(*c.node, "axis")) axes.push_back(attr_int(*c.node, "axis", 0));
  std::vector<int> out;
  if (axes.empty()) {
    if (attr_int(*c.node, "noop_with_empty_axes", 0) != 0) return out;
    for (std::size_t d = 0; d < rank; ++d) out.push_back(static_cast<int>(d));
    return out;
  }
  for (auto a : axes) out.push_back(norm_axis(a, rank));
  return out;
}

RuleResult reduce(const RuleContext& c) {
  RuleResult r = base(c);
  const auto& in = c.in[0];
  std::size_t R = in.shape.size();
  auto axes = reduce_axes(c, R);
  std::set<int> whole(axes.begin(), axes.end());
  Sharding s = in.flexible ? Sharding::replicated(R) : in.cur;
  s.partial.clear();
  for (int d : whole) s.dims[static_cast<std::size_t>(d)].clear();
  r.req[0] = s;
  bool keep = attr_int(*c.node, "keepdims", 1) != 0;
  std::vector<Entry> o;
  for (std::size_t d = 0; d < R; ++d) {
    if (whole.count(static_cast<int>(d)) && !keep) continue;
    o.push_back(s.dims[d]);
  }
  if (o.size() == c.out_shapes[0].size()) r.out[0] = make(o);
  else r.req[0] = Sharding::replicated(R);
  return r;
}

// MatMul / Gemm (shard.md §8). Index maps say where M, K (of A) and K, N (of B) sit.
struct MMIdx {
  int aM, aK, bK, bN;
};

RuleResult matmul(const RuleContext& c, bool gemm) {
  RuleResult r = base(c);
  const auto& A = c.in[0];
  const auto& B = c.in[1];
  std::size_t ra = A.shape.size(), rb = B.shape.size();
  if (ra < 2 || rb < 2) return replicate_all(c);
  MMIdx ix{static_cast<int>(ra) - 2, static_cast<int>(ra) - 1, static_cast<int>(rb) - 2, static_cast<int>(rb) - 1};
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
      if (std::find(sa.dims[d].begin(), sa.dims[d].end(), c.tp_axis) != sa.dims[d].end()) a_batch_tp = true;
    std::int64_t n = B.shape[static_cast<std::size_t>(ix.bN)];
    if (!aK.empty()) {
      sb.dims[static_cast<std::size_t>(ix.bK)] = aK;
      r.why[1] = std::find(aK.begin(), aK.end(), c.tp_axis) != aK.end() ? "row-parallel" : "follows input";
    } else if (tp && rb == 2 && !a_batch_tp && n % c.mesh->dims[static_cast<std::size_t>(c.tp_axis)] == 0) {
      sb.dims[static_cast<std::size_t>(ix.bN)] = Entry{c.tp_axis};
      r.why[1] = "column-parallel";
    } else {
      r.why[1] = "replicated";
    }
  }
  if (A.flexible && !B.flexible) sa.dims[static_cast<std::size_t>(ix.aK)] = sb.dims[static_cast<std::size_t>(ix.bK)];
  Entry aK = sa.dims[static_cast<std::size_t>(ix.aK)], bK = sb.dims[static_cast<std::size_t>(ix.bK)];
  Entry k;
  if (aK == bK) k = aK;
  else if (B.is_weight && !A.is_weight) k = bK;
  else if (A.is_weight && !B.is_weight) k = aK;
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
    if (!a_bc && !b_bc) e = (*ea == *eb || eb->empty()) ? *ea : (ea->empty() ? *eb : Entry{});
    else if (!a_bc) e = *ea;
    else if (!b_bc) e = *eb;
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
    for (std::size_t i = 0; i < terms[k].size(); ++i) size[terms[k][i]] = std::max(size[terms[k][i]], c.in[k].shape[i]);
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
      if (it == ent.end() || it->second.empty()) ent[l] = e;
      else if (!e.empty() && e != it->second) conflict.insert(l);
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
    if (rhs.find(l) == std::string::npos) contracted.insert(contracted.end(), ent[l].begin(), ent[l].end());
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
  // Vocabulary-parallel embedding (Megatron): the table's rows split over tp; each rank looks up the
  // indices in its range, zeroes the rest, and the output is a partial sum over tp.
  const bool tp = c.tp_axis >= 0 && c.mesh->dims[static_cast<std::size_t>(c.tp_axis)] > 1;
  bool idx_tp = false;
  for (const auto& e : si.dims) idx_tp = idx_tp || std::find(e.begin(), e.end(), c.tp_axis) != e.end();
  if (data.flexible && data.is_weight && idx.is_activation && tp && axis == 0 && rd == 2 && !idx_tp &&
      data.shape[0] % c.mesh->dims[static_cast<std::size_t>(c.tp_axis)] == 0) {
    sd.dims[0] = Entry{c.tp_axis};
    r.why[0] = "vocab-parallel";
  }
  Entry rows = sd.dims[static_cast<std::size_t>(axis)];
  std::set<int> idx_axes;
  for (const auto& e : si.dims) idx_axes.insert(e.begin(), e.end());
  if (!data.is_weight || std::any_of(rows.begin(), rows.end(), [&](int a) { return idx_axes.count(a) > 0; }))
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
  for (int d = 0; d < axis; ++d) sd.dims[static_cast<std::size_t>(d)] = o[static_cast<std::size_t>(d)];
  for (std::size_t d = static_cast<std::size_t>(axis) + 1; d < rd; ++d) sd.dims[d] = o[d + si.dims.size() - 1];
  r.req[0] = sd;
  r.req[1] = si;
  if (o.size() == c.out_shapes[0].size()) r.out[0] = make(o, sum_over(rows));
  else return replicate_all(c);
  return r;
}

// Conv: the batch dim keeps its split; with tp, a weight splits its output channels (the output's
// channel dim follows, no communication); input channels and spatial dims must be whole.
RuleResult conv(const RuleContext& c) {
  RuleResult r = base(c);
  const auto& X = c.in[0];
  const auto& W = c.in[1];
  std::size_t rx = X.shape.size(), rw = W.shape.size();
  if (rx < 3 || rw != rx || c.out_shapes.empty() || c.out_shapes[0].size() != rx) return replicate_all(c);
  Sharding sx = X.flexible ? Sharding::replicated(rx) : X.cur;
  sx.partial.clear();
  for (std::size_t d = 1; d < rx; ++d) sx.dims[d].clear();
  Sharding sw = W.flexible ? Sharding::replicated(rw) : W.cur;
  sw.partial.clear();
  for (std::size_t d = 1; d < rw; ++d) sw.dims[d].clear();
  const bool tp = c.tp_axis >= 0 && c.mesh->dims[static_cast<std::size_t>(c.tp_axis)] > 1;
  bool grouped = attr_int(*c.node, "group", 1) != 1;
  if (W.flexible && tp && !grouped && W.shape[0] % c.mesh->dims[static_cast<std::size_t>(c.tp_axis)] == 0) {
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

RuleResult expand(const RuleContext& c) {
  RuleResult r = base(c);
  const auto& in = c.in[0];
  const auto& os = c.out_shapes[0];
  std::size_t ri = in.shape.size(), R = os.size();
  if (ri > R) return replicate_all(c);
  Sharding s = in.flexible ? Sharding::replicated(ri) : in.cur;
  s.partial.clear();
  std::vector<Entry> o(R);
  for (std::size_t i = 0; i < ri; ++i) {
    std::size_t d = i + R - ri;
    if (in.shape[i] == os[d]) o[d] = s.dims[i];
    else s.dims[i].clear();
  }
  r.req[0] = s;
  r.out[0] = make(o);
  return r;
}

RuleResult concat(const RuleContext& c) {
  RuleResult r = elementwise_all(c);
  if (c.out_shapes.empty()) return r;
  int axis = norm_axis(attr_int(*c.node, "axis", 0), c.out_shapes[0].size());
  for (auto& s : r.req)
    if (static_cast<std::size_t>(axis) < s.dims.size()) s.dims[static_cast<std::size_t>(axis)].clear();
  for (auto& s : r.out)
    if (static_cast<std::size_t>(axis) < s.dims.size()) s.dims[static_cast<std::size_t>(axis)].clear();
  return r;
}

const std::set<std::string>& elementwise_ops() {
  static const std::set<std::string> ops{
      "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Mod", "Where", "Equal", "Less", "Greater",
      "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Not", "Relu", "Gelu", "Erf", "Tanh",
      "Sigmoid", "Exp", "Log", "Sqrt", "Reciprocal", "Neg", "Abs", "Cast", "CastLike", "Sin", "Cos",
      "Softplus", "LeakyRelu", "Elu", "Selu", "HardSigmoid", "HardSwish", "Mish", "Clip", "Floor",
      "Ceil", "Round", "Sign", "IsNaN", "IsInf", "PRelu", "BitShift", "Dropout", "Identity"};
  return ops;
}

}  // namespace

std::vector<std::int64_t> const_ints(const onnx::GraphProto& g, const std::string& name) {
  const onnx::TensorProto* t = nullptr;
  for (const auto& i : g.initializer())
    if (i.name() == name) t = &i;
  if (!t)
    for (const auto& n : g.node())
      if (n.op_type() == "Constant" && n.output_size() == 1 && n.output(0) == name)
        for (const auto& a : n.attribute())
          if (a.name() == "value") t = &a.t();
  std::vector<std::int64_t> v;
  if (!t) return v;
  if (t->data_type() == onnx::TensorProto::INT64) {
    if (!t->raw_data().empty()) {
      v.resize(t->raw_data().size() / 8);
      std::memcpy(v.data(), t->raw_data().data(), v.size() * 8);
    } else {
      v.assign(t->int64_data().begin(), t->int64_data().end());
    }
  } else if (t->data_type() == onnx::TensorProto::INT32) {
    if (!t->raw_data().empty()) {
      std::vector<std::int32_t> w(t->raw_data().size() / 4);
      std::memcpy(w.data(), t->raw_data().data(), w.size() * 4);
      v.assign(w.begin(), w.end());
    } else {
      v.assign(t->int32_data().begin(), t->int32_data().end());
    }
  }
  return v;
}

RuleResult apply_rule(const RuleContext& c) {
  const std::string& op = c.node->op_type();
  const std::string& dom = c.node->domain();
  if (!dom.empty() && dom != "ai.onnx") return replicate_all(c);
  bool shapes_ok = !c.in.empty() && c.in[0].present;
  if (op == "Shape" || op == "Size" || op == "Constant") return base(c);  // read no data
  if (!shapes_ok) return replicate_all(c);
  if (elementwise_ops().count(op)) {
    // Dropout's second output (mask) and CastLike's target follow the data.
    return elementwise_all(c);
  }
  if (op == "MatMul") return matmul(c, false);
  if (op == "Gemm") return matmul(c, true);
  if (op == "Einsum") return einsum(c);
  if (op == "Reshape" || op == "Squeeze" || op == "Unsqueeze" || op == "Flatten") return reshape(c);
  if (op == "Transpose") return transpose(c);
  if (op == "Gather") return gather(c);
  if (op == "Expand") return expand(c);
  if (op == "Conv") return conv(c);
  if (op == "Concat") return concat(c);
  std::size_t R = c.in[0].shape.size();
  if (op == "Softmax" || op == "LogSoftmax") {
    int axis = norm_axis(attr_int(*c.node, "axis", c.opset >= 13 ? -1 : 1), R);
    std::set<int> whole{axis};
    if (c.opset < 13)
      for (std::size_t d = static_cast<std::size_t>(axis); d < R; ++d) whole.insert(static_cast<int>(d));
    return keep_except(c, whole);
  }
  if (op == "LayerNormalization" || op == "RMSNormalization" || op == "SimplifiedLayerNormalization") {
    int axis = norm_axis(attr_int(*c.node, "axis", -1), R);
    std::set<int> whole;
    for (std::size_t d = static_cast<std::size_t>(axis); d < R; ++d) whole.insert(static_cast<int>(d));
    RuleResult r = keep_except(c, whole);
    for (std::size_t k = 1; k < c.in.size(); ++k) r.req[k] = Sharding::replicated(c.in[k].shape.size());
    for (std::size_t j = 1; j < r.out.size(); ++j) {
      r.out[j] = Sharding::replicated(c.out_shapes[j].size());
      for (int d = 0; d < axis && static_cast<std::size_t>(d) < r.out[j].dims.size(); ++d)
        r.out[j].dims[static_cast<std::size_t>(d)] = r.req[0].dims[static_cast<std::size_t>(d)];
    }
    return r;
  }
  if (op.rfind("Reduce", 0) == 0 || op == "ArgMax" || op == "ArgMin") return reduce(c);
  if (op == "Split") {
    int axis = norm_axis(attr_int(*c.node, "axis", 0), R);
    return keep_except(c, {axis});
  }
  if (op == "TopK") {
    int axis = norm_axis(attr_int(*c.node, "axis", -1), R);
    return keep_except(c, {axis});
  }
  if (op == "Slice") {
    std::set<int> whole;
    const auto& os = c.out_shapes[0];
    for (std::size_t d = 0; d < R && d < os.size(); ++d)
      if (c.in[0].shape[d] != os[d]) whole.insert(static_cast<int>(d));
    // Slices that keep a dim's size but step through it are caught by their axes input.
    auto axes = c.node->input_size() > 3 ? const_ints(*c.proto, c.node->input(3)) : std::vector<std::int64_t>{};
    for (auto a : axes) whole.insert(norm_axis(a, R));
    if (c.node->input_size() <= 3)
      for (std::size_t d = 0; d < R; ++d) whole.insert(static_cast<int>(d));
    return keep_except(c, whole);
  }
  if (op == "Trilu" && R >= 2) return keep_except(c, {static_cast<int>(R - 2), static_cast<int>(R - 1)});
  return replicate_all(c);
}

}  // namespace hp::shard::detail

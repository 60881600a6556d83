// Gradient rules of the contractions. MatMul: dA = dY B^T, dB = A^T dY, each summed over the
// batch dims it was broadcast on; when B is a 2-D weight read by a batched A (every nn.Linear), dB
// is one GEMM over the flattened rows, Gemm(A2^T, dY2), instead of a batched product and a sum.
// Gemm: the same with its transposes, alpha and beta. Einsum: each operand's gradient is an Einsum
// of the output gradient with the other operands.
#include <fmt/core.h>

#include <set>

#include "grad_ctx.h"

namespace hp::train::detail {

namespace {

std::vector<std::int64_t> swap_last(int rank) {
  std::vector<std::int64_t> p;
  for (int k = 0; k < rank; ++k) p.push_back(k);
  std::swap(p[static_cast<std::size_t>(rank - 1)], p[static_cast<std::size_t>(rank - 2)]);
  return p;
}

/// [-1, last dim of t] as a shape tensor.
std::string rows_shape(GradCtx& c, const std::string& t) {
  if (auto s = c.static_shape(t); s && !s->empty()) return c.i64s({-1, s->back()});
  std::string last = c.op("Slice", {c.shape_of(t), c.i64s({-1}), c.i64s({INT64_MAX})});
  return c.op("Concat", {c.i64s({-1}), last}, {{"axis", std::int64_t{0}}});
}

/// True when the batch dims of a and b are statically the same (no broadcast between them).
bool same_batch(GradCtx& c, const std::string& a, const std::string& b) {
  auto sa = c.static_shape(a), sb = c.static_shape(b);
  if (!sa || !sb || sa->size() != sb->size()) return false;
  for (std::size_t k = 0; k + 2 < sa->size(); ++k)
    if ((*sa)[k] != (*sb)[k]) return false;
  return true;
}

Status matmul(GradCtx& c) {
  const std::string &a = c.in(0), &b = c.in(1), &dy = c.dout(0);
  const int ra = c.rank(a), rb = c.rank(b);
  if (ra < 2 || rb < 2)
    return c.fail(ra < 0 || rb < 0 ? "MatMul's gradient needs its operands' ranks, unknown here"
                                   : "MatMul with a 1-D operand has no gradient rule yet");
  if (rb == 2) {
    // dA = dY B^T as one GEMM over the flattened rows: no transposed copy of the weight.
    if (c.wants(0)) {
      std::string d2 = ra == 2 ? dy : c.op("Reshape", {dy, rows_shape(c, dy)});
      std::string g = c.op("Gemm", {d2, b}, {{"transB", std::int64_t{1}}});
      c.grad(0, ra == 2 ? g : c.op("Reshape", {g, c.shape_of(a)}));
    }
    if (c.wants(1)) {
      std::string a2 = ra == 2 ? a : c.op("Reshape", {a, rows_shape(c, a)});
      std::string d2 = ra == 2 ? dy : c.op("Reshape", {dy, rows_shape(c, dy)});
      c.grad(1, c.op("Gemm", {a2, d2}, {{"transA", std::int64_t{1}}}));
    }
    return {};
  }
  const bool equal = ra == rb && same_batch(c, a, b);
  if (c.wants(0)) {
    std::string g = c.op("MatMul", {dy, c.op("Transpose", {b}, {{"perm", swap_last(rb)}})});
    c.grad(0, equal ? g : c.hp("SumTo", {g, c.shape_of(a)}));
  }
  if (c.wants(1)) {
    std::string g = c.op("MatMul", {c.op("Transpose", {a}, {{"perm", swap_last(ra)}}), dy});
    c.grad(1, equal ? g : c.hp("SumTo", {g, c.shape_of(b)}));
  }
  return {};
}

Status gemm(GradCtx& c) {
  const std::int64_t ta = c.attr_i("transA", 0), tb = c.attr_i("transB", 0);
  const double alpha = c.attr_f("alpha", 1.0), beta = c.attr_f("beta", 1.0);
  const std::string &a = c.in(0), &b = c.in(1), &dy = c.dout(0);
  if (c.wants(0)) {
    std::string g = ta == 0 ? c.op("Gemm", {dy, b}, {{"transB", 1 - tb}, {"alpha", alpha}})
                            : c.op("Gemm", {b, dy},
                                   {{"transA", tb}, {"transB", std::int64_t{1}}, {"alpha", alpha}});
    c.grad(0, g);
  }
  if (c.wants(1)) {
    std::string g = tb == 0 ? c.op("Gemm", {a, dy}, {{"transA", 1 - ta}, {"alpha", alpha}})
                            : c.op("Gemm", {dy, a},
                                   {{"transA", std::int64_t{1}}, {"transB", ta}, {"alpha", alpha}});
    c.grad(1, g);
  }
  if (c.wants(2)) {
    std::string g = beta == 1.0 ? dy : c.op("Mul", {dy, c.scalar(beta, dy)});
    c.grad(2, c.sum_to(g, c.in(2), c.out(0)));
  }
  return {};
}

Status einsum(GradCtx& c) {
  std::string eq = c.attr_s("equation", "");
  eq.erase(std::remove(eq.begin(), eq.end(), ' '), eq.end());
  const auto arrow = eq.find("->");
  if (arrow == std::string::npos)
    return c.fail("Einsum without an explicit output ('->') has no gradient rule");
  std::vector<std::string> subs;
  std::string lhs = eq.substr(0, arrow);
  for (std::size_t p = 0;;) {
    auto q = lhs.find(',', p);
    subs.push_back(lhs.substr(p, q == std::string::npos ? std::string::npos : q - p));
    if (q == std::string::npos) break;
    p = q + 1;
  }
  const std::string out = eq.substr(arrow + 2);
  if (static_cast<int>(subs.size()) != c.n_in())
    return c.fail("Einsum's equation does not match its inputs");
  for (int i = 0; i < c.n_in(); ++i) {
    if (!c.wants(i)) continue;
    const std::string& mine = subs[static_cast<std::size_t>(i)];
    std::set<char> elsewhere(out.begin(), out.end());
    std::string others_eq;
    std::vector<std::string> ins = {c.dout(0)};
    for (int j = 0; j < c.n_in(); ++j) {
      if (j == i) continue;
      const auto& s = subs[static_cast<std::size_t>(j)];
      elsewhere.insert(s.begin(), s.end());
      others_eq += "," + s;
      ins.push_back(c.in(j));
    }
    std::set<char> seen;
    for (char ch : mine) {
      if (ch == '.') continue;
      if (!seen.insert(ch).second)
        return c.fail("Einsum with a repeated label in one operand has no gradient rule");
      if (!elsewhere.count(ch))
        return c.fail(
            fmt::format("Einsum label '{}' is summed within one operand: no gradient rule", ch));
    }
    std::string g = c.op("Einsum", ins, {{"equation", out + others_eq + "->" + mine}});
    c.grad(i, mine.find("...") != std::string::npos ? c.hp("SumTo", {g, c.shape_of(c.in(i))}) : g);
  }
  return {};
}

}  // namespace

void register_linalg_rules(RuleTable& t) {
  t["MatMul"] = matmul;
  t["Gemm"] = gemm;
  t["Einsum"] = einsum;
}

}  // namespace hp::train::detail

// Reductions and contractions on the cpu backend: ReduceSum/Mean/Max/Min/Prod/L1/L2/SumSquare/
// LogSumExp/LogSum, ArgMax/ArgMin, and Einsum.
//
// Reductions split the dims into kept and reduced ones; each output element walks the reduced index
// space with precomputed strides, so any set of axes works in one pass. Axes come from the
// attribute before the opset where they became an input (13 for ReduceSum, 18 for the others).
// Accumulation is in double.
//
// Einsum is a direct loop over the product of all index letters: exact and general (any explicit or
// implicit equation; an ellipsis is first rewritten into fresh letters), and fast enough for the
// small contractions exporters emit.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>

#include "cpu_ops.h"

namespace hp_cpu {
namespace {

enum class Red { sum, mean, max, min, prod, l1, l2, sumsq, logsumexp, logsum };

/// ReduceSum/ReduceMean of float32/64 when the reduced dims (sizes 1 aside) all come before the
/// kept ones (a bias gradient: [rows, n] -> [n]) or all after them ([n, row] -> [n]): then x is
/// a plain [R, K] or [K, R] matrix, summed in double as the general loop does, column-wise or row
/// by row, and split across threads. The general loop's index arithmetic per element took 3-5% of
/// a GPT training step. False (nothing written) for other layouts.
bool sum_contiguous(const View& x, const std::vector<bool>& red, bool mean, int64_t n_out,
                    int64_t n_red, View& y) {
  int last_red = -1, first_red = -1, last_kept = -1, first_kept = -1;
  for (size_t d = 0; d < red.size(); ++d) {
    if (x.dims[d] == 1) continue;
    int& first = red[d] ? first_red : first_kept;
    int& last = red[d] ? last_red : last_kept;
    if (first < 0) first = static_cast<int>(d);
    last = static_cast<int>(d);
  }
  const bool leading = last_red < first_kept || first_kept < 0;
  const bool trailing = last_kept < first_red || first_red < 0;
  if ((!leading && !trailing) || n_out == 0 || n_red == 0) return false;
  const double scale = mean ? 1.0 / static_cast<double>(n_red) : 1.0;
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.as<T>();
    T* py = y.as<T>();
    if (leading) {  // [R, K]: column sums, columns split across threads
#pragma omp parallel for schedule(static) if (n_out * n_red >= (1 << 16) && n_out >= 64)
      for (int64_t j0 = 0; j0 < n_out; j0 += 64) {
        const int64_t j1 = std::min(n_out, j0 + 64);
        double acc[64] = {};
        for (int64_t i = 0; i < n_red; ++i)
          for (int64_t j = j0; j < j1; ++j) acc[j - j0] += static_cast<double>(px[i * n_out + j]);
        for (int64_t j = j0; j < j1; ++j) py[j] = static_cast<T>(acc[j - j0] * scale);
      }
    } else {  // [K, R]: row sums
#pragma omp parallel for schedule(static) if (n_out * n_red >= (1 << 16))
      for (int64_t o = 0; o < n_out; ++o) {
        double acc = 0;
        for (int64_t k = 0; k < n_red; ++k) acc += static_cast<double>(px[o * n_red + k]);
        py[o] = static_cast<T>(acc * scale);
      }
    }
  };
  if (x.dtype == HP_F64)
    run(double{});
  else
    run(float{});
  return true;
}

void reduce(OpCall& c, Red kind) {
  const View& x = c.need(0);
  const int64_t r = static_cast<int64_t>(x.dims.size());
  const int64_t axes_input_from = kind == Red::sum ? 13 : 18;
  std::vector<int64_t> axes = c.opset() >= axes_input_from
                                  ? (c.in(1).present() ? c.in(1).ints() : std::vector<int64_t>{})
                                  : c.ints("axes");
  const bool keep = c.i("keepdims", 1) != 0;
  std::vector<bool> red(static_cast<size_t>(r), false);
  if (axes.empty()) {
    if (c.i("noop_with_empty_axes", 0) != 0) {
      View y = c.out(0, x.dtype, x.dims);
      if (x.numel())
        std::memcpy(y.data, x.data, static_cast<size_t>(x.numel() * dtype_size(x.dtype)));
      return;
    }
    red.assign(static_cast<size_t>(r), true);
  }
  for (int64_t a : axes) red[static_cast<size_t>(c.axis(a, r))] = true;
  Dims out, kept_dims, kept_st, red_dims, red_st;
  const Dims st = strides_of(x.dims);
  for (size_t d = 0; d < red.size(); ++d) {
    if (red[d]) {
      red_dims.push_back(x.dims[d]);
      red_st.push_back(st[d]);
      if (keep) out.push_back(1);
    } else {
      kept_dims.push_back(x.dims[d]);
      kept_st.push_back(st[d]);
      out.push_back(x.dims[d]);
    }
  }
  View y = c.out(0, x.dtype, out);
  const int64_t n_out = numel(kept_dims), n_red = numel(red_dims);
  if ((kind == Red::sum || kind == Red::mean) && (x.dtype == HP_F32 || x.dtype == HP_F64) &&
      sum_contiguous(x, red, kind == Red::mean, n_out, n_red, y))
    return;
  dispatch_num(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.as<T>();
    Dims oi(kept_dims.size(), 0), ri(red_dims.size(), 0);
    for (int64_t o = 0; o < n_out; ++o) {
      int64_t base = 0;
      for (size_t d = 0; d < oi.size(); ++d) base += oi[d] * kept_st[d];
      double acc = kind == Red::max    ? -std::numeric_limits<double>::infinity()
                   : kind == Red::min  ? std::numeric_limits<double>::infinity()
                   : kind == Red::prod ? 1.0
                                       : 0.0;
      double mx = -std::numeric_limits<double>::infinity();
      if (kind == Red::logsumexp) {
        std::fill(ri.begin(), ri.end(), 0);
        for (int64_t k = 0; k < n_red; ++k) {
          int64_t off = base;
          for (size_t d = 0; d < ri.size(); ++d) off += ri[d] * red_st[d];
          mx = std::max(mx, static_cast<double>(px[off]));
          for (size_t d = ri.size(); d-- > 0;) {
            if (++ri[d] < red_dims[d]) break;
            ri[d] = 0;
          }
        }
      }
      std::fill(ri.begin(), ri.end(), 0);
      for (int64_t k = 0; k < n_red; ++k) {
        int64_t off = base;
        for (size_t d = 0; d < ri.size(); ++d) off += ri[d] * red_st[d];
        const double v = static_cast<double>(px[off]);
        switch (kind) {
          case Red::sum:
          case Red::mean:
          case Red::logsum: acc += v; break;
          case Red::max: acc = std::max(acc, v); break;
          case Red::min: acc = std::min(acc, v); break;
          case Red::prod: acc *= v; break;
          case Red::l1: acc += std::fabs(v); break;
          case Red::l2:
          case Red::sumsq: acc += v * v; break;
          case Red::logsumexp: acc += std::exp(v - mx); break;
        }
        for (size_t d = ri.size(); d-- > 0;) {
          if (++ri[d] < red_dims[d]) break;
          ri[d] = 0;
        }
      }
      if (kind == Red::mean) acc /= static_cast<double>(n_red);
      if (kind == Red::l2) acc = std::sqrt(acc);
      if (kind == Red::logsum) acc = std::log(acc);
      if (kind == Red::logsumexp) acc = std::log(acc) + mx;
      y.as<T>()[o] = static_cast<T>(acc);
      for (size_t d = oi.size(); d-- > 0;) {
        if (++oi[d] < kept_dims[d]) break;
        oi[d] = 0;
      }
    }
  });
}

void arg(OpCall& c, bool is_max) {
  const View& x = c.need(0);
  const int64_t r = static_cast<int64_t>(x.dims.size());
  const size_t a = static_cast<size_t>(c.axis(c.i("axis", 0), r));
  const bool keep = c.i("keepdims", 1) != 0, last = c.i("select_last_index", 0) != 0;
  Dims out = x.dims;
  if (keep)
    out[a] = 1;
  else
    out.erase(out.begin() + static_cast<int64_t>(a));
  View y = c.out(0, HP_I64, out);
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < a; ++d) outer *= x.dims[d];
  for (size_t d = a + 1; d < x.dims.size(); ++d) inner *= x.dims[d];
  const int64_t n = x.dims[a];
  dispatch_num(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t in = 0; in < inner; ++in) {
        const T* p = x.as<T>() + o * n * inner + in;
        int64_t best = 0;
        for (int64_t i = 1; i < n; ++i) {
          const T v = p[i * inner], b = p[best * inner];
          if (is_max ? (v > b || (last && v == b)) : (v < b || (last && v == b))) best = i;
        }
        y.as<int64_t>()[o * inner + in] = best;
      }
  });
}

/// Rewrites an equation with "..." into one without: the ellipsis of each operand becomes fresh
/// letters for its leading dims, right-aligned across operands as numpy broadcasts them, and the
/// output (explicit, or implicit: the ellipsis dims then the letters used once, sorted) gets all of
/// them.
std::string expand_ellipsis(const OpCall& c, const std::string& eq) {
  const size_t arrow = eq.find("->");
  const std::string lhs = eq.substr(0, arrow);
  std::vector<std::string> terms;
  for (size_t p = 0;;) {
    const size_t q = lhs.find(',', p);
    terms.push_back(lhs.substr(p, q == std::string::npos ? std::string::npos : q - p));
    if (q == std::string::npos) break;
    p = q + 1;
  }
  if (terms.size() != c.n_inputs())
    c.fail("equation names " + std::to_string(terms.size()) + " operands");
  std::string fresh;
  for (char ch = 'A'; ch <= 'Z'; ++ch)
    if (eq.find(ch) == std::string::npos) fresh += ch;
  std::vector<int64_t> dots(terms.size(), 0);
  int64_t most = 0;
  for (size_t t = 0; t < terms.size(); ++t) {
    if (terms[t].find("...") == std::string::npos) continue;
    dots[t] =
        static_cast<int64_t>(c.need(t).dims.size()) - static_cast<int64_t>(terms[t].size() - 3);
    if (dots[t] < 0) c.fail("term '" + terms[t] + "' has more letters than its operand has dims");
    most = std::max(most, dots[t]);
  }
  if (most > static_cast<int64_t>(fresh.size())) c.fail("too many dims under the ellipsis");
  std::string out;
  std::map<char, int> uses;
  for (size_t t = 0; t < terms.size(); ++t) {
    const size_t at = terms[t].find("...");
    if (at != std::string::npos)
      terms[t].replace(
          at, 3, fresh.substr(static_cast<size_t>(most - dots[t]), static_cast<size_t>(dots[t])));
    for (char ch : terms[t])
      if (fresh.find(ch) == std::string::npos) ++uses[ch];
    out += (t ? "," : "") + terms[t];
  }
  std::string rhs;
  if (arrow != std::string::npos) {
    rhs = eq.substr(arrow + 2);
    const size_t at = rhs.find("...");
    if (at != std::string::npos) rhs.replace(at, 3, fresh.substr(0, static_cast<size_t>(most)));
  } else {
    rhs = fresh.substr(0, static_cast<size_t>(most));
    for (auto& [ch, n] : uses)
      if (n == 1) rhs += ch;
  }
  return out + "->" + rhs;
}

void einsum(OpCall& c) {
  std::string eq = c.s("equation", "");
  eq.erase(std::remove(eq.begin(), eq.end(), ' '), eq.end());
  if (eq.find("...") != std::string::npos) eq = expand_ellipsis(c, eq);
  const size_t arrow = eq.find("->");
  std::string lhs = eq.substr(0, arrow), rhs;
  std::vector<std::string> terms;
  for (size_t p = 0;;) {
    size_t q = lhs.find(',', p);
    terms.push_back(lhs.substr(p, q == std::string::npos ? std::string::npos : q - p));
    if (q == std::string::npos) break;
    p = q + 1;
  }
  if (terms.size() != c.n_inputs())
    c.fail("equation names " + std::to_string(terms.size()) + " operands");
  std::map<char, int64_t> size, count;
  for (size_t t = 0; t < terms.size(); ++t) {
    const View& v = c.need(t);
    if (terms[t].size() != v.dims.size())
      c.fail("term '" + terms[t] + "' does not match the operand's rank");
    for (size_t k = 0; k < terms[t].size(); ++k) {
      const char l = terms[t][k];
      if (size.count(l) && size[l] != v.dims[k] && size[l] != 1 && v.dims[k] != 1)
        c.fail(std::string("size of '") + l + "' differs");
      size[l] = std::max(size.count(l) ? size[l] : 0, v.dims[k]);
      ++count[l];
    }
  }
  if (arrow != std::string::npos)
    rhs = eq.substr(arrow + 2);
  else
    for (auto& [l, n] : count)
      if (n == 1) rhs += l;
  std::string letters = rhs;
  for (auto& [l, n] : size)
    if (rhs.find(l) == std::string::npos) letters += l;
  Dims out, all;
  for (char l : rhs) out.push_back(size.at(l));
  for (char l : letters) all.push_back(size[l]);
  View y = c.out(0, c.need(0).dtype, out);
  // Per operand, the stride of each letter (0 when absent or broadcast).
  std::vector<Dims> st(terms.size(), Dims(letters.size(), 0));
  for (size_t t = 0; t < terms.size(); ++t) {
    const Dims s = strides_of(c.in(t).dims);
    for (size_t k = 0; k < terms[t].size(); ++k)
      if (c.in(t).dims[k] != 1) st[t][letters.find(terms[t][k])] += s[k];
  }
  dispatch_num(y.dtype, [&](auto tag) {
    using T = decltype(tag);
    T* py = y.as<T>();
    std::fill(py, py + y.numel(), T(0));
    const int64_t total = numel(all), n_red = numel(all) / std::max<int64_t>(numel(out), 1);
    Dims idx(all.size(), 0);
    for (int64_t i = 0; i < total && numel(out) > 0; ++i) {
      T prod = T(1);
      for (size_t t = 0; t < terms.size(); ++t) {
        int64_t off = 0;
        for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * st[t][d];
        prod *= c.in(t).template as<T>()[off];
      }
      py[i / std::max<int64_t>(n_red, 1)] += prod;
      for (size_t d = idx.size(); d-- > 0;) {
        if (++idx[d] < all[d]) break;
        idx[d] = 0;
      }
    }
  });
}

bool num1(const std::vector<int32_t>& d) { return !d.empty() && is_num(d[0]); }

}  // namespace

void register_reduce_ops(OpTable& t) {
  const std::pair<const char*, Red> reds[] = {{"ReduceSum", Red::sum},
                                              {"ReduceMean", Red::mean},
                                              {"ReduceMax", Red::max},
                                              {"ReduceMin", Red::min},
                                              {"ReduceProd", Red::prod},
                                              {"ReduceL1", Red::l1},
                                              {"ReduceL2", Red::l2},
                                              {"ReduceSumSquare", Red::sumsq},
                                              {"ReduceLogSumExp", Red::logsumexp},
                                              {"ReduceLogSum", Red::logsum}};
  for (const auto& [name, kind] : reds) {
    Red k = kind;
    t[name] = {[k](OpCall& c) { reduce(c, k); }, num1};
  }
  t["ArgMax"] = {[](OpCall& c) { arg(c, true); }, num1};
  t["ArgMin"] = {[](OpCall& c) { arg(c, false); }, num1};
  t["Einsum"] = {einsum, [](const std::vector<int32_t>& d) {
                   if (d.empty()) return false;
                   for (int32_t x : d)
                     if (x != d[0] || !is_num(x)) return false;
                   return true;
                 }};
}

}  // namespace hp_cpu

// hp.nn.Attention: exported scaled dot-product attention in one node (the executor fuses
// Transpose -> MatMul -> hp.nn.MaskedSoftmax -> MatMul -> Transpose into it:
// libs/exec/src/exec_fuse_attention.cpp).
//
//   Q' = Transpose(Q, perm_q), K' = Transpose(K, perm_k), V' = Transpose(V, perm_v)  (no perm:
//   the tensor as it is), P = Softmax(Where(C, fill, scale * Q' K')) along the last axis
//   (Where(C, scale * Q' K', fill) when fill_where = 0; no C: only the scale), O = P V',
//   Y = Transpose(O, perm_o)
//
// with MatMul's broadcasting of the leading (batch) dims, the mask's joining them as the Where's
// broadcast does. The Transposes are never made: each
// operand is read through its perm's strides. Per batch entry (a sequence's head) K' and V' are
// packed once into zero-padded buffers, then four query rows at a time go through the scores, the
// masked softmax and the product with V' while their scores are in cache (cpu_attention_kernels.cpp
// for float32). Where the fill is -inf and the mask hides every column from some column on in all
// four rows (a causal mask), those columns are skipped: their probabilities are exactly 0, as in
// the unfused graph, so about half of a causal attention's products are not computed.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cpu_bcast.h"
#include "cpu_internal.h"
#include "cpu_kernels.h"
#include "cpu_ops.h"

namespace hp_cpu {
namespace {

/// Transpose(x, perm) as dims and element strides into x, without moving x.
struct Strided {
  Dims dims, strides;
};

Strided permuted(const View& x, const std::vector<int64_t>& perm, const OpCall& c,
                 const char* what) {
  Strided s{x.dims, strides_of(x.dims)};
  if (x.dims.size() < 2) c.fail(std::string(what) + " must have rank >= 2");
  if (perm.empty()) return s;
  if (perm.size() != x.dims.size())
    c.fail(std::string(what) + "'s perm does not match its rank " + dims_str(x.dims));
  Strided p;
  std::vector<char> seen(perm.size(), 0);
  for (int64_t a : perm) {
    if (a < 0 || a >= static_cast<int64_t>(perm.size()) || seen[static_cast<size_t>(a)])
      c.fail(std::string(what) + "'s perm is not a permutation");
    seen[static_cast<size_t>(a)] = 1;
    p.dims.push_back(s.dims[static_cast<size_t>(a)]);
    p.strides.push_back(s.strides[static_cast<size_t>(a)]);
  }
  return p;
}

Dims lead(const Dims& d) { return Dims(d.begin(), d.end() - 2); }

/// x's strides over the broadcast batch dims (right-aligned; 0 where x has 1 or no dim).
Dims batch_strides(const Strided& x, const Dims& batch) {
  const size_t n = x.dims.size() - 2, off = batch.size() - n;
  Dims st(batch.size(), 0);
  for (size_t i = 0; i < n; ++i) st[off + i] = x.dims[i] == 1 ? 0 : x.strides[i];
  return st;
}

int64_t round16(int64_t n) { return (n + 15) / 16 * 16; }

struct Shapes {
  Strided q, k, v, o;       ///< Q' [.., T, D], K' [.., D, Tk], V' [.., Tk, Dv], O [.., T, Dv]
  Dims batch;               ///< the broadcast leading dims
  Dims qb, kb, vb, mb, ob;  ///< batch strides of each (mb: the mask's)
  int64_t T = 0, D = 0, Tk = 0, Dv = 0;
  int64_t m_row = 0, m_col = 0;  ///< the mask's strides along the scores' rows and columns
};

// The offsets of batch entry b of every operand.
void offsets(const Shapes& s, int64_t b, int64_t& q, int64_t& k, int64_t& v, int64_t& m,
             int64_t& o) {
  q = k = v = m = o = 0;
  for (size_t d = s.batch.size(); d-- > 0;) {
    const int64_t i = b % s.batch[d];
    b /= s.batch[d];
    q += i * s.qb[d];
    k += i * s.kb[d];
    v += i * s.vb[d];
    m += i * s.mb[d];
    o += i * s.ob[d];
  }
}

struct Params {
  const unsigned char* mask = nullptr;
  bool fill_where = true;
  double scale = 1, fill = 0;
  /// A query row's columns from its last visible one on are hits worth exactly 0 (fill -inf).
  bool skip = false;
  bool hit(unsigned char m) const { return (m != 0) == fill_where; }
};

/// Per query row of a batch entry's mask: one past its last visible column (0: it sees none).
/// Computed once per mask (it is usually shared by every head), not per head.
void visible_columns(const Shapes& s, const Params& p, const unsigned char* mask,
                     std::vector<int64_t>& lim) {
  lim.resize(static_cast<size_t>(s.T));
  for (int64_t i = 0; i < s.T; ++i) {
    const unsigned char* m = mask + i * s.m_row;
    int64_t last = s.Tk;
    while (last > 0 && p.hit(m[(last - 1) * s.m_col])) --last;
    lim[static_cast<size_t>(i)] = last;
  }
}

/// Float32 rows [i0, i1) of batch entry b, K' and V' already packed (kt: D x Tkp, vp: Tk x Dvp);
/// `lim` its visible_columns when hidden columns may be skipped (else null).
void rows_f32(const Shapes& s, const Params& p, const float* q, const float* kt, const float* vp,
              const unsigned char* mask, const int64_t* lim, float* y, int64_t i0, int64_t i1,
              std::vector<float>& work) {
  const int64_t Tkp = round16(s.Tk), Dvp = round16(s.Dv), D = s.D;
  work.assign(static_cast<size_t>(4 * D + 8 * Tkp + 4 * Dvp + s.Tk), 0.f);
  float *qb = work.data(), *sb = qb + 4 * D, *pb = sb + 4 * Tkp, *ob = pb + 4 * Tkp;
  auto* mrow = reinterpret_cast<unsigned char*>(ob + 4 * Dvp);  // a strided mask row, gathered
  const int64_t qt = s.q.strides[s.q.strides.size() - 2], qd = s.q.strides.back();
  const int64_t ot = s.o.strides[s.o.strides.size() - 2], od = s.o.strides.back();
  for (int64_t r0 = i0; r0 < i1; r0 += 4) {
    const int64_t rows = std::min<int64_t>(4, i1 - r0);
    for (int64_t r = 0; r < rows; ++r) {
      const float* qr = q + (r0 + r) * qt;
      if (qd == 1)
        std::copy(qr, qr + D, qb + r * D);
      else
        for (int64_t d = 0; d < D; ++d) qb[r * D + d] = qr[d * qd];
    }
    if (rows < 4) std::fill(qb + rows * D, qb + 4 * D, 0.f);
    // A row's mask, contiguous (gathered into mrow when it is not).
    auto mask_row = [&](int64_t r) -> const unsigned char* {
      if (!mask) return nullptr;
      const unsigned char* m = mask + (r0 + r) * s.m_row;
      if (s.m_col == 1) return m;
      for (int64_t j = 0; j < s.Tk; ++j) mrow[j] = m[j * s.m_col];
      return mrow;
    };
    // The columns that matter: up to the last one any of the rows sees (a row that sees nothing
    // gives NaNs over every column, as unfused).
    int64_t jmax = lim ? 0 : s.Tk;
    for (int64_t r = 0; r < rows && lim; ++r)
      jmax = lim[r0 + r] == 0 ? s.Tk : std::max(jmax, lim[r0 + r]);
    rows4_product(qb, D, kt, Tkp, D, sb, Tkp, round16(jmax));  // the scores
    for (int64_t r = 0; r < rows; ++r)
      masked_softmax_row(sb + r * Tkp, mask_row(r), p.fill_where, static_cast<float>(p.scale),
                         static_cast<float>(p.fill), pb + r * Tkp, jmax);
    rows4_product(pb, Tkp, vp, Dvp, jmax, ob, Dvp, Dvp);  // times V'
    for (int64_t r = 0; r < rows; ++r) {
      float* yr = y + (r0 + r) * ot;
      if (od == 1)
        std::copy(ob + r * Dvp, ob + r * Dvp + s.Dv, yr);
      else
        for (int64_t e = 0; e < s.Dv; ++e) yr[e * od] = ob[r * Dvp + e];
    }
  }
}

void pack_f32(const Shapes& s, const float* k, const float* v, std::vector<float>& kt,
              std::vector<float>& vp) {
  const int64_t Tkp = round16(s.Tk), Dvp = round16(s.Dv);
  kt.assign(static_cast<size_t>(s.D * Tkp), 0.f);  // the padding stays 0
  vp.assign(static_cast<size_t>(s.Tk * Dvp), 0.f);
  const size_t rk = s.k.strides.size(), rv = s.v.strides.size();
  const int64_t kd = s.k.strides[rk - 2], kj = s.k.strides[rk - 1];
  const int64_t vj = s.v.strides[rv - 2], ve = s.v.strides[rv - 1];
  for (int64_t j = 0; j < s.Tk; ++j)  // along K's rows: contiguous reads in the usual layouts
    for (int64_t d = 0; d < s.D; ++d) kt[static_cast<size_t>(d * Tkp + j)] = k[j * kj + d * kd];
  for (int64_t j = 0; j < s.Tk; ++j)
    for (int64_t e = 0; e < s.Dv; ++e) vp[static_cast<size_t>(j * Dvp + e)] = v[j * vj + e * ve];
}

/// Float64 (and any layout): the definition, row by row, in double.
void rows_f64(const Shapes& s, const Params& p, const double* q, const double* k, const double* v,
              const unsigned char* mask, double* y) {
  const size_t rq = s.q.strides.size(), rk = s.k.strides.size(), rv = s.v.strides.size();
  std::vector<double> row(static_cast<size_t>(s.Tk));
  for (int64_t i = 0; i < s.T; ++i) {
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < s.Tk; ++j) {
      double acc = 0;
      for (int64_t d = 0; d < s.D; ++d)
        acc += q[i * s.q.strides[rq - 2] + d * s.q.strides[rq - 1]] *
               k[d * s.k.strides[rk - 2] + j * s.k.strides[rk - 1]];
      double x = p.scale * acc;
      if (mask && p.hit(mask[i * s.m_row + j * s.m_col])) x = p.fill;
      row[static_cast<size_t>(j)] = x;
      mx = std::max(mx, x);
    }
    if (mx == -std::numeric_limits<double>::infinity()) mx = 0;
    double sum = 0;
    for (auto& x : row) sum += (x = std::exp(x - mx));
    for (int64_t e = 0; e < s.Dv; ++e) {
      double acc = 0;
      for (int64_t j = 0; j < s.Tk; ++j)
        acc += row[static_cast<size_t>(j)] / sum *
               v[j * s.v.strides[rv - 2] + e * s.v.strides[rv - 1]];
      y[i * s.o.strides[s.o.strides.size() - 2] + e * s.o.strides.back()] = acc;
    }
  }
}

}  // namespace

void attention(OpCall& c) {
  const View &qv = c.need(0), &kv = c.need(1), &vv = c.need(2), &cond = c.in(3);
  if (cond.present() && cond.dtype != HP_BOOL) c.fail("the mask must be bool");
  Shapes s;
  s.q = permuted(qv, c.ints("perm_q"), c, "Q");
  s.k = permuted(kv, c.ints("perm_k"), c, "K");
  s.v = permuted(vv, c.ints("perm_v"), c, "V");
  s.T = s.q.dims[s.q.dims.size() - 2];
  s.D = s.q.dims.back();
  s.Tk = s.k.dims.back();
  s.Dv = s.v.dims.back();
  if (s.k.dims[s.k.dims.size() - 2] != s.D || s.v.dims[s.v.dims.size() - 2] != s.Tk)
    c.fail("Q " + dims_str(s.q.dims) + ", K " + dims_str(s.k.dims) + " and V " +
           dims_str(s.v.dims) + " do not multiply");
  // The mask, at least a matrix; its leading dims join the batch as the Where's broadcast does.
  Strided m;
  if (cond.present()) {
    m.dims = cond.dims;
    while (m.dims.size() < 2) m.dims.insert(m.dims.begin(), 1);
    m.strides = strides_of(m.dims);
    const int64_t rows = m.dims[m.dims.size() - 2], cols = m.dims.back();
    if ((rows != 1 && rows != s.T) || (cols != 1 && cols != s.Tk))
      c.fail("the mask " + dims_str(cond.dims) + " does not broadcast to " + std::to_string(s.T) +
             " x " + std::to_string(s.Tk) + " scores");
  }
  s.batch =
      broadcast_shapes(broadcast_shapes(lead(s.q.dims), lead(s.k.dims), c), lead(s.v.dims), c);
  if (cond.present()) s.batch = broadcast_shapes(s.batch, lead(m.dims), c);
  Dims odims = s.batch;
  odims.insert(odims.end(), {s.T, s.Dv});
  // The output: O itself, or Transpose(O, perm_o) with O written through its strides.
  const std::vector<int64_t> perm_o = c.ints("perm_o");
  Dims ydims = odims;
  Dims ostr = strides_of(odims);
  if (!perm_o.empty()) {
    if (perm_o.size() != odims.size()) c.fail("perm_o does not match the output's rank");
    ydims.clear();
    for (int64_t a : perm_o) {
      if (a < 0 || a >= static_cast<int64_t>(odims.size())) c.fail("perm_o is not a permutation");
      ydims.push_back(odims[static_cast<size_t>(a)]);
    }
    const Dims yst = strides_of(ydims);
    for (size_t i = 0; i < perm_o.size(); ++i) ostr[static_cast<size_t>(perm_o[i])] = yst[i];
  }
  s.o = {odims, ostr};
  s.qb = batch_strides(s.q, s.batch);
  s.kb = batch_strides(s.k, s.batch);
  s.vb = batch_strides(s.v, s.batch);
  s.ob = Dims(ostr.begin(), ostr.end() - 2);
  Params p;
  p.scale = c.f("scale", 1.0);
  p.fill = c.f("fill", 0.0);
  p.fill_where = c.i("fill_where", 1) != 0;
  if (cond.present()) {
    s.mb = batch_strides(m, s.batch);
    s.m_row = m.dims[m.dims.size() - 2] == 1 ? 0 : m.strides[m.strides.size() - 2];
    s.m_col = m.dims.back() == 1 ? 0 : m.strides.back();
    p.mask = static_cast<const unsigned char*>(cond.data);
    p.skip = std::isinf(p.fill) && p.fill < 0;
  } else {
    s.mb = Dims(s.batch.size(), 0);
  }
  View y = c.out(0, qv.dtype, ydims);
  const int64_t nb = numel(s.batch);
  if (y.numel() == 0) return;
  if (qv.dtype == HP_F64) {
#pragma omp parallel for schedule(static) if (nb > 1 && y.numel() >= kParallelMin)
    for (int64_t b = 0; b < nb; ++b) {
      int64_t oq, ok, ov, om, oo;
      offsets(s, b, oq, ok, ov, om, oo);
      rows_f64(s, p, qv.as<double>() + oq, kv.as<double>() + ok, vv.as<double>() + ov,
               p.mask ? p.mask + om : nullptr, y.as<double>() + oo);
    }
    return;
  }
  const float *q = qv.as<float>(), *k = kv.as<float>(), *v = vv.as<float>();
  float* out = y.as<float>();
  const int64_t work = nb * s.T * s.Tk * (s.D + s.Dv);
  if (nb >= 2) {  // batch entries (heads of sequences) across the threads
#pragma omp parallel if (work >= (1 << 20))
    {
      std::vector<float> kt, vp, scratch;
      std::vector<int64_t> lim;
      int64_t lim_of = -1;  // the mask offset lim was computed for
#pragma omp for schedule(static)
      for (int64_t b = 0; b < nb; ++b) {
        int64_t oq, ok, ov, om, oo;
        offsets(s, b, oq, ok, ov, om, oo);
        if (p.skip && om != lim_of) {
          visible_columns(s, p, p.mask + om, lim);
          lim_of = om;
        }
        pack_f32(s, k + ok, v + ov, kt, vp);
        rows_f32(s, p, q + oq, kt.data(), vp.data(), p.mask ? p.mask + om : nullptr,
                 p.skip ? lim.data() : nullptr, out + oo, 0, s.T, scratch);
      }
    }
    return;
  }
  // One batch entry (one long sequence): its query rows across the threads.
  std::vector<float> kt, vp;
  std::vector<int64_t> lim;
  pack_f32(s, k, v, kt, vp);
  if (p.skip) visible_columns(s, p, p.mask, lim);
  const int64_t blocks = (s.T + 3) / 4;
#pragma omp parallel if (work >= (1 << 20) && blocks > 1)
  {
    std::vector<float> scratch;
#pragma omp for schedule(static)
    for (int64_t bl = 0; bl < blocks; ++bl)
      rows_f32(s, p, q, kt.data(), vp.data(), p.mask, p.skip ? lim.data() : nullptr, out, bl * 4,
               std::min(s.T, bl * 4 + 4), scratch);
  }
}

}  // namespace hp_cpu

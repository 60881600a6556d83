// Exported attention (libs/exec/src/exec_fuse_attention.cpp): the heads' Transposes, QK^T, scale,
// mask, Softmax, the product with V and the Transpose back run as one hp.nn.Attention node with the
// values the eleven nodes compute (checked here in double): a causal -inf mask (whose hidden
// columns the kernel skips), a finite fill, no mask, ragged sizes (the kernels' 16-column
// remainders), one long sequence (rows split across threads), rank-3 operands without head
// Transposes as nn.MultiheadAttention exports them, and a mask broadcast along the keys. Left alone
// when the probabilities are a graph output.
#include <catch2/catch.hpp>

#include <onnx/onnx_pb.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "exec_test_util.h"
#include "hp/exec/backends.h"
#include "hp/exec/executor.h"
#include "hp/exec/tensor.h"

using namespace hp;
using namespace hp::exec;
using namespace hp::exec::test;

namespace {

struct Case {
  std::int64_t B = 2, H = 3, T = 37, Tk = 37, D = 20, Dv = 24;
  bool masked = true;
  float fill = -std::numeric_limits<float>::infinity();
  bool heads = true;          ///< rank 4 [B, T, H, D] with head Transposes; else rank 3 [B*H, T, D]
  bool expose_probs = false;  ///< P also a graph output: nothing fuses
  bool row_mask = false;      ///< a [T, 1] mask hiding whole query rows (read with stride 0)
  bool mask_batch = false;    ///< the mask [1, T, Tk]: a leading dim joining the batch
};

void set_perm(onnx::NodeProto* n, std::vector<std::int64_t> perm) {
  auto* a = n->add_attribute();
  a->set_name("perm");
  a->set_type(onnx::AttributeProto::INTS);
  for (auto p : perm) a->add_ints(p);
}

onnx::ModelProto attention_model(const Case& c) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  const std::int64_t BH = c.B * c.H;
  if (c.heads) {
    add_value(g->mutable_input(), "Q", {c.B, c.T, c.H, c.D});
    add_value(g->mutable_input(), "K", {c.B, c.Tk, c.H, c.D});
    add_value(g->mutable_input(), "V", {c.B, c.Tk, c.H, c.Dv});
    add_value(g->mutable_output(), "Y", {c.B, c.T, c.H, c.Dv});
    set_perm(add_node(g, "Transpose", {"Q"}, {"q"}, "tq"), {0, 2, 1, 3});
    set_perm(add_node(g, "Transpose", {"K"}, {"kt"}, "tk"), {0, 2, 3, 1});
    set_perm(add_node(g, "Transpose", {"V"}, {"v"}, "tv"), {0, 2, 1, 3});
  } else {
    add_value(g->mutable_input(), "q", {BH, c.T, c.D});
    add_value(g->mutable_input(), "K", {BH, c.Tk, c.D});
    add_value(g->mutable_input(), "v", {BH, c.Tk, c.Dv});
    add_value(g->mutable_output(), "o", {BH, c.T, c.Dv});
    set_perm(add_node(g, "Transpose", {"K"}, {"kt"}, "tk"), {0, 2, 1});
  }
  if (c.masked)
    add_value(g->mutable_input(), "mask",
              c.mask_batch ? std::vector<std::int64_t>{1, c.T, c.Tk}
                           : std::vector<std::int64_t>{c.T, c.row_mask ? 1 : c.Tk},
              onnx::TensorProto::BOOL);
  if (c.expose_probs) add_value(g->mutable_output(), "p", {BH / c.H, c.H, c.T, c.Tk});
  add_scalar_constant(g, "scale", 1.f / std::sqrt(static_cast<float>(c.D)));
  add_scalar_constant(g, "fill", c.fill);
  add_node(g, "MatMul", {"q", "kt"}, {"s"}, "qk");
  add_node(g, "Mul", {"s", "scale"}, {"s2"}, "scale");
  std::string scores = "s2";
  if (c.masked) {
    add_node(g, "Where", {"mask", "fill", "s2"}, {"w"}, "where");
    scores = "w";
  }
  add_node(g, "Softmax", {scores}, {"p"}, "softmax");
  add_node(g, "MatMul", {"p", "v"}, {"o"}, "pv");
  if (c.heads) set_perm(add_node(g, "Transpose", {"o"}, {"Y"}, "to"), {0, 2, 1, 3});
  return m;
}

std::vector<float> values(std::int64_t n, float freq) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(freq * static_cast<float>(i) + 0.3f);
  return v;
}

// Runs the model; checks its first output against attention computed here in double. Returns
// whether the executor ran one hp.nn.Attention and no MatMul.
bool run_and_check(const Case& c) {
  fs::path d = temp_dir("attention_fusion");
  auto mm = load(write_model(d, attention_model(c)));
  Backends b = cpu();
  auto ex = Executor::create(mm, {b.primary, b.cpu, nullptr});
  REQUIRE(ex.ok());
  const std::int64_t BH = c.B * c.H;
  const auto q = values(BH * c.T * c.D, 0.37f), k = values(BH * c.Tk * c.D, 0.53f),
             v = values(BH * c.Tk * c.Dv, 0.71f);
  // The query row i sees key j when j <= i + (Tk - T) (causal), and every third query row also
  // hides key 0; a row mask hides every fourth row whole.
  auto hidden = [&](std::int64_t i, std::int64_t j) {
    if (c.row_mask) return i % 4 == 1;
    return j > i + (c.Tk - c.T) || (i % 3 == 0 && j == 0 && i > 0);
  };
  std::vector<HostTensor> in;
  if (c.heads) {
    in = {f32({c.B, c.T, c.H, c.D}, q), f32({c.B, c.Tk, c.H, c.D}, k),
          f32({c.B, c.Tk, c.H, c.Dv}, v)};
  } else {
    in = {f32({BH, c.T, c.D}, q), f32({BH, c.Tk, c.D}, k), f32({BH, c.Tk, c.Dv}, v)};
  }
  in[0].name = c.heads ? "Q" : "q";
  in[1].name = "K";
  in[2].name = c.heads ? "V" : "v";
  if (c.masked) {
    HostTensor mask;
    mask.name = "mask";
    mask.dtype = HP_BOOL;
    const std::int64_t cols = c.row_mask ? 1 : c.Tk;
    mask.dims = {c.T, cols};
    if (c.mask_batch) mask.dims.insert(mask.dims.begin(), 1);
    mask.data.resize(static_cast<std::size_t>(c.T * cols));
    for (std::int64_t i = 0; i < c.T; ++i)
      for (std::int64_t j = 0; j < cols; ++j)
        mask.data[static_cast<std::size_t>(i * cols + j)] = hidden(i, j);
    in.push_back(mask);
  }
  auto out = (*ex)->run(in);
  REQUIRE(out.ok());
  const float* y = (*out)[0].as<float>();
  // Element (bh, i, e) of O: at [b, i, h, e] with head Transposes, [bh, i, e] without.
  auto q_at = [&](std::int64_t bh, std::int64_t i, std::int64_t e) {
    const std::int64_t bb = bh / c.H, h = bh % c.H;
    return c.heads ? ((bb * c.T + i) * c.H + h) * c.D + e : (bh * c.T + i) * c.D + e;
  };
  auto kv_at = [&](std::int64_t bh, std::int64_t j, std::int64_t e, std::int64_t w) {
    const std::int64_t bb = bh / c.H, h = bh % c.H;
    return c.heads ? ((bb * c.Tk + j) * c.H + h) * w + e : (bh * c.Tk + j) * w + e;
  };
  auto y_at = [&](std::int64_t bh, std::int64_t i, std::int64_t e) {
    const std::int64_t bb = bh / c.H, h = bh % c.H;
    return c.heads ? ((bb * c.T + i) * c.H + h) * c.Dv + e : (bh * c.T + i) * c.Dv + e;
  };
  double worst = 0;
  for (std::int64_t bh = 0; bh < BH; ++bh)
    for (std::int64_t i = 0; i < c.T; ++i) {
      std::vector<double> p(static_cast<std::size_t>(c.Tk));
      double mx = -INFINITY, sum = 0;
      for (std::int64_t j = 0; j < c.Tk; ++j) {
        double s = 0;
        for (std::int64_t e = 0; e < c.D; ++e)
          s += static_cast<double>(q[q_at(bh, i, e)]) * k[kv_at(bh, j, e, c.D)];
        s *= 1.0 / std::sqrt(static_cast<double>(c.D));
        if (c.masked && hidden(i, j)) s = c.fill;
        p[j] = s;
        mx = std::max(mx, s);
      }
      for (double& x : p) sum += (x = std::exp(x - mx));
      for (std::int64_t e = 0; e < c.Dv; ++e) {
        double o = 0;
        for (std::int64_t j = 0; j < c.Tk; ++j) o += p[j] / sum * v[kv_at(bh, j, e, c.Dv)];
        worst = std::max(worst, std::fabs(o - y[y_at(bh, i, e)]));
      }
    }
  CHECK(worst < 2e-6);
  const auto& ops = (*ex)->stats().by_op;
  const bool fused = ops.count("hp.nn.Attention") == 1 && ops.count("MatMul") == 0;
  fs::remove_all(d);
  return fused;
}

}  // namespace

TEST_CASE("exported attention runs as one hp.nn.Attention with the same values", "[exec]") {
  CHECK(run_and_check(Case{}));  // causal -inf mask: hidden columns skipped
  Case finite;                   // a finite fill: every column computed
  finite.fill = -1e4f;
  CHECK(run_and_check(finite));
  Case unmasked;
  unmasked.masked = false;
  CHECK(run_and_check(unmasked));
  Case longer;  // more keys than queries (a cache), 64-column tiles and their remainders
  longer.T = 29;
  longer.Tk = 150;
  longer.D = 64;
  longer.Dv = 80;
  CHECK(run_and_check(longer));
  Case one;  // one sequence of one head: its query rows across the threads
  one.B = one.H = 1;
  one.T = one.Tk = 300;
  one.D = one.Dv = 16;
  CHECK(run_and_check(one));
  Case mha;  // nn.MultiheadAttention's rank-3 batched heads: only K's Transpose
  mha.heads = false;
  CHECK(run_and_check(mha));
  mha.mask_batch = true;  // and a [1, T, Tk] mask
  CHECK(run_and_check(mha));
  Case rows;  // a [T, 1] mask, broadcast along the keys, with a finite fill: hidden rows average V
  rows.row_mask = true;
  rows.fill = -1e4f;
  CHECK(run_and_check(rows));
}

TEST_CASE("attention whose probabilities are a graph output is not fused", "[exec]") {
  Case c;
  c.expose_probs = true;
  CHECK_FALSE(run_and_check(c));
}

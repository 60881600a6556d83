// Attention's scale -> mask -> Softmax (libs/exec/src/exec_fuse_softmax.cpp): fused into one
// hp.nn.MaskedSoftmax node with the values the three nodes compute, for the mask on either side of
// the Where, a Div scale and a mask that broadcasts; left alone when the Softmax is not along the
// last axis or an intermediate is a graph output.
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

struct Chain {
  bool div = false;        ///< Div(x, 8) instead of Mul(x, 0.125)
  bool fill_first = true;  ///< Where(mask, fill, s) rather than Where(mask, s, fill)
  bool masked = true;
  int axis = -1;  ///< the Softmax's
  bool scaled_is_output = false;
  // Scores [batch, q, k]; the mask [q, k], or [q, 1] (one bit per query row) with column_mask.
  std::int64_t batch = 2, q = 3, k = 4;
  bool column_mask = false;
};

// scores x [batch, q, k], a causal mask [q, k] (key > query + 1 is masked), or with column_mask a
// [q, 1] mask that masks whole rows where q is odd.
onnx::ModelProto chain_model(const Chain& c) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(14);
  auto* g = m.mutable_graph();
  add_value(g->mutable_input(), "x", {c.batch, c.q, c.k});
  add_value(g->mutable_input(), "mask", {c.q, c.column_mask ? 1 : c.k}, onnx::TensorProto::BOOL);
  add_value(g->mutable_output(), "y", {c.batch, c.q, c.k});
  if (c.scaled_is_output) add_value(g->mutable_output(), "s", {c.batch, c.q, c.k});
  add_scalar_constant(g, "k", c.div ? 8.f : 0.125f);
  add_scalar_constant(g, "fill", -std::numeric_limits<float>::infinity());
  add_node(g, c.div ? "Div" : "Mul", {"x", "k"}, {"s"}, "scale");
  std::string scores = "s";
  if (c.masked) {
    // Where(mask, fill, s) masks where mask is true; Where(not_mask, s, fill) the same positions.
    if (c.fill_first) {
      add_node(g, "Where", {"mask", "fill", "s"}, {"w"}, "where");
    } else {
      add_node(g, "Not", {"mask"}, {"keep"}, "not");
      add_node(g, "Where", {"keep", "s", "fill"}, {"w"}, "where");
    }
    scores = "w";
  }
  auto* sm = add_node(g, "Softmax", {scores}, {"y"}, "softmax");
  auto* a = sm->add_attribute();
  a->set_name("axis");
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(c.axis);
  return m;
}

// Returns whether the executor fused the chain; checks the values either way.
bool run_and_check(const Chain& c) {
  fs::path d = temp_dir("masked_softmax");
  auto mm = load(write_model(d, chain_model(c)));
  Backends b = cpu();
  auto ex = Executor::create(mm, {b.primary, b.cpu, nullptr});
  REQUIRE(ex.ok());
  const std::int64_t n = c.batch * c.q * c.k, mk = c.column_mask ? 1 : c.k;
  std::vector<float> x(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(1.3f * static_cast<float>(i)) * 6.f;
  auto masked_at = [&](std::int64_t q, std::int64_t k) {
    return c.column_mask ? q % 2 == 1 : k > q + 1;
  };
  HostTensor mask;
  mask.name = "mask";
  mask.dtype = HP_BOOL;
  mask.dims = {c.q, mk};
  mask.data.resize(static_cast<std::size_t>(c.q * mk));
  for (std::int64_t q = 0; q < c.q; ++q)
    for (std::int64_t k = 0; k < mk; ++k)
      mask.data[static_cast<std::size_t>(q * mk + k)] = masked_at(q, k);
  auto out = (*ex)->run({f32({c.batch, c.q, c.k}, x), mask});
  REQUIRE(out.ok());
  const bool last = c.axis == -1 || c.axis == 2;
  const float* y = (*out)[0].as<float>();
  for (std::int64_t bq = 0; bq < c.batch * c.q && last; ++bq) {  // rows along the last axis
    const std::int64_t q = bq % c.q;
    std::vector<double> row(static_cast<std::size_t>(c.k));
    double mx = -INFINITY, sum = 0;
    for (std::int64_t k = 0; k < c.k; ++k) {
      const bool masked = c.masked && masked_at(q, k);
      row[k] = masked ? -INFINITY : x[static_cast<std::size_t>(bq * c.k + k)] / 8.0;
      mx = std::max(mx, row[k]);
    }
    for (double& v : row) sum += (v = std::exp(v - mx));
    for (std::int64_t k = 0; k < c.k; ++k) {
      const float got = y[bq * c.k + k];
      if (mx == -INFINITY) {  // a row masked everywhere: NaNs, as Softmax of all -inf gives
        CHECK(std::isnan(got));
      } else {
        CHECK(got == Approx(row[static_cast<std::size_t>(k)] / sum).margin(1e-6));
      }
    }
  }
  const bool fused = (*ex)->stats().by_op.count("hp.nn.MaskedSoftmax") == 1;
  if (fused) CHECK((*ex)->stats().by_op.count("Softmax") == 0);
  fs::remove_all(d);
  return fused;
}

}  // namespace

TEST_CASE("scale, mask and Softmax run as one hp.nn.MaskedSoftmax with the same values", "[exec]") {
  CHECK(run_and_check(Chain{}));
  Chain div;  // a Div by sqrt(d) as some exporters write it
  div.div = true;
  CHECK(run_and_check(div));
  Chain fill_last;  // the mask selecting what is kept
  fill_last.fill_first = false;
  CHECK(run_and_check(fill_last));
  Chain unmasked;  // scale and Softmax alone
  unmasked.masked = false;
  CHECK(run_and_check(unmasked));
  // Rows long enough for the vector loops and their remainders, and enough of them that the rows
  // are split across threads; both sides of the Where, and no mask.
  for (int variant = 0; variant < 3; ++variant) {
    Chain big;
    big.batch = 24;
    big.q = 40;
    big.k = 77;
    big.fill_first = variant != 1;
    big.masked = variant != 2;
    CHECK(run_and_check(big));
  }
  // A mask that broadcasts along the rows (stride 0 along the key axis): rows masked everywhere
  // give NaNs, the others are unmasked.
  Chain per_row;
  per_row.q = 6;
  per_row.k = 20;
  per_row.column_mask = true;
  CHECK(run_and_check(per_row));
}

TEST_CASE("a masked Softmax not along the last axis, or with an exposed input, is not fused",
          "[exec]") {
  Chain middle;
  middle.axis = 1;
  CHECK_FALSE(run_and_check(middle));
  Chain exposed;
  exposed.scaled_is_output = true;
  exposed.masked = false;
  CHECK_FALSE(run_and_check(exposed));
}

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
};

// scores x [2, 3, 4] (batch, query, key), a causal mask [3, 4] (key > query + 1 is masked).
onnx::ModelProto chain_model(const Chain& c) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(14);
  auto* g = m.mutable_graph();
  add_value(g->mutable_input(), "x", {2, 3, 4});
  add_value(g->mutable_input(), "mask", {3, 4}, onnx::TensorProto::BOOL);
  add_value(g->mutable_output(), "y", {2, 3, 4});
  if (c.scaled_is_output) add_value(g->mutable_output(), "s", {2, 3, 4});
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
  std::vector<float> x(24);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(1.3f * static_cast<float>(i)) * 6.f;
  HostTensor mask;
  mask.name = "mask";
  mask.dtype = HP_BOOL;
  mask.dims = {3, 4};
  mask.data.resize(12);
  for (int q = 0; q < 3; ++q)
    for (int k = 0; k < 4; ++k) mask.data[static_cast<std::size_t>(q * 4 + k)] = k > q + 1;
  auto out = (*ex)->run({f32({2, 3, 4}, x), mask});
  REQUIRE(out.ok());
  const bool last = c.axis == -1 || c.axis == 2;
  for (int bq = 0; bq < 6 && last; ++bq) {  // rows of 4 along the last axis
    const int q = bq % 3;
    double row[4], mx = -1e30, sum = 0;
    for (int k = 0; k < 4; ++k) {
      const bool masked = c.masked && k > q + 1;
      row[k] = masked ? -INFINITY : x[static_cast<std::size_t>(bq * 4 + k)] / 8.0;
      mx = std::max(mx, row[k]);
    }
    for (double& v : row) sum += (v = std::exp(v - mx));
    for (int k = 0; k < 4; ++k)
      CHECK((*out)[0].as<float>()[bq * 4 + k] == Approx(row[k] / sum).margin(1e-6));
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

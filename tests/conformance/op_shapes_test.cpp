// The cpu plugin refuses malformed shapes at the ABI boundary instead of indexing past them: rank-0
// inputs to ops that take an axis (Concat of scalars wrote past its dims), axes out of range, ranks
// that differ, negative dims and element counts that overflow. Each case must come back as an error
// status from run_op, and well-formed neighbours of each case must still run.
#include <cstring>
#include <deque>

#include "conformance_util.h"

using namespace conformance;

namespace {

// Host buffers for the outputs the plugin asks for (the cpu plugin's memory is host memory).
struct Outputs {
  std::deque<std::vector<char>> buffers;
  std::vector<std::vector<int64_t>> dims;
};

int32_t alloc_output(void* user, int32_t, int32_t dtype, int32_t rank, const int64_t* dims,
                     hp_tensor_desc* out) {
  auto* o = static_cast<Outputs*>(user);
  int64_t n = 1;
  for (int k = 0; k < rank; ++k) n *= dims[k];
  if (n > (int64_t{1} << 24)) return 0;  // a test never needs more; refuse instead of swapping
  o->buffers.emplace_back(static_cast<std::size_t>(n * 8 + 8), 0);
  o->dims.emplace_back(dims, dims + rank);
  std::memset(out, 0, sizeof *out);
  out->dtype = dtype;
  out->rank = rank;
  for (int k = 0; k < rank; ++k) out->dims[k] = dims[k];
  out->data = o->buffers.back().data();
  return 1;
}

hp_tensor_desc tensor(std::vector<int64_t> dims, float* data) {
  hp_tensor_desc t;
  std::memset(&t, 0, sizeof t);
  t.dtype = HP_F32;
  t.rank = static_cast<int32_t>(dims.size());
  for (std::size_t k = 0; k < dims.size(); ++k) t.dims[k] = dims[k];
  t.data = data;
  return t;
}

hp_op_attr int_attr(const char* name, int64_t v) {
  hp_op_attr a;
  std::memset(&a, 0, sizeof a);
  a.name = name;
  a.kind = HP_ATTR_INT;
  a.i = v;
  return a;
}

hp_op_attr ints_attr(const char* name, const std::vector<int64_t>& v) {
  hp_op_attr a;
  std::memset(&a, 0, sizeof a);
  a.name = name;
  a.kind = HP_ATTR_INTS;
  a.ints = v.data();
  a.n = static_cast<int64_t>(v.size());
  return a;
}

// Runs one node on the cpu plugin; the status (ok or the plugin's error).
hp::Status run(const std::string& op, std::vector<hp_tensor_desc> inputs,
               std::vector<hp_op_attr> attrs = {}, int64_t opset = 17) {
  auto b = registry().find("cpu");
  REQUIRE(b);
  REQUIRE(b->has_run_op());
  Outputs outs;
  hp_op_desc d;
  std::memset(&d, 0, sizeof d);
  d.struct_size = sizeof d;
  d.op_type = op.c_str();
  d.domain = "";
  d.opset = opset;
  d.node_name = "n";
  d.attrs = attrs.data();
  d.n_attrs = static_cast<int64_t>(attrs.size());
  d.inputs = inputs.data();
  d.n_inputs = static_cast<int64_t>(inputs.size());
  d.n_outputs = 1;
  d.alloc_output = alloc_output;
  d.alloc_user = &outs;
  Stream s(*b);
  return b->run_op(s.get(), d);
}

}  // namespace

TEST_CASE("cpu ops: Concat of rank-0 inputs is an error, not a write past the dims", "[cpu]") {
  float x = 1, y = 2;
  auto st = run("Concat", {tensor({}, &x), tensor({}, &y)}, {int_attr("axis", 0)});
  REQUIRE_FALSE(st.ok());
  CHECK(st.error().str().find("scalar") != std::string::npos);
  float a[2] = {1, 2}, c[3] = {3, 4, 5};
  CHECK(run("Concat", {tensor({2}, a), tensor({3}, c)}, {int_attr("axis", 0)}).ok());
}

TEST_CASE("cpu ops: Concat checks ranks, axes and the other dims", "[cpu]") {
  float a[6] = {}, b[6] = {};
  CHECK_FALSE(run("Concat", {tensor({2, 3}, a), tensor({6}, b)}, {int_attr("axis", 0)}).ok());
  CHECK_FALSE(run("Concat", {tensor({2, 3}, a), tensor({2, 3}, b)}, {int_attr("axis", 2)}).ok());
  CHECK_FALSE(run("Concat", {tensor({2, 3}, a), tensor({2, 3}, b)}, {int_attr("axis", -3)}).ok());
  CHECK_FALSE(run("Concat", {tensor({2, 3}, a), tensor({3, 2}, b)}, {int_attr("axis", 0)}).ok());
  CHECK(run("Concat", {tensor({2, 3}, a), tensor({2, 3}, b)}, {int_attr("axis", -1)}).ok());
}

TEST_CASE("cpu ops: an axis on a scalar is refused by every axis-taking op", "[cpu]") {
  float x = 1;
  CHECK_FALSE(run("Split", {tensor({}, &x)}, {int_attr("axis", 0)}).ok());
  CHECK_FALSE(run("CumSum", {tensor({}, &x), tensor({}, &x)}).ok());
  CHECK_FALSE(run("Gather", {tensor({}, &x), tensor({}, &x)}, {int_attr("axis", 0)}).ok());
  CHECK_FALSE(run("ReduceSum", {tensor({}, &x)}, {ints_attr("axes", {0})}, 11).ok());
  CHECK_FALSE(run("Flatten", {tensor({}, &x)}, {int_attr("axis", 1)}).ok());
}

TEST_CASE("cpu ops: negative and overflowing input dims are refused before any kernel", "[cpu]") {
  float a[4] = {};
  CHECK_FALSE(run("Relu", {tensor({-1, 4}, a)}).ok());
  CHECK_FALSE(run("Relu", {tensor({int64_t{1} << 40, int64_t{1} << 40}, a)}).ok());
  CHECK_FALSE(run("Concat", {tensor({2, -2}, a), tensor({2, 2}, a)}, {int_attr("axis", 0)}).ok());
  CHECK(run("Relu", {tensor({2, 2}, a)}).ok());
}

TEST_CASE("cpu ops: Transpose with a perm of the wrong length or a repeated axis", "[cpu]") {
  float a[6] = {};
  CHECK_FALSE(run("Transpose", {tensor({2, 3}, a)}, {ints_attr("perm", {0})}).ok());
  CHECK_FALSE(run("Transpose", {tensor({2, 3}, a)}, {ints_attr("perm", {0, 0})}).ok());
  CHECK_FALSE(run("Transpose", {tensor({2, 3}, a)}, {ints_attr("perm", {0, 5})}).ok());
  CHECK(run("Transpose", {tensor({2, 3}, a)}, {ints_attr("perm", {1, 0})}).ok());
}

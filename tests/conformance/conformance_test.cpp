// Backend conformance: the same kernel checks on every plugin that loads, each result compared with
// the cpu plugin (the reference), and the cpu plugin itself compared with plain loops. Modelled on
// ggml's test-backend-ops: one list of cases, run per backend. To cover a new op, add it to
// kEltwiseOps (or a gemm shape to kGemmCases); to cover a new backend, add a TEST_CASE line at the
// bottom with its tag.
//
// ascend runs against the fake CANN runtime (tests/fakes/ascend), end to end through dlopen, aclnn
// descriptors and asynchronous streams. cuda runs when a GPU is present; otherwise its cases pass
// with a printed reason (CTest label "cuda" selects them).
#include "conformance_util.h"

using namespace conformance;

namespace {

struct GemmCase {
  int64_t m, n, k;
  bool ta, tb;
  int64_t batch;
  double alpha, beta;
  int64_t pad;       // extra elements per row (leading dimension > minimum)
  bool broadcast_b;  // stride_b = 0: one B for every batch
};

const GemmCase kGemmCases[] = {
    {1, 1, 1, false, false, 1, 1.0, 0.0, 0, false},
    {7, 5, 3, false, false, 1, 1.0, 0.0, 0, false},
    {64, 48, 32, false, false, 1, 1.0, 0.0, 0, false},
    {33, 17, 65, true, false, 1, 1.0, 0.0, 0, false},
    {31, 29, 13, false, true, 1, 1.0, 0.0, 0, false},
    {19, 23, 37, true, true, 1, 1.0, 0.0, 0, false},
    {16, 8, 24, false, false, 1, 1.0, 0.0, 5, false},
    {9, 11, 7, false, false, 1, 0.5, 2.0, 0, false},
    {12, 10, 6, false, false, 4, 1.0, 0.0, 0, false},
    {5, 7, 9, true, true, 3, 1.0, 0.0, 2, false},
    {8, 6, 10, false, false, 5, 1.0, 0.0, 0, true},
    {6, 9, 4, false, true, 2, -1.5, 0.25, 1, false},
};

/// Plain-loop reference for the cpu plugin's own check.
std::vector<float> naive_gemm(const GemmCase& c, const hp_gemm_desc& d, const std::vector<float>& A,
                              const std::vector<float>& B, std::vector<float> C) {
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        double acc = 0;
        for (int64_t p = 0; p < c.k; ++p) {
          double av = c.ta ? A[b * d.stride_a + p * d.lda + i] : A[b * d.stride_a + i * d.lda + p];
          double bv = c.tb ? B[b * d.stride_b + j * d.ldb + p] : B[b * d.stride_b + p * d.ldb + j];
          acc += av * bv;
        }
        float& out = C[b * d.stride_c + i * d.ldc + j];
        out = float(c.alpha * acc + (c.beta != 0 ? c.beta * out : 0.0));
      }
  return C;
}

/// Runs `c` on backend `b` with inputs A, B, C0 and returns C.
std::vector<float> run_gemm(const Backend& b, const GemmCase& c, hp_gemm_desc d,
                            const std::vector<float>& A, const std::vector<float>& B,
                            const std::vector<float>& C0) {
  Stream s(b);
  DeviceBuffer a(b, A.size()), bb(b, B.size()), cc(b, C0.size());
  upload(b, s.get(), a, A);
  upload(b, s.get(), bb, B);
  upload(b, s.get(), cc, C0);
  d.a = a.get();
  d.b = bb.get();
  d.c = cc.get();
  require_ok(b.gemm(s.get(), d));
  return download(b, s.get(), cc);
}

void check_gemm(const Backend& b, bool against_loops) {
  const Backend& ref = *registry().find("cpu");
  REQUIRE(b.supports(0, HP_OP_GEMM, HP_F32));
  unsigned seed = 1;
  for (const auto& c : kGemmCases) {
    hp_gemm_desc d{};
    d.struct_size = sizeof d;
    d.trans_a = c.ta;
    d.trans_b = c.tb;
    d.m = c.m, d.n = c.n, d.k = c.k, d.batch = c.batch;
    d.lda = (c.ta ? c.m : c.k) + c.pad;
    d.ldb = (c.tb ? c.k : c.n) + c.pad;
    d.ldc = c.n + c.pad;
    d.stride_a = (c.ta ? c.k : c.m) * d.lda;
    d.stride_b = c.broadcast_b ? 0 : (c.tb ? c.n : c.k) * d.ldb;
    d.stride_c = c.m * d.ldc;
    d.alpha = c.alpha, d.beta = c.beta;
    d.type_a = d.type_b = d.type_c = d.type_compute = HP_F32;
    auto A = random_floats(std::size_t(d.stride_a * c.batch), seed++);
    auto B = random_floats(
        std::size_t(c.broadcast_b ? (c.tb ? c.n : c.k) * d.ldb : d.stride_b * c.batch), seed++);
    auto C0 = random_floats(std::size_t(d.stride_c * c.batch), seed++);
    INFO("gemm m=" << c.m << " n=" << c.n << " k=" << c.k << " ta=" << c.ta << " tb=" << c.tb
                   << " batch=" << c.batch << " alpha=" << c.alpha << " beta=" << c.beta
                   << " pad=" << c.pad << " bcast_b=" << c.broadcast_b);
    auto want = against_loops ? naive_gemm(c, d, A, B, C0) : run_gemm(ref, c, d, A, B, C0);
    auto got = run_gemm(b, c, d, A, B, C0);
    // Padding columns of C must be left alone: compare whole buffers.
    CHECK(relative_error(got, want) < kTolerance);
  }
}

struct EltwiseOp {
  int op;
  const char* name;
  bool binary;
};

const EltwiseOp kEltwiseOps[] = {
    {HP_OP_ADD, "add", true},          {HP_OP_SUB, "sub", true},    {HP_OP_MUL, "mul", true},
    {HP_OP_DIV, "div", true},          {HP_OP_MAX, "max", true},    {HP_OP_MIN, "min", true},
    {HP_OP_RELU, "relu", false},       {HP_OP_GELU, "gelu", false}, {HP_OP_SILU, "silu", false},
    {HP_OP_SIGMOID, "sigmoid", false}, {HP_OP_TANH, "tanh", false}, {HP_OP_EXP, "exp", false},
    {HP_OP_NEG, "neg", false},         {HP_OP_SQRT, "sqrt", false}, {HP_OP_SCALE, "scale", false},
};

std::vector<float> run_eltwise(const Backend& b, const hp_elementwise_desc& proto,
                               const std::vector<float>& X, const std::vector<float>& Y) {
  Stream s(b);
  DeviceBuffer x(b, X.size()), y(b, std::max<std::size_t>(Y.size(), 1)), out(b, X.size());
  upload(b, s.get(), x, X);
  if (!Y.empty()) upload(b, s.get(), y, Y);
  hp_elementwise_desc d = proto;
  d.x = x.get();
  d.y = Y.empty() ? nullptr : y.get();
  d.out = out.get();
  require_ok(b.elementwise(s.get(), d));
  return download(b, s.get(), out);
}

float naive_eltwise(int op, float x, float y, double scalar) {
  switch (op) {
    case HP_OP_ADD: return x + y;
    case HP_OP_SUB: return x - y;
    case HP_OP_MUL: return x * y;
    case HP_OP_DIV: return x / y;
    case HP_OP_MAX: return std::max(x, y);
    case HP_OP_MIN: return std::min(x, y);
    case HP_OP_RELU: return x > 0 ? x : 0;
    case HP_OP_GELU: return float(0.5 * x * (1 + std::erf(x / std::sqrt(2.0))));
    case HP_OP_SILU: return float(x / (1 + std::exp(-double(x))));
    case HP_OP_SIGMOID: return float(1 / (1 + std::exp(-double(x))));
    case HP_OP_TANH: return std::tanh(x);
    case HP_OP_EXP: return std::exp(x);
    case HP_OP_NEG: return -x;
    case HP_OP_SQRT: return std::sqrt(x);
    case HP_OP_SCALE: return float(x * scalar);
  }
  return 0;
}

void check_elementwise(const Backend& b, bool against_loops) {
  const Backend& ref = *registry().find("cpu");
  for (const auto& op : kEltwiseOps) {
    if (!b.supports(0, op.op, HP_F32)) {
      WARN(b.name() << " does not support " << op.name << ", skipped");
      continue;
    }
    // n odd (tail handling) and large enough for the cpu's threaded path; y broadcast as a bias
    // row.
    for (int64_t n : {int64_t(1), int64_t(1001), int64_t(70000)}) {
      for (int64_t y_len : {int64_t(0), int64_t(7)}) {
        if (y_len && (!op.binary || n % y_len)) continue;
        auto X = random_floats(std::size_t(n), unsigned(op.op * 7 + n));
        if (op.op == HP_OP_SQRT)
          for (auto& v : X) v = std::fabs(v);
        std::vector<float> Y;
        if (op.binary) {
          Y = random_floats(std::size_t(y_len ? y_len : n), unsigned(op.op * 13 + n), 0.5f, 2.0f);
          for (std::size_t i = 0; i < Y.size(); i += 2) Y[i] = -Y[i];
        }
        hp_elementwise_desc d{};
        d.struct_size = sizeof d;
        d.op = op.op, d.dtype = HP_F32, d.n = n, d.y_len = y_len, d.scalar = -0.75;
        INFO(op.name << " n=" << n << " y_len=" << y_len);
        std::vector<float> want(X.size());
        if (against_loops) {
          for (std::size_t i = 0; i < X.size(); ++i)
            want[i] = naive_eltwise(op.op, X[i], op.binary ? Y[i % Y.size()] : 0.0f, d.scalar);
        } else {
          want = run_eltwise(ref, d, X, Y);
        }
        CHECK(relative_error(run_eltwise(b, d, X, Y), want) < 1e-5);
      }
    }
  }
}

/// host → device → device → host, with pageable and pinned host memory, and host → host.
void check_copies(const Backend& b) {
  Stream s(b);
  const std::size_t n = 4099;
  auto data = random_floats(n, 99);
  DeviceBuffer d1(b, n), d2(b, n), pinned(b, n, HP_MEM_PINNED_HOST),
      pinned2(b, n, HP_MEM_PINNED_HOST);
  std::vector<float> back(n, 0.0f);
  std::copy(data.begin(), data.end(), pinned.get());
  require_ok(b.copy_async(s.get(), pinned2.get(), pinned.get(), n * sizeof(float), HP_H2H));
  require_ok(b.copy_async(s.get(), d1.get(), pinned2.get(), n * sizeof(float), HP_H2D));
  require_ok(b.copy_async(s.get(), d2.get(), d1.get(), n * sizeof(float), HP_D2D));
  require_ok(b.copy_async(s.get(), back.data(), d2.get(), n * sizeof(float), HP_D2H));
  require_ok(b.stream_sync(s.get()));
  CHECK(back == data);
  // Pageable source, partial copy at an offset.
  std::vector<float> part(100, 0.0f);
  require_ok(b.copy_async(s.get(), d1.get() + 10, data.data() + 500, 100 * sizeof(float), HP_H2D));
  require_ok(b.copy_async(s.get(), part.data(), d1.get() + 10, 100 * sizeof(float), HP_D2H));
  require_ok(b.stream_sync(s.get()));
  CHECK(std::equal(part.begin(), part.end(), data.begin() + 500));
}

/// Work on s2 that waits on an event recorded on s1 sees s1's results; event_sync blocks until
/// done.
void check_events(const Backend& b) {
  Stream s1(b), s2(b);
  const std::size_t n = 1 << 16;
  auto data = random_floats(n, 7);
  DeviceBuffer d1(b, n), d2(b, n);
  hp_event* e = require_ok(b.event_create(0));
  for (int round = 0; round < 3; ++round) {
    for (auto& v : data) v += 1.0f;
    std::vector<float> back(n, 0.0f);
    require_ok(b.copy_async(s1.get(), d1.get(), data.data(), n * sizeof(float), HP_H2D));
    hp_elementwise_desc relu{};
    relu.struct_size = sizeof relu;
    relu.op = HP_OP_SCALE, relu.dtype = HP_F32, relu.n = int64_t(n), relu.scalar = 2.0,
    relu.x = d1.get(), relu.out = d1.get();
    require_ok(b.elementwise(s1.get(), relu));
    require_ok(b.event_record(e, s1.get()));
    require_ok(b.stream_wait_event(s2.get(), e));
    require_ok(b.copy_async(s2.get(), d2.get(), d1.get(), n * sizeof(float), HP_D2D));
    require_ok(b.copy_async(s2.get(), back.data(), d2.get(), n * sizeof(float), HP_D2H));
    require_ok(b.event_sync(e));
    if (b.has_event_query()) CHECK(require_ok(b.event_query(e)));
    require_ok(b.stream_sync(s2.get()));
    bool all = true;
    for (std::size_t i = 0; i < n; ++i) all &= back[i] == data[i] * 2.0f;
    CHECK(all);
  }
  require_ok(b.event_destroy(e));
}

void check_all(const std::string& name) {
  auto b = backend_or_skip(name);
  if (!b) return;
  bool is_ref = name == "cpu";
  SECTION("gemm") { check_gemm(*b, is_ref); }
  SECTION("elementwise") { check_elementwise(*b, is_ref); }
  SECTION("copies") { check_copies(*b); }
  SECTION("events") { check_events(*b); }
}

/// Sets an environment variable for the scope (the fake runtime reads its knobs per call).
struct ScopedEnv {
  const char* name;
  ScopedEnv(const char* n, const char* v) : name(n) { ::setenv(n, v, 1); }
  ~ScopedEnv() { ::unsetenv(name); }
};

}  // namespace

TEST_CASE("conformance: cpu plugin against plain loops", "[conformance][cpu]") { check_all("cpu"); }

TEST_CASE("conformance: ascend plugin (fake CANN runtime) against cpu", "[conformance][ascend]") {
  REQUIRE(registry().find("ascend") != nullptr);  // the fake must always make it loadable
  check_all("ascend");
}

TEST_CASE("conformance: ascend event ordering holds with slow streams", "[conformance][ascend]") {
  // Every queued operation on the fake takes 200 us, so missing waits would read stale data.
  ScopedEnv slow("HP_FAKE_ACL_DELAY_US", "200");
  auto b = backend_or_skip("ascend");
  REQUIRE(b);
  check_events(*b);
}

TEST_CASE("conformance: cuda plugin against cpu", "[conformance][cuda]") { check_all("cuda"); }

// The "hp.train" gradient ops of the cpu backend (plugins/cpu/cpu_ops_grad*.cpp, specified in
// docs/training.md) run through the executor on one-node models built here. Each op is checked
// against an independent reference: the definition computed element by element (SumTo, SliceGrad
// via the forward Slice of an index tensor, the gather gradients), or central differences in
// float64 of the forward it differentiates (the executor's Softmax, LogSoftmax,
// SoftmaxCrossEntropyLoss, MaxPool, AveragePool; a plain-loop Conv and LayerNorm here, themselves
// checked against the executor's float32 forward). Large float32 cases take the threaded paths and
// are compared with the float64 results. Malformed inputs must fail with an error.
#include <catch2/catch.hpp>

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "hp/exec/backends.h"
#include "hp/exec/executor.h"
#include "hp/exec/tensor.h"
#include "hp/model/model.h"

namespace fs = std::filesystem;
using namespace hp;
using namespace hp::exec;

namespace {

using Dims = std::vector<std::int64_t>;
using Vec = std::vector<double>;

std::int64_t count(const Dims& d) {
  std::int64_t n = 1;
  for (auto x : d) n *= x;
  return n;
}

HostTensor tensor(int dtype, Dims dims, const Vec& v) {
  HostTensor t;
  t.dtype = dtype;
  t.dims = std::move(dims);
  REQUIRE(static_cast<std::int64_t>(v.size()) == count(t.dims));
  const std::size_t es = dtype == HP_F32 ? 4 : 8;
  t.data.resize(v.size() * es);
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (dtype == HP_F32)
      t.as<float>()[i] = static_cast<float>(v[i]);
    else if (dtype == HP_F64)
      t.as<double>()[i] = v[i];
    else
      t.as<std::int64_t>()[i] = static_cast<std::int64_t>(v[i]);
  }
  return t;
}
HostTensor f64(Dims d, const Vec& v) { return tensor(HP_F64, std::move(d), v); }
HostTensor i64(Dims d, const Vec& v) { return tensor(HP_I64, std::move(d), v); }
HostTensor shape(const Dims& s) {
  return i64({static_cast<std::int64_t>(s.size())}, Vec(s.begin(), s.end()));
}

Vec values(const HostTensor& t) {
  Vec v(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = t.dtype == HP_F32 ? t.as<float>()[i] : t.as<double>()[i];
  return v;
}

Vec random(std::int64_t n, unsigned seed, double lo = -1, double hi = 1) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  Vec v(static_cast<std::size_t>(n));
  for (auto& x : v) x = u(g);
  return v;
}

int onnx_type(int dtype) {
  return dtype == HP_F32   ? onnx::TensorProto::FLOAT
         : dtype == HP_F64 ? onnx::TensorProto::DOUBLE
                           : onnx::TensorProto::INT64;
}

/// Attributes of the one node.
struct Attr {
  std::string name;
  std::optional<std::int64_t> i;
  std::optional<double> f;
  std::optional<std::string> s;
  std::optional<Dims> ints;
};
Attr ai(std::string n, std::int64_t v) { return {std::move(n), v, {}, {}, {}}; }
Attr af(std::string n, double v) { return {std::move(n), {}, v, {}, {}}; }
Attr as(std::string n, std::string v) { return {std::move(n), {}, {}, std::move(v), {}}; }
Attr al(std::string n, Dims v) { return {std::move(n), {}, {}, {}, std::move(v)}; }

/// A model of one node (`domain` "hp.train" or ai.onnx) whose inputs are graph inputs of the given
/// example tensors' types and shapes; an empty input or output name is an omitted one.
class OneNode {
 public:
  OneNode(const std::string& op, const std::string& domain, const std::vector<std::string>& ins,
          const std::vector<HostTensor>& example, const std::vector<std::string>& outs,
          const std::vector<Attr>& attrs, int out_dtype, int threads = 4) {
    onnx::ModelProto m;
    m.set_ir_version(8);
    m.add_opset_import()->set_version(17);
    auto* tr = m.add_opset_import();
    tr->set_domain("hp.train");
    tr->set_version(1);
    if (domain == "com.microsoft") {
      auto* ms = m.add_opset_import();
      ms->set_domain(domain);
      ms->set_version(1);
    }
    auto* g = m.mutable_graph();
    g->set_name("one");
    auto* n = g->add_node();
    n->set_op_type(op);
    n->set_domain(domain);
    n->set_name("node");
    for (std::size_t k = 0; k < ins.size(); ++k) {
      n->add_input(ins[k]);
      if (ins[k].empty()) continue;
      auto* v = g->add_input();
      v->set_name(ins[k]);
      auto* tt = v->mutable_type()->mutable_tensor_type();
      tt->set_elem_type(onnx_type(example[k].dtype));
      for (auto d : example[k].dims) tt->mutable_shape()->add_dim()->set_dim_value(d);
    }
    for (const auto& o : outs) {
      n->add_output(o);
      if (o.empty()) continue;
      auto* v = g->add_output();
      v->set_name(o);
      v->mutable_type()->mutable_tensor_type()->set_elem_type(onnx_type(out_dtype));
    }
    for (const auto& a : attrs) {
      auto* p = n->add_attribute();
      p->set_name(a.name);
      if (a.i) {
        p->set_type(onnx::AttributeProto::INT);
        p->set_i(*a.i);
      } else if (a.f) {
        p->set_type(onnx::AttributeProto::FLOAT);
        p->set_f(static_cast<float>(*a.f));
      } else if (a.s) {
        p->set_type(onnx::AttributeProto::STRING);
        p->set_s(*a.s);
      } else {
        p->set_type(onnx::AttributeProto::INTS);
        for (auto v : *a.ints) p->add_ints(v);
      }
    }
    static int serial = 0;
    fs::path dir = fs::temp_directory_path() /
                   ("hp_train_grad_" + std::to_string(::getpid()) + "_" + std::to_string(serial++));
    fs::create_directories(dir);
    std::ofstream(dir / "m.onnx", std::ios::binary) << m.SerializeAsString();
    model::LoadOptions lo;
    lo.mode = model::LoadMode::shapes_only;
    auto loaded = model::load_model(dir / "m.onnx", lo);
    fs::remove_all(dir);
    REQUIRE(loaded.ok());
    // Several threads by default, so the large cases take the kernels' threaded paths. The count
    // is the process's OpenMP setting, set when a backend opens.
    auto b = open_backends("cpu", threads, {});
    REQUIRE(b.ok());
    backends_ = *b;
    auto ex = Executor::create(*loaded, {backends_.primary, backends_.cpu, nullptr});
    INFO((ex.ok() ? std::string() : ex.error().message()));
    REQUIRE(ex.ok());
    ex_ = std::move(*ex);
  }

  Expected<std::vector<HostTensor>> run(const std::vector<HostTensor>& in) { return ex_->run(in); }
  /// Runs and returns output k's values; the run must succeed.
  Vec values_of(const std::vector<HostTensor>& in, std::size_t k = 0) {
    auto r = run(in);
    INFO((r.ok() ? std::string() : r.error().message()));
    REQUIRE(r.ok());
    REQUIRE(r->size() > k);
    return values((*r)[k]);
  }
  /// The run must fail; returns the message.
  std::string error_of(const std::vector<HostTensor>& in) {
    auto r = run(in);
    REQUIRE(!r.ok());
    return r.error().message();
  }

 private:
  Backends backends_;
  std::unique_ptr<Executor> ex_;
};

void check_close(const Vec& got, const Vec& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": " << got[i] << " vs " << want[i]);
    CHECK(std::abs(got[i] - want[i]) <= tol * (1 + std::abs(want[i])));
  }
}

/// Central differences of the scalar f at x, step h.
Vec numeric_grad(const std::function<double(const Vec&)>& f, Vec x, double h = 1e-6) {
  Vec g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = f(x);
    x[i] = keep - h;
    const double down = f(x);
    x[i] = keep;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

double dot(const Vec& a, const Vec& b) {
  REQUIRE(a.size() == b.size());
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

/// Element-by-element SumTo: each dY element added to the target element it broadcasts from.
Vec sum_to_reference(const Dims& dy, const Vec& v, const Dims& target) {
  Vec out(static_cast<std::size_t>(count(target)), 0.0);
  const std::size_t R = dy.size(), r = target.size();
  for (std::int64_t e = 0; e < count(dy); ++e) {
    std::int64_t rest = e, off = 0, mul = 1;
    for (std::size_t k = R; k-- > 0;) {
      const std::int64_t i = rest % dy[k];
      rest /= dy[k];
      if (k >= R - r) {
        const std::int64_t t = target[k - (R - r)];
        off += (t == 1 ? 0 : i) * mul;
        mul *= t;
      }
    }
    out[static_cast<std::size_t>(off)] += v[static_cast<std::size_t>(e)];
  }
  return out;
}

}  // namespace

TEST_CASE("SumTo sums the broadcast dims for each pattern", "[exec][train]") {
  struct Case {
    Dims dy, target;
  };
  for (const Case& k :
       {Case{{2, 3, 4}, {3, 1}}, Case{{2, 3, 4}, {1}}, Case{{2, 3, 4}, {2, 1, 4}},
        Case{{2, 3, 4}, {2, 3, 4}}, Case{{2, 3, 4}, {4}}, Case{{2, 3, 4}, {}},
        Case{{2, 1, 4}, {1, 4}}, Case{{600, 130}, {130}}, Case{{600, 130}, {600, 1}},
        Case{{64, 33, 40}, {33, 1}}, Case{{300, 300}, {}}, Case{{40, 8, 300}, {40, 1, 300}},
        Case{{3, 8, 3000, 5}, {3, 1, 3000, 1}}, Case{{2, 40000}, {40000}}}) {
    INFO(k.dy.size() << "-d dY to rank " << k.target.size());
    const Vec v = random(count(k.dy), 7);
    const Vec want = sum_to_reference(k.dy, v, k.target);
    for (int dt : {HP_F64, HP_F32}) {
      HostTensor dy = tensor(dt, k.dy, v);
      OneNode n("SumTo", "hp.train", {"dy", "s"}, {dy, shape(k.target)}, {"y"}, {}, dt);
      auto r = n.run({dy, shape(k.target)});
      REQUIRE(r.ok());
      CHECK((*r)[0].dims == k.target);
      check_close(values((*r)[0]), want, dt == HP_F64 ? 1e-12 : 1e-4);
    }
  }
  SECTION("malformed shapes fail") {
    HostTensor dy = f64({2, 3, 4}, random(24, 1));
    OneNode n("SumTo", "hp.train", {"dy", "s"}, {dy, shape({3, 1})}, {"y"}, {}, HP_F64);
    CHECK(n.error_of({dy, shape({5, 1})}).find("cannot sum") != std::string::npos);
    CHECK(!n.run({dy, shape({1, 2, 3, 4})}).ok());  // rank above dY's
    OneNode m("SumTo", "hp.train", {"dy", "s"}, {dy, i64({1, 2}, {3, 1})}, {"y"}, {}, HP_F64);
    CHECK(m.error_of({dy, i64({1, 2}, {3, 1})}).find("1-D") != std::string::npos);
  }
}

TEST_CASE("SliceGrad puts dY where Slice read, with clamping and negative steps", "[exec][train]") {
  const Dims xs{5, 6};
  Vec iota(30);
  for (std::size_t i = 0; i < iota.size(); ++i) iota[i] = static_cast<double>(i);
  struct Case {
    Vec starts, ends, axes, steps;
  };
  for (const Case& k : {Case{{1}, {100}, {1}, {2}}, Case{{-1}, {-100}, {1}, {-1}},
                        Case{{100, 0}, {-100, 4}, {0, 1}, {-2, 3}}, Case{{3}, {1}, {-2}, {-1}},
                        Case{{0, 2}, {5, 5}, {}, {}}, Case{{2}, {2}, {0}, {1}}}) {
    std::vector<HostTensor> sl{f64(xs, iota),
                               i64({static_cast<std::int64_t>(k.starts.size())}, k.starts),
                               i64({static_cast<std::int64_t>(k.ends.size())}, k.ends)};
    std::vector<std::string> names{"x", "starts", "ends"};
    if (!k.axes.empty()) {
      sl.push_back(i64({static_cast<std::int64_t>(k.axes.size())}, k.axes));
      names.push_back("axes");
      sl.push_back(i64({static_cast<std::int64_t>(k.steps.size())}, k.steps));
      names.push_back("steps");
    }
    // Which elements Slice reads: the forward on an index tensor.
    OneNode fwd("Slice", "", names, sl, {"y"}, {}, HP_F64);
    auto read = fwd.run(sl);
    REQUIRE(read.ok());
    const Vec at = values((*read)[0]);
    const Vec dyv = random(static_cast<std::int64_t>(at.size()), 3);
    Vec want(30, 0.0);
    for (std::size_t i = 0; i < at.size(); ++i) want[static_cast<std::size_t>(at[i])] = dyv[i];
    std::vector<HostTensor> in = sl;
    in[0] = f64((*read)[0].dims, dyv);
    in.insert(in.begin() + 1, shape(xs));
    names[0] = "dy";
    names.insert(names.begin() + 1, "s");
    OneNode g("SliceGrad", "hp.train", names, in, {"dx"}, {}, HP_F64);
    check_close(g.values_of(in), want, 0);
  }
  SECTION("mismatched dY and step 0 fail") {
    std::vector<HostTensor> in{f64({5, 2}, random(10, 2)),
                               shape(xs),
                               i64({1}, {0}),
                               i64({1}, {3}),
                               i64({1}, {1}),
                               i64({1}, {1})};
    OneNode g("SliceGrad", "hp.train", {"dy", "s", "b", "e", "a", "st"}, in, {"dx"}, {}, HP_F64);
    CHECK(g.error_of(in).find("differ from the slice") != std::string::npos);
    in[5] = i64({1}, {0});
    CHECK(g.error_of(in).find("step 0") != std::string::npos);
    in[5] = i64({1}, {1});
    in[3] = i64({2}, {3, 3});
    CHECK(!g.run(in).ok());
  }
}

TEST_CASE("GatherGrad adds repeated and negative indices", "[exec][train]") {
  struct Case {
    Dims s, idx_dims;
    Vec idx;
    std::int64_t axis;
  };
  std::mt19937 gen(5);
  Vec big(700);
  for (auto& v : big) v = static_cast<double>(static_cast<int>(gen() % 2000) - 1000);
  for (const Case& k : {Case{{5, 3}, {2, 2}, {0, -1, 0, 2}, 0}, Case{{2, 4, 3}, {3}, {1, -3, 1}, 1},
                        Case{{2, 4, 3}, {}, {-1}, 2}, Case{{1000, 96}, {700}, big, 0}}) {
    Dims dyd(k.s.begin(), k.s.begin() + k.axis);
    dyd.insert(dyd.end(), k.idx_dims.begin(), k.idx_dims.end());
    dyd.insert(dyd.end(), k.s.begin() + k.axis + 1, k.s.end());
    const Vec dyv = random(count(dyd), 11);
    std::int64_t outer = 1, inner = 1;
    for (std::int64_t a = 0; a < k.axis; ++a) outer *= k.s[static_cast<std::size_t>(a)];
    for (std::size_t a = static_cast<std::size_t>(k.axis) + 1; a < k.s.size(); ++a) inner *= k.s[a];
    const std::int64_t len = k.s[static_cast<std::size_t>(k.axis)],
                       ni = static_cast<std::int64_t>(k.idx.size());
    Vec want(static_cast<std::size_t>(count(k.s)), 0.0);
    for (std::int64_t o = 0; o < outer; ++o)
      for (std::int64_t j = 0; j < ni; ++j) {
        std::int64_t t = static_cast<std::int64_t>(k.idx[static_cast<std::size_t>(j)]);
        if (t < 0) t += len;
        for (std::int64_t i = 0; i < inner; ++i)
          want[static_cast<std::size_t>((o * len + t) * inner + i)] +=
              dyv[static_cast<std::size_t>((o * ni + j) * inner + i)];
      }
    for (int dt : {HP_F64, HP_F32}) {
      std::vector<HostTensor> in{tensor(dt, dyd, dyv), shape(k.s), i64(k.idx_dims, k.idx)};
      OneNode g("GatherGrad", "hp.train", {"dy", "s", "i"}, in, {"dx"}, {ai("axis", k.axis)}, dt);
      check_close(g.values_of(in), want, dt == HP_F64 ? 1e-12 : 1e-5);
    }
  }
  SECTION("out-of-range indices and mismatched dY fail") {
    std::vector<HostTensor> in{f64({2, 3}, random(6, 1)), shape({5, 3}), i64({2}, {0, 5})};
    OneNode g("GatherGrad", "hp.train", {"dy", "s", "i"}, in, {"dx"}, {}, HP_F64);
    CHECK(g.error_of(in).find("outside") != std::string::npos);
    in[2] = i64({2}, {0, -6});
    CHECK(g.error_of(in).find("outside") != std::string::npos);
    in[2] = i64({2}, {0, 1});
    in[0] = f64({2, 4}, random(8, 1));
    CHECK(g.error_of(in).find("must be") != std::string::npos);
  }
}

TEST_CASE("GatherElementsGrad adds dY at the gathered positions", "[exec][train]") {
  const Vec dyv = random(12, 4);
  {
    std::vector<HostTensor> in{f64({3, 4}, dyv), shape({4, 4}),
                               i64({3, 4}, {0, 1, 2, 3, -1, 1, 0, 3, 3, 3, 2, -4})};
    Vec want(16, 0.0);
    const Vec idx{0, 1, 2, 3, 3, 1, 0, 3, 3, 3, 2, 0};
    for (std::size_t e = 0; e < 12; ++e)
      want[static_cast<std::size_t>(idx[e]) * 4 + e % 4] += dyv[e];
    OneNode g("GatherElementsGrad", "hp.train", {"dy", "s", "i"}, in, {"dx"}, {}, HP_F64);
    check_close(g.values_of(in), want, 0);
  }
  {
    // axis 1, indices narrower than the shape: [3, 4] into [3, 6].
    std::vector<HostTensor> in{f64({3, 4}, dyv), shape({3, 6}),
                               i64({3, 4}, {5, 5, 0, -1, 1, 2, 3, 4, 0, 0, 0, 0})};
    const Vec idx{5, 5, 0, 5, 1, 2, 3, 4, 0, 0, 0, 0};
    Vec want(18, 0.0);
    for (std::size_t e = 0; e < 12; ++e)
      want[e / 4 * 6 + static_cast<std::size_t>(idx[e])] += dyv[e];
    OneNode g("GatherElementsGrad", "hp.train", {"dy", "s", "i"}, in, {"dx"}, {ai("axis", 1)},
              HP_F64);
    check_close(g.values_of(in), want, 0);
    in[1] = shape({2, 6});  // 3 rows of indices into 2
    CHECK(g.error_of(in).find("exceed") != std::string::npos);
    in[1] = shape({3, 6});
    in[2] = i64({3, 4}, {6, 5, 0, -1, 1, 2, 3, 4, 0, 0, 0, 0});
    CHECK(g.error_of(in).find("outside") != std::string::npos);
    in[2] = i64({12}, Vec(12, 0.0));
    CHECK(!g.run(in).ok());
  }
}

TEST_CASE("SoftmaxGrad and LogSoftmaxGrad match central differences of the forward",
          "[exec][train]") {
  struct Case {
    Dims d;
    std::int64_t axis;
  };
  for (bool log : {false, true}) {
    for (const Case& k : {Case{{3, 5}, -1}, Case{{2, 4, 3}, 1}, Case{{2, 3}, 0}}) {
      INFO((log ? "LogSoftmax" : "Softmax") << " axis " << k.axis);
      const std::int64_t n = count(k.d);
      const Vec x = random(n, 21, -2, 2), dyv = random(n, 22);
      OneNode fwd(log ? "LogSoftmax" : "Softmax", "", {"x"}, {f64(k.d, x)}, {"y"},
                  {ai("axis", k.axis)}, HP_F64);
      const Vec y = fwd.values_of({f64(k.d, x)});
      std::vector<HostTensor> in{f64(k.d, dyv), f64(k.d, y)};
      OneNode g(log ? "LogSoftmaxGrad" : "SoftmaxGrad", "hp.train", {"dy", "y"}, in, {"dx"},
                {ai("axis", k.axis)}, HP_F64);
      const Vec got = g.values_of(in);
      const Vec want =
          numeric_grad([&](const Vec& v) { return dot(fwd.values_of({f64(k.d, v)}), dyv); }, x);
      check_close(got, want, 1e-7);
    }
  }
  SECTION("the threaded float32 path agrees with float64") {
    const Dims d{520, 300};
    const Vec x = random(count(d), 5, -3, 3), dyv = random(count(d), 6);
    OneNode fwd("Softmax", "", {"x"}, {f64(d, x)}, {"y"}, {}, HP_F64);
    const Vec y = fwd.values_of({f64(d, x)});
    for (const char* op : {"SoftmaxGrad", "LogSoftmaxGrad"}) {
      Vec yin = y;
      if (std::string(op) == "LogSoftmaxGrad")
        for (auto& v : yin) v = std::log(v);
      std::vector<HostTensor> in64{f64(d, dyv), f64(d, yin)},
          in32{tensor(HP_F32, d, dyv), tensor(HP_F32, d, yin)};
      OneNode g64(op, "hp.train", {"dy", "y"}, in64, {"dx"}, {}, HP_F64);
      OneNode g32(op, "hp.train", {"dy", "y"}, in32, {"dx"}, {}, HP_F32);
      check_close(g32.values_of(in32), g64.values_of(in64), 1e-5);
    }
  }
  SECTION("mismatched dY and Y fail") {
    std::vector<HostTensor> in{f64({3, 5}, random(15, 1)), f64({3, 4}, random(12, 1))};
    OneNode g("SoftmaxGrad", "hp.train", {"dy", "y"}, in, {"dx"}, {}, HP_F64);
    CHECK(g.error_of(in).find("must match") != std::string::npos);
  }
}

namespace {

/// LayerNormalization over dims [axis, rank) in float64: the reference forward.
Vec layer_norm(const Dims& d, std::int64_t axis, const Vec& x, const Vec& w, const Vec& b,
               double eps) {
  std::int64_t len = 1;
  for (std::size_t k = static_cast<std::size_t>(axis); k < d.size(); ++k) len *= d[k];
  Vec y(x.size());
  for (std::size_t o = 0; o < x.size() / static_cast<std::size_t>(len); ++o) {
    const std::size_t base = o * static_cast<std::size_t>(len);
    double mean = 0, var = 0;
    for (std::int64_t i = 0; i < len; ++i) mean += x[base + static_cast<std::size_t>(i)];
    mean /= static_cast<double>(len);
    for (std::int64_t i = 0; i < len; ++i)
      var += std::pow(x[base + static_cast<std::size_t>(i)] - mean, 2);
    const double rstd = 1 / std::sqrt(var / static_cast<double>(len) + eps);
    for (std::size_t i = 0; i < static_cast<std::size_t>(len); ++i)
      y[base + i] = (x[base + i] - mean) * rstd * w[i] + b[i];
  }
  return y;
}

}  // namespace

TEST_CASE("LayerNormGrad's dX, dScale, dBias match central differences", "[exec][train]") {
  struct Case {
    Dims d;
    std::int64_t axis;
  };
  const double eps = 1e-5;
  for (const Case& k : {Case{{3, 4, 5}, -1}, Case{{3, 4, 5}, 1}}) {
    INFO("axis " << k.axis);
    const Dims sd(k.d.begin() + (k.axis < 0 ? k.axis + 3 : k.axis), k.d.end());
    const Vec x = random(count(k.d), 31, -2, 2), w = random(count(sd), 32, 0.5, 1.5),
              b = random(count(sd), 33), dyv = random(count(k.d), 34);
    const std::int64_t ax = k.axis < 0 ? k.axis + 3 : k.axis;
    std::vector<HostTensor> in{f64(k.d, dyv), f64(k.d, x), f64(sd, w)};
    const std::vector<Attr> attrs{ai("axis", k.axis), af("epsilon", eps)};
    OneNode g("LayerNormGrad", "hp.train", {"dy", "x", "w"}, in, {"dx", "dw", "db"}, attrs, HP_F64);
    auto r = g.run(in);
    REQUIRE(r.ok());
    REQUIRE(r->size() == 3);
    CHECK((*r)[1].dims == sd);
    auto loss = [&](const Vec& xv, const Vec& wv, const Vec& bv) {
      return dot(layer_norm(k.d, ax, xv, wv, bv, static_cast<float>(eps)), dyv);
    };
    check_close(values((*r)[0]), numeric_grad([&](const Vec& v) { return loss(v, w, b); }, x),
                1e-6);
    check_close(values((*r)[1]), numeric_grad([&](const Vec& v) { return loss(x, v, b); }, w),
                1e-6);
    check_close(values((*r)[2]), numeric_grad([&](const Vec& v) { return loss(x, w, v); }, b),
                1e-6);
    // Only dX asked for.
    OneNode only("LayerNormGrad", "hp.train", {"dy", "x", "w"}, in, {"dx"}, attrs, HP_F64);
    check_close(only.values_of(in), values((*r)[0]), 0);
  }
  SECTION("the reference forward is the executor's LayerNormalization") {
    const Dims d{4, 6};
    const Vec x = random(24, 1, -2, 2), w = random(6, 2), b = random(6, 3);
    std::vector<HostTensor> in{tensor(HP_F32, d, x), tensor(HP_F32, {6}, w),
                               tensor(HP_F32, {6}, b)};
    OneNode f("LayerNormalization", "", {"x", "w", "b"}, in, {"y"}, {}, HP_F32);
    check_close(f.values_of(in), layer_norm(d, 1, x, w, b, static_cast<float>(1e-5)), 1e-5);
  }
  SECTION("the threaded float32 path agrees with float64") {
    const Dims d{4, 128, 512}, sd{512};
    const Vec x = random(count(d), 41, -2, 2), w = random(512, 42), dyv = random(count(d), 43);
    std::vector<HostTensor> in64{f64(d, dyv), f64(d, x), f64(sd, w)},
        in32{tensor(HP_F32, d, dyv), tensor(HP_F32, d, x), tensor(HP_F32, sd, w)};
    OneNode g64("LayerNormGrad", "hp.train", {"dy", "x", "w"}, in64, {"dx", "dw", "db"}, {},
                HP_F64);
    OneNode g32("LayerNormGrad", "hp.train", {"dy", "x", "w"}, in32, {"dx", "dw", "db"}, {},
                HP_F32);
    for (std::size_t k = 0; k < 3; ++k)
      check_close(g32.values_of(in32, k), g64.values_of(in64, k), 1e-4);
  }
  SECTION("a scale of the wrong size fails") {
    std::vector<HostTensor> in{f64({2, 5}, random(10, 1)), f64({2, 5}, random(10, 2)),
                               f64({4}, random(4, 3))};
    OneNode g("LayerNormGrad", "hp.train", {"dy", "x", "w"}, in, {"dx", "dw", "db"}, {}, HP_F64);
    CHECK(g.error_of(in).find("scale") != std::string::npos);
  }
}

TEST_CASE("SoftmaxCrossEntropyGrad matches central differences of SoftmaxCrossEntropyLoss",
          "[exec][train]") {
  const Dims d{4, 5};
  const Vec scores = random(20, 51, -2, 2);
  const Vec labels{1, -100, 4, 0};
  OneNode lsm("LogSoftmax", "", {"x"}, {f64(d, scores)}, {"y"}, {}, HP_F64);
  const Vec lp = lsm.values_of({f64(d, scores)});
  for (const char* red : {"mean", "sum", "none"}) {
    INFO(red);
    const bool none = std::string(red) == "none";
    const Vec dl = none ? Vec{0.5, -1.0, 2.0, 1.5} : Vec{1.7};
    const Dims dld = none ? Dims{4} : Dims{};
    const std::vector<Attr> attrs{as("reduction", red), ai("ignore_index", -100)};
    OneNode fwd("SoftmaxCrossEntropyLoss", "", {"x", "t"}, {f64(d, scores), i64({4}, labels)},
                {"loss"}, attrs, HP_F64);
    std::vector<HostTensor> in{f64(dld, dl), f64(d, lp), i64({4}, labels)};
    OneNode g("SoftmaxCrossEntropyGrad", "hp.train", {"dl", "lp", "t"}, in, {"dx"}, attrs, HP_F64);
    const Vec got = g.values_of(in);
    const Vec want = numeric_grad(
        [&](const Vec& v) {
          return dot(fwd.values_of({f64(d, v), i64({4}, labels)}), dl);
        },
        scores);
    check_close(got, want, 1e-7);
    for (std::size_t j = 5; j < 10; ++j) CHECK(got[j] == 0.0);  // the ignored row
  }
  SECTION("every row ignored gives zeros; labels out of range and bad shapes fail") {
    std::vector<HostTensor> in{f64({}, {1.0}), f64(d, lp), i64({4}, Vec(4, -100.0))};
    OneNode g("SoftmaxCrossEntropyGrad", "hp.train", {"dl", "lp", "t"}, in, {"dx"}, {}, HP_F64);
    check_close(g.values_of(in), Vec(20, 0.0), 0);
    in[2] = i64({4}, {0, 1, 5, 2});
    CHECK(g.error_of(in).find("outside") != std::string::npos);
    in[2] = i64({3}, {0, 1, 2});
    CHECK(g.error_of(in).find("labels") != std::string::npos);
    in[2] = i64({4}, {0, 1, 2, 3});
    in[0] = f64({2}, {1.0, 2.0});  // "mean" takes a scalar dLoss
    CHECK(g.error_of(in).find("does not fit") != std::string::npos);
  }
  SECTION("the threaded float32 path agrees with float64") {
    const Dims big{512, 1000};
    Vec lab(512);
    for (std::size_t i = 0; i < lab.size(); ++i)
      lab[i] = i % 7 == 0 ? -100 : static_cast<double>(i * 37 % 1000);
    const Vec s = random(count(big), 61, -3, 3);
    OneNode l("LogSoftmax", "", {"x"}, {f64(big, s)}, {"y"}, {}, HP_F64);
    const Vec lpb = l.values_of({f64(big, s)});
    std::vector<HostTensor> in64{f64({}, {1.0}), f64(big, lpb), i64({512}, lab)},
        in32{tensor(HP_F32, {}, {1.0}), tensor(HP_F32, big, lpb), i64({512}, lab)};
    OneNode g64("SoftmaxCrossEntropyGrad", "hp.train", {"dl", "lp", "t"}, in64, {"dx"}, {}, HP_F64);
    OneNode g32("SoftmaxCrossEntropyGrad", "hp.train", {"dl", "lp", "t"}, in32, {"dx"}, {}, HP_F32);
    check_close(g32.values_of(in32), g64.values_of(in64), 1e-6);
  }
}

namespace {

/// Conv geometry and a plain float64 forward (the reference): N x C x spatial, explicit pads.
struct ConvSpec {
  Dims x, w;
  std::int64_t group;
  Dims strides, pads, dil;
  Dims out() const {
    Dims o{x[0], w[0]};
    const std::size_t sp = x.size() - 2;
    for (std::size_t d = 0; d < sp; ++d)
      o.push_back((x[2 + d] + pads[d] + pads[d + sp] - (w[2 + d] - 1) * dil[d] - 1) / strides[d] +
                  1);
    return o;
  }
  std::vector<Attr> attrs() const {
    return {ai("group", group), al("strides", strides), al("pads", pads), al("dilations", dil)};
  }
};

Vec conv_ref(const ConvSpec& s, const Vec& x, const Vec& w, const Vec& b) {
  const Dims od = s.out();
  const std::size_t sp = s.x.size() - 2;
  const std::int64_t N = s.x[0], C = s.x[1], M = s.w[0], cg = C / s.group, mg = M / s.group;
  Dims ksp(s.w.begin() + 2, s.w.end()), osp(od.begin() + 2, od.end()),
      isp(s.x.begin() + 2, s.x.end());
  const std::int64_t on = count(osp), kn = count(ksp), in = count(isp);
  Vec y(static_cast<std::size_t>(count(od)));
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t q = 0; q < on; ++q) {
        double acc = b[static_cast<std::size_t>(m)];
        for (std::int64_t cl = 0; cl < cg; ++cl)
          for (std::int64_t kq = 0; kq < kn; ++kq) {
            std::int64_t qr = q, kr = kq, off = 0, mul = 1;
            bool inside = true;
            for (std::size_t d = sp; d-- > 0;) {
              const std::int64_t o = qr % osp[d], k = kr % ksp[d];
              qr /= osp[d];
              kr /= ksp[d];
              const std::int64_t p = o * s.strides[d] - s.pads[d] + k * s.dil[d];
              inside = inside && p >= 0 && p < isp[d];
              off += p * mul;
              mul *= isp[d];
            }
            if (!inside) continue;
            acc += x[static_cast<std::size_t>((n * C + m / mg * cg + cl) * in + off)] *
                   w[static_cast<std::size_t>((m * cg + cl) * kn + kq)];
          }
        y[static_cast<std::size_t>((n * M + m) * on + q)] = acc;
      }
  return y;
}

}  // namespace

TEST_CASE("ConvGrad's dX, dW, dB match central differences", "[exec][train]") {
  const ConvSpec cases[] = {
      {{2, 4, 7, 6}, {6, 2, 3, 3}, 2, {2, 2}, {1, 1, 1, 1}, {1, 1}},
      {{1, 2, 9, 8}, {2, 2, 3, 2}, 1, {2, 1}, {1, 0, 2, 1}, {2, 3}},
      {{2, 2, 11}, {4, 1, 3}, 2, {2}, {1, 0}, {2}},
      {{1, 2, 4, 5, 4}, {2, 1, 2, 3, 2}, 2, {1, 2, 1}, {1, 0, 1, 0, 1, 1}, {2, 1, 1}},
  };
  for (const ConvSpec& s : cases) {
    INFO(s.x.size() - 2 << "-d conv, group " << s.group);
    const Dims od = s.out();
    const Vec x = random(count(s.x), 71), w = random(count(s.w), 72), b = random(s.w[0], 73),
              dyv = random(count(od), 74);
    std::vector<HostTensor> in{f64(od, dyv), f64(s.x, x), f64(s.w, w)};
    OneNode g("ConvGrad", "hp.train", {"dy", "x", "w"}, in, {"dx", "dw", "db"}, s.attrs(), HP_F64);
    auto r = g.run(in);
    INFO((r.ok() ? std::string() : r.error().message()));
    REQUIRE(r.ok());
    CHECK((*r)[0].dims == s.x);
    CHECK((*r)[1].dims == s.w);
    auto loss = [&](const Vec& xv, const Vec& wv, const Vec& bv) {
      return dot(conv_ref(s, xv, wv, bv), dyv);
    };
    check_close(values((*r)[0]), numeric_grad([&](const Vec& v) { return loss(v, w, b); }, x),
                1e-7);
    check_close(values((*r)[1]), numeric_grad([&](const Vec& v) { return loss(x, v, b); }, w),
                1e-7);
    check_close(values((*r)[2]), numeric_grad([&](const Vec& v) { return loss(x, w, v); }, b),
                1e-7);
    // The reference forward is the executor's Conv (float32).
    std::vector<HostTensor> fin{tensor(HP_F32, s.x, x), tensor(HP_F32, s.w, w),
                                tensor(HP_F32, {s.w[0]}, b)};
    OneNode f("Conv", "", {"x", "w", "b"}, fin, {"y"}, s.attrs(), HP_F32);
    check_close(f.values_of(fin), conv_ref(s, x, w, b), 1e-5);
    // Omitted outputs: dW alone (dX named ""), and dX alone.
    OneNode only_w("ConvGrad", "hp.train", {"dy", "x", "w"}, in, {"", "dw"}, s.attrs(), HP_F64);
    check_close(only_w.values_of(in), values((*r)[1]), 0);
    OneNode only_x("ConvGrad", "hp.train", {"dy", "x", "w"}, in, {"dx"}, s.attrs(), HP_F64);
    check_close(only_x.values_of(in), values((*r)[0]), 0);
    // float32 (oneDNN's primitives in the plugin) agrees, with all outputs and with dW alone.
    std::vector<HostTensor> in32{tensor(HP_F32, od, dyv), tensor(HP_F32, s.x, x),
                                 tensor(HP_F32, s.w, w)};
    OneNode g32("ConvGrad", "hp.train", {"dy", "x", "w"}, in32, {"dx", "dw", "db"}, s.attrs(),
                HP_F32);
    for (std::size_t k = 0; k < 3; ++k) check_close(g32.values_of(in32, k), values((*r)[k]), 1e-5);
    OneNode w32("ConvGrad", "hp.train", {"dy", "x", "w"}, in32, {"", "dw"}, s.attrs(), HP_F32);
    check_close(w32.values_of(in32), values((*r)[1]), 1e-5);
  }
  SECTION("float32 dX by Winograd (3x3, stride 1, channels in multiples of 16) agrees") {
    // dX of these shapes runs as a Winograd correlation with the turned filters
    // (plugins/cpu/cpu_winograd.cpp): pads 1, asymmetric pads (0 before, 2 after) and 0.
    for (const ConvSpec& s :
         {ConvSpec{{2, 16, 6, 7}, {32, 16, 3, 3}, 1, {1, 1}, {1, 1, 1, 1}, {1, 1}},
          ConvSpec{{2, 32, 6, 6}, {16, 32, 3, 3}, 1, {1, 1}, {0, 2, 2, 0}, {1, 1}},
          ConvSpec{{3, 16, 8, 7}, {16, 16, 3, 3}, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}}}) {
      INFO("x " << s.x[1] << " channels, w " << s.w[0] << " x " << s.w[1] << ", pads " << s.pads[0]
                << s.pads[1] << s.pads[2] << s.pads[3]);
      const Vec x = random(count(s.x), 5), w = random(count(s.w), 6),
                dyv = random(count(s.out()), 7);
      std::vector<HostTensor> in{f64(s.out(), dyv), f64(s.x, x), f64(s.w, w)},
          in32{tensor(HP_F32, s.out(), dyv), tensor(HP_F32, s.x, x), tensor(HP_F32, s.w, w)};
      OneNode e("ConvGrad", "hp.train", {"dy", "x", "w"}, in, {"dx", "dw", "db"}, s.attrs(),
                HP_F64);
      OneNode a("ConvGrad", "hp.train", {"dy", "x", "w"}, in32, {"dx", "dw", "db"}, s.attrs(),
                HP_F32);
      for (std::size_t k = 0; k < 3; ++k)
        check_close(a.values_of(in32, k), e.values_of(in, k), 1e-5);
      OneNode x_only("ConvGrad", "hp.train", {"dy", "x", "w"}, in32, {"dx"}, s.attrs(), HP_F32);
      check_close(x_only.values_of(in32), e.values_of(in, 0), 1e-5);
    }
  }
  SECTION("auto_pad SAME_UPPER and float32 agree with the explicit-pad float64 result") {
    // in 7, k 3, s 2: out 4, total pad 2 -> 1 before, 1 after.
    const ConvSpec s{{1, 2, 7, 7}, {3, 2, 3, 3}, 1, {2, 2}, {1, 1, 1, 1}, {1, 1}};
    const Vec x = random(count(s.x), 1), w = random(count(s.w), 2), dyv = random(count(s.out()), 3);
    std::vector<HostTensor> in{f64(s.out(), dyv), f64(s.x, x), f64(s.w, w)},
        in32{tensor(HP_F32, s.out(), dyv), tensor(HP_F32, s.x, x), tensor(HP_F32, s.w, w)};
    OneNode e("ConvGrad", "hp.train", {"dy", "x", "w"}, in, {"dx", "dw", "db"}, s.attrs(), HP_F64);
    OneNode a("ConvGrad", "hp.train", {"dy", "x", "w"}, in32, {"dx", "dw", "db"},
              {as("auto_pad", "SAME_UPPER"), al("strides", {2, 2})}, HP_F32);
    for (std::size_t k = 0; k < 3; ++k) check_close(a.values_of(in32, k), e.values_of(in, k), 1e-5);
  }
  SECTION("mismatched dY, channels and ranks fail") {
    const ConvSpec s = cases[0];
    std::vector<HostTensor> in{f64({2, 6, 3, 3}, random(108, 1)), f64(s.x, random(count(s.x), 2)),
                               f64(s.w, random(count(s.w), 3))};
    OneNode g("ConvGrad", "hp.train", {"dy", "x", "w"}, in, {"dx", "dw", "db"}, s.attrs(), HP_F64);
    CHECK(g.error_of(in).find("differ from the convolution") != std::string::npos);
    in[0] = f64(s.out(), random(count(s.out()), 1));
    in[2] = f64({6, 3, 3, 3}, random(162, 3));
    CHECK(g.error_of(in).find("channels") != std::string::npos);
    in[2] = f64({6, 2, 3}, random(36, 3));
    CHECK(!g.run(in).ok());
  }
}

TEST_CASE("MaxPoolGrad and AveragePoolGrad match central differences of the forward",
          "[exec][train]") {
  struct Case {
    const char* op;
    Dims x;
    std::vector<Attr> attrs;
  };
  const Case cases[] = {
      {"MaxPool",
       {1, 2, 5, 6},
       {al("kernel_shape", {3, 2}), al("strides", {2, 2}), al("pads", {1, 0, 1, 1})}},
      {"MaxPool",
       {2, 1, 7},
       {al("kernel_shape", {3}), al("strides", {2}), al("pads", {1, 1}), al("dilations", {2})}},
      {"MaxPool",
       {1, 1, 6, 6},
       {al("kernel_shape", {3, 3}), al("strides", {2, 2}), ai("ceil_mode", 1)}},
      {"AveragePool",
       {1, 2, 5, 6},
       {al("kernel_shape", {3, 2}), al("strides", {2, 2}), al("pads", {1, 0, 1, 1})}},
      {"AveragePool",
       {1, 2, 5, 6},
       {al("kernel_shape", {3, 3}), al("strides", {2, 2}), al("pads", {1, 1, 1, 1}),
        ai("count_include_pad", 1)}},
      {"AveragePool",
       {2, 1, 6, 6},
       {al("kernel_shape", {3, 3}), al("strides", {2, 2}), ai("ceil_mode", 1),
        ai("count_include_pad", 1), al("pads", {1, 1, 0, 0})}},
      {"AveragePool",
       {1, 1, 8},
       {al("kernel_shape", {2}), as("auto_pad", "SAME_UPPER"), al("strides", {3})}},
  };
  for (const Case& k : cases) {
    INFO(k.op << " " << k.x.size() - 2 << "-d");
    const Vec x = random(count(k.x), 81, -2, 2);  // distinct values: no ties in the max
    OneNode fwd(k.op, "", {"x"}, {f64(k.x, x)}, {"y"}, k.attrs, HP_F64);
    auto y = fwd.run({f64(k.x, x)});
    REQUIRE(y.ok());
    const Dims yd = (*y)[0].dims;
    const Vec dyv = random(count(yd), 82);
    std::vector<HostTensor> in{f64(yd, dyv), f64(k.x, x)};
    OneNode g(std::string(k.op) + "Grad", "hp.train", {"dy", "x"}, in, {"dx"}, k.attrs, HP_F64);
    const Vec want =
        numeric_grad([&](const Vec& v) { return dot(fwd.values_of({f64(k.x, v)}), dyv); }, x);
    check_close(g.values_of(in), want, 1e-7);
  }
  SECTION("dY of the wrong shape fails") {
    std::vector<HostTensor> in{f64({1, 2, 2, 2}, random(8, 1)), f64({1, 2, 5, 6}, random(60, 2))};
    OneNode g("MaxPoolGrad", "hp.train", {"dy", "x"}, in, {"dx"}, cases[0].attrs, HP_F64);
    CHECK(g.error_of(in).find("differ from the pool") != std::string::npos);
    in[1] = f64({2, 5}, random(10, 2));
    CHECK(!g.run(in).ok());
  }
}

TEST_CASE("threaded runs of the large kernels equal single-threaded ones", "[exec][train]") {
  struct Case {
    std::string op;
    std::vector<HostTensor> in;
    std::vector<std::string> outs;
    std::vector<Attr> attrs;
  };
  const Dims cx{2, 8, 20, 20}, cw{8, 4, 3, 3}, cy{2, 8, 20, 20}, px{2, 16, 33, 32},
      py{2, 16, 17, 16}, sd{40, 50, 40};
  const std::vector<Attr> pool{al("kernel_shape", {3, 2}), al("strides", {2, 2}),
                               al("pads", {1, 0, 1, 0}), ai("count_include_pad", 1)};
  const Case cases[] = {
      {"ConvGrad",
       {f64(cy, random(count(cy), 1)), f64(cx, random(count(cx), 2)),
        f64(cw, random(count(cw), 3))},
       {"dx", "dw", "db"},
       {ai("group", 2), al("pads", {1, 1, 1, 1})}},
      {"MaxPoolGrad", {f64(py, random(count(py), 4)), f64(px, random(count(px), 5))}, {"dx"}, pool},
      {"AveragePoolGrad",
       {f64(py, random(count(py), 6)), f64(px, random(count(px), 7))},
       {"dx"},
       pool},
      {"SoftmaxGrad",
       {f64(sd, random(count(sd), 8)), f64(sd, random(count(sd), 9, 0, 1))},
       {"dx"},
       {ai("axis", 1)}},
      {"LogSoftmaxGrad",
       {f64(sd, random(count(sd), 8)), f64(sd, random(count(sd), 9, -3, 0))},
       {"dx"},
       {ai("axis", 1)}},
  };
  for (const Case& k : cases) {
    INFO(k.op);
    std::vector<std::string> names{"a", "b", "c"};
    names.resize(k.in.size());
    std::vector<Vec> serial;
    {
      OneNode one(k.op, "hp.train", names, k.in, k.outs, k.attrs, HP_F64, 1);
      for (std::size_t o = 0; o < k.outs.size(); ++o) serial.push_back(one.values_of(k.in, o));
    }
    OneNode many(k.op, "hp.train", names, k.in, k.outs, k.attrs, HP_F64, 4);
    for (std::size_t o = 0; o < k.outs.size(); ++o)
      check_close(many.values_of(k.in, o), serial[o], 1e-12);
  }
}

TEST_CASE("Conv and FusedConv forward: float32 (oneDNN) and float64 (loop) match the reference",
          "[exec][conv]") {
  const ConvSpec cases[] = {
      {{2, 4, 7, 6}, {6, 2, 3, 3}, 2, {2, 2}, {1, 1, 1, 1}, {1, 1}},  // groups, strides
      {{1, 2, 9, 8}, {2, 2, 3, 2}, 1, {2, 1}, {1, 0, 2, 1}, {2, 3}},  // dilations, pads
      {{2, 2, 11}, {4, 1, 3}, 2, {2}, {1, 0}, {2}},                   // 1-D
      {{1, 2, 4, 5, 4}, {2, 1, 2, 3, 2}, 2, {1, 2, 1}, {1, 0, 1, 0, 1, 1}, {2, 1, 1}},  // 3-D
      {{2, 8, 10, 10}, {8, 1, 3, 3}, 8, {1, 1}, {1, 1, 1, 1}, {1, 1}},                  // depthwise
      {{8, 32, 16, 16}, {32, 32, 3, 3}, 1, {1, 1}, {1, 1, 1, 1}, {1, 1}},  // a ResNet block's
      {{2, 3, 17, 17}, {16, 3, 7, 7}, 1, {2, 2}, {3, 3, 3, 3}, {1, 1}},    // a stem
      {{1, 16, 9, 9}, {24, 16, 1, 1}, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}},    // pointwise
  };
  for (const ConvSpec& s : cases) {
    INFO(s.x.size() - 2 << "-d conv, x " << s.x[1] << " channels, group " << s.group);
    const Dims od = s.out();
    const Vec x = random(count(s.x), 81), w = random(count(s.w), 82), b = random(s.w[0], 83),
              z = random(count(od), 84), zero(static_cast<std::size_t>(s.w[0]), 0.0);
    const Vec want = conv_ref(s, x, w, b), plain = conv_ref(s, x, w, zero);
    Vec fused(want.size());
    for (std::size_t i = 0; i < want.size(); ++i) fused[i] = std::max(want[i] + z[i], 0.0);
    for (int dt : {HP_F32, HP_F64}) {
      INFO((dt == HP_F32 ? "float32" : "float64"));
      const double tol = dt == HP_F32 ? 1e-5 : 1e-12;
      std::vector<HostTensor> in{tensor(dt, s.x, x), tensor(dt, s.w, w), tensor(dt, {s.w[0]}, b)};
      OneNode f("Conv", "", {"x", "w", "b"}, in, {"y"}, s.attrs(), dt);
      check_close(f.values_of(in), want, tol);
      in.pop_back();
      OneNode nb("Conv", "", {"x", "w"}, in, {"y"}, s.attrs(), dt);
      check_close(nb.values_of(in), plain, tol);
      // FusedConv: Relu(conv + b + z), the executor's fusion of Conv + Add + Relu.
      std::vector<HostTensor> fin{tensor(dt, s.x, x), tensor(dt, s.w, w), tensor(dt, {s.w[0]}, b),
                                  tensor(dt, od, z)};
      auto attrs = s.attrs();
      attrs.push_back(as("activation", "Relu"));
      OneNode fc("FusedConv", "com.microsoft", {"x", "w", "b", "z"}, fin, {"y"}, attrs, dt);
      check_close(fc.values_of(fin), fused, tol);
    }
  }
  SECTION("auto_pad SAME_LOWER and SAME_UPPER match the explicit pads they mean") {
    // in 8, k 3, s 2: out 4, total pad 1: SAME_UPPER pads 0 before, 1 after; SAME_LOWER 1, 0.
    for (const char* ap : {"SAME_UPPER", "SAME_LOWER"}) {
      const bool upper = std::string(ap) == "SAME_UPPER";
      const ConvSpec s{
          {1, 3, 8, 8}, {4, 3, 3, 3}, 1, {2, 2}, upper ? Dims{0, 0, 1, 1} : Dims{1, 1, 0, 0},
          {1, 1}};
      const Vec x = random(count(s.x), 5), w = random(count(s.w), 6), b = random(4, 7);
      std::vector<HostTensor> in{tensor(HP_F32, s.x, x), tensor(HP_F32, s.w, w),
                                 tensor(HP_F32, {4}, b)};
      OneNode f("Conv", "", {"x", "w", "b"}, in, {"y"}, {as("auto_pad", ap), al("strides", {2, 2})},
                HP_F32);
      check_close(f.values_of(in), conv_ref(s, x, w, b), 1e-5);
    }
  }
  SECTION("FusedConv broadcasts Z as the Add it replaces, and runs without Z and bias") {
    const ConvSpec s{{2, 3, 6, 6}, {4, 3, 3, 3}, 1, {1, 1}, {1, 1, 1, 1}, {1, 1}};
    const Vec x = random(count(s.x), 11), w = random(count(s.w), 12), zc = random(4, 13);
    const Vec zero(4, 0.0), y = conv_ref(s, x, w, zero);
    const Dims od = s.out();
    Vec want(y.size()), relu(y.size());
    const std::int64_t plane = od[2] * od[3];
    for (std::size_t i = 0; i < y.size(); ++i) {
      want[i] = std::max(y[i] + zc[static_cast<std::size_t>(i / plane % 4)], 0.0);
      relu[i] = std::max(y[i], 0.0);
    }
    std::vector<HostTensor> in{tensor(HP_F32, s.x, x), tensor(HP_F32, s.w, w),
                               tensor(HP_F32, {4, 1, 1}, zc)};
    auto attrs = s.attrs();
    attrs.push_back(as("activation", "Relu"));
    // The omitted bias has a placeholder among the examples (indexed like the node's inputs).
    std::vector<HostTensor> example{in[0], in[1], HostTensor{}, in[2]};
    OneNode fc("FusedConv", "com.microsoft", {"x", "w", "", "z"}, example, {"y"}, attrs, HP_F32);
    check_close(fc.values_of(in), want, 1e-5);
    in.pop_back();
    OneNode r("FusedConv", "com.microsoft", {"x", "w"}, in, {"y"}, attrs, HP_F32);
    check_close(r.values_of(in), relu, 1e-5);
  }
  SECTION("malformed: channels, bias size, kernel past the padded input, an unknown activation") {
    std::vector<HostTensor> in{tensor(HP_F32, {1, 3, 4, 4}, random(48, 1)),
                               tensor(HP_F32, {2, 2, 3, 3}, random(36, 2))};
    OneNode ch("Conv", "", {"x", "w"}, in, {"y"}, {}, HP_F32);
    CHECK(ch.error_of(in).find("channels") != std::string::npos);
    in[1] = tensor(HP_F32, {2, 3, 5, 5}, random(150, 2));
    OneNode big("Conv", "", {"x", "w"}, in, {"y"}, {}, HP_F32);
    CHECK(big.error_of(in).find("larger than the padded input") != std::string::npos);
    in[1] = tensor(HP_F32, {2, 3, 3, 3}, random(54, 2));
    in.push_back(tensor(HP_F32, {3}, random(3, 3)));
    OneNode bias("Conv", "", {"x", "w", "b"}, in, {"y"}, {}, HP_F32);
    CHECK(bias.error_of(in).find("bias") != std::string::npos);
    in.pop_back();
    OneNode act("FusedConv", "com.microsoft", {"x", "w"}, in, {"y"}, {as("activation", "Tanh")},
                HP_F32);
    CHECK(act.error_of(in).find("activation") != std::string::npos);
  }
}

TEST_CASE("MaxPool and AveragePool: float32 (oneDNN) matches float64 (loop)", "[exec][pool]") {
  struct Case {
    Dims x;
    std::vector<Attr> attrs;
  };
  const Case cases[] = {
      {{2, 3, 9, 9}, {al("kernel_shape", {3, 3}), al("strides", {2, 2}), al("pads", {1, 1, 1, 1})}},
      {{2, 3, 10, 10}, {al("kernel_shape", {3, 3}), al("strides", {2, 2}), ai("ceil_mode", 1)}},
      {{1, 4, 11, 7},
       {al("kernel_shape", {2, 3}), al("strides", {3, 2}), al("pads", {1, 0, 1, 2}),
        ai("ceil_mode", 1), ai("count_include_pad", 1)}},
      {{1, 2, 12, 12},
       {al("kernel_shape", {3, 3}), al("dilations", {2, 2}), al("pads", {2, 2, 2, 2})}},
      {{2, 2, 13}, {al("kernel_shape", {4}), al("strides", {3}), as("auto_pad", "SAME_UPPER")}},
      {{1, 2, 5, 6, 7}, {al("kernel_shape", {2, 2, 3}), al("strides", {2, 2, 2})}},
      {{8, 32, 32, 32}, {al("kernel_shape", {2, 2}), al("strides", {2, 2})}},
  };
  for (const Case& k : cases)
    for (const char* op : {"MaxPool", "AveragePool"}) {
      INFO(op << " on " << k.x.size() - 2 << "-d input of " << count(k.x));
      const Vec x = random(count(k.x), 91);
      std::vector<Attr> attrs = k.attrs;
      if (std::string(op) == "MaxPool") {  // count_include_pad is AveragePool's
        attrs.erase(std::remove_if(attrs.begin(), attrs.end(),
                                   [](const Attr& a) { return a.name == "count_include_pad"; }),
                    attrs.end());
      } else {  // dilations are AveragePool's from opset 19 only; this model is opset 17
        attrs.erase(std::remove_if(attrs.begin(), attrs.end(),
                                   [](const Attr& a) { return a.name == "dilations"; }),
                    attrs.end());
      }
      OneNode f64n(op, "", {"x"}, {f64(k.x, x)}, {"y"}, attrs, HP_F64);
      OneNode f32n(op, "", {"x"}, {tensor(HP_F32, k.x, x)}, {"y"}, attrs, HP_F32);
      check_close(f32n.values_of({tensor(HP_F32, k.x, x)}), f64n.values_of({f64(k.x, x)}), 1e-6);
    }
}

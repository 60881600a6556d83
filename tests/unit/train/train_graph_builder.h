// Small ONNX graphs built in code for the training tests (train_autodiff_test.cpp,
// train_stages_test.cpp), and random tensors to run them on.
#pragma once

#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "hp/exec/executor.h"
#include "hp/model/model.h"
#include "hp/plugin/hp_plugin.h"

namespace hp::test {

/// A small graph under construction: float32 tensors unless said otherwise.
struct Builder {
  onnx::ModelProto m;
  std::mt19937 rng{7};
  explicit Builder(int opset = 17) {
    m.set_ir_version(8);
    m.add_opset_import()->set_version(opset);
  }
  onnx::GraphProto& g() { return *m.mutable_graph(); }
  void input(const std::string& name, std::vector<std::int64_t> dims,
             int type = onnx::TensorProto::FLOAT) {
    value(g().add_input(), name, dims, type);
  }
  void output(const std::string& name, std::vector<std::int64_t> dims,
              int type = onnx::TensorProto::FLOAT) {
    value(g().add_output(), name, dims, type);
  }
  static void value(onnx::ValueInfoProto* v, const std::string& name,
                    const std::vector<std::int64_t>& dims, int type) {
    v->set_name(name);
    auto* tt = v->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(type);
    for (auto d : dims) tt->mutable_shape()->add_dim()->set_dim_value(d);
  }
  void weight(const std::string& name, std::vector<std::int64_t> dims, double scale = 0.5) {
    auto* t = g().add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    std::int64_t n = 1;
    for (auto d : dims) {
      t->add_dims(d);
      n *= d;
    }
    std::normal_distribution<float> nd(0.f, static_cast<float>(scale));
    for (std::int64_t k = 0; k < n; ++k) t->add_float_data(nd(rng));
  }
  void ints(const std::string& name, std::vector<std::int64_t> v) {
    auto* t = g().add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::INT64);
    t->add_dims(static_cast<std::int64_t>(v.size()));
    for (auto x : v) t->add_int64_data(x);
  }
  /// A Constant node writing the float32 scalar `v` (rank 0) to `name`, as exporters write
  /// GELU's sqrt 2, exponents and epsilons.
  onnx::NodeProto* constant(const std::string& name, float v) {
    auto* k = node("Constant", {}, {name});
    auto* a = k->add_attribute();
    a->set_name("value");
    a->set_type(onnx::AttributeProto::TENSOR);
    a->mutable_t()->set_data_type(onnx::TensorProto::FLOAT);
    a->mutable_t()->add_float_data(v);
    return k;
  }
  onnx::NodeProto* node(const std::string& op, std::vector<std::string> ins,
                        std::vector<std::string> outs, const std::string& name = "") {
    auto* n = g().add_node();
    n->set_op_type(op);
    n->set_name(name.empty() ? outs[0] + "_node" : name);
    for (auto& i : ins) n->add_input(i);
    for (auto& o : outs) n->add_output(o);
    return n;
  }
  model::Model model() {
    model::Model mm;
    mm.path = "test.onnx";
    mm.proto = std::make_shared<onnx::ModelProto>(m);
    for (const auto& o : m.opset_import()) mm.opsets[o.domain()] = o.version();
    mm.ir_version = m.ir_version();
    return mm;
  }
};

inline void attr_i(onnx::NodeProto* n, const std::string& name, std::int64_t v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}

inline void attr_f(onnx::NodeProto* n, const std::string& name, float v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::FLOAT);
  a->set_f(v);
}

inline void attr_s(onnx::NodeProto* n, const std::string& name, const std::string& v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::STRING);
  a->set_s(v);
}

inline void attr_ints(onnx::NodeProto* n, const std::string& name, std::vector<std::int64_t> v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (auto x : v) a->add_ints(x);
}

inline exec::HostTensor tensor(std::vector<std::int64_t> dims, int dtype, std::mt19937& rng,
                               std::int64_t classes = 0) {
  exec::HostTensor t;
  t.dtype = dtype;
  t.dims = std::move(dims);
  const auto n = t.numel();
  t.data.resize(static_cast<std::size_t>(n) * exec::dtype_size(dtype));
  if (dtype == HP_F32) {
    std::normal_distribution<float> nd;
    for (std::int64_t k = 0; k < n; ++k) t.as<float>()[k] = nd(rng);
  } else {
    std::uniform_int_distribution<std::int64_t> ud(0, classes - 1);
    for (std::int64_t k = 0; k < n; ++k) t.as<std::int64_t>()[k] = ud(rng);
  }
  return t;
}

/// A directory for one test program's models, named after `prefix` and the process, removed when
/// the program ends.
inline const std::filesystem::path& scratch_dir(const std::string& prefix) {
  static const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(::getpid()));
  static const struct Cleanup {
    ~Cleanup() { std::filesystem::remove_all(dir); }
  } cleanup;
  (void)cleanup;
  return dir;
}

/// The "loss" of every line of a training run's --metrics file, in order.
inline std::vector<double> metric_losses(const std::filesystem::path& metrics) {
  std::vector<double> out;
  std::ifstream in(metrics);
  for (std::string l; std::getline(in, l);)
    out.push_back(std::stod(l.substr(l.find("\"loss\":") + 7)));
  return out;
}

}  // namespace hp::test

// Helpers of the executor tests: ONNX graphs built with the protobuf API, tensors, the cpu backend.
#pragma once

#include <catch2/catch.hpp>

#include <onnx/onnx_pb.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "hp/exec/backends.h"
#include "hp/exec/tensor.h"
#include "hp/model/model.h"

namespace hp::exec::test {

namespace fs = std::filesystem;

inline fs::path temp_dir(const std::string& name) {
  fs::path d =
      fs::temp_directory_path() / ("hp_runtime_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

inline HostTensor f32(std::vector<std::int64_t> dims, std::vector<float> v, std::string name = "") {
  HostTensor t;
  t.name = std::move(name);
  t.dtype = HP_F32;
  t.dims = std::move(dims);
  t.data.resize(v.size() * 4);
  std::memcpy(t.data.data(), v.data(), t.data.size());
  return t;
}

inline void add_value(google::protobuf::RepeatedPtrField<onnx::ValueInfoProto>* list,
                      const std::string& name, std::vector<std::int64_t> dims,
                      int type = onnx::TensorProto::FLOAT) {
  auto* v = list->Add();
  v->set_name(name);
  auto* tt = v->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(type);
  for (auto d : dims) {
    auto* dim = tt->mutable_shape()->add_dim();
    if (d < 0)
      dim->set_dim_param("batch");
    else
      dim->set_dim_value(d);
  }
}

inline onnx::NodeProto* add_node(onnx::GraphProto* g, const std::string& op,
                                 std::vector<std::string> in, std::vector<std::string> out,
                                 const std::string& name, const std::string& domain = "") {
  auto* n = g->add_node();
  n->set_op_type(op);
  n->set_name(name);
  n->set_domain(domain);
  for (auto& s : in) n->add_input(s);
  for (auto& s : out) n->add_output(s);
  return n;
}

inline onnx::NodeProto* add_scalar_constant(onnx::GraphProto* g, const std::string& out, float v) {
  auto* n = add_node(g, "Constant", {}, {out}, out);
  auto* a = n->add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  a->mutable_t()->set_data_type(onnx::TensorProto::FLOAT);
  a->mutable_t()->add_float_data(v);
  return n;
}

inline fs::path write_model(const fs::path& dir, const onnx::ModelProto& m) {
  fs::path p = dir / "m.onnx";
  std::ofstream(p, std::ios::binary) << m.SerializeAsString();
  return p;
}

inline void add_f32_init(onnx::GraphProto* g, const std::string& name,
                         std::vector<std::int64_t> dims, const std::vector<float>& v) {
  auto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::FLOAT);
  for (auto d : dims) t->add_dims(d);
  for (float f : v) t->add_float_data(f);
}

inline Backends cpu() {
  auto b = open_backends("cpu", 1, {});
  REQUIRE(b.ok());
  return *b;
}

inline model::Model load(const fs::path& p) {
  model::LoadOptions lo;
  lo.mode = model::LoadMode::shapes_only;
  auto m = model::load_model(p, lo);
  INFO((m.ok() ? std::string() : m.error().message()));
  REQUIRE(m.ok());
  return *m;
}

}  // namespace hp::exec::test

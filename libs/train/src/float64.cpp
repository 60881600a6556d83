// to_float64 (gradcheck.h): the model rewritten to compute in double.
//
// Everything that fixes a floating-point element type is rewritten, so that no float32 value is
// left anywhere in the graph: a single float32 Constant or Cast would round every value passing
// through it and the finite differences of gradcheck.cpp would see float32 noise again. The
// half-precision types go to double too: a mixed-precision export's Casts to float16 would
// otherwise round the same way.
//
// What carries an element type in an ONNX model: initializers (and sparse initializers' values),
// the TypeProtos of graph inputs, outputs and value_info (tensor, sequence, optional and map
// types), tensor and TypeProto attributes (Constant's value, ConstantOfShape's value), Constant's
// value_float / value_floats (float32 by definition: they become a double `value`), and the integer
// attributes of ai.onnx ops that name an output type (Cast `to`, `dtype` of the random ops, EyeLike
// and SequenceEmpty). Subgraphs (If, Loop, Scan) and model-local functions are rewritten the same
// way. CastLike takes its type from an input, which is rewritten with everything else.
#include <fmt/core.h>
#include <onnx/onnx_pb.h>

#include <bit>
#include <cstring>

#include "hp/train/gradcheck.h"
#include "initializer_bytes.h"

namespace hp::train {

namespace {

using onnx::TensorProto;

bool narrow_float(std::int32_t t) {
  return t == TensorProto::FLOAT || t == TensorProto::FLOAT16 || t == TensorProto::BFLOAT16;
}

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);  // inf, nan
  } else if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while (!(man & 0x400u)) {
        man <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((man & 0x3ffu) << 13);
    }
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  return std::bit_cast<float>(bits);
}

float bf16_to_float(std::uint16_t h) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

/// The values of a float32/float16/bfloat16 tensor, from raw_data, the typed fields or external
/// data (resolved against `base`).
Expected<std::vector<double>> float_values(const TensorProto& t, const std::filesystem::path& base,
                                           const std::string& where) {
  std::int64_t n = 1;
  for (std::int64_t d : t.dims()) n *= d;
  std::vector<double> v;
  const bool half = t.data_type() != TensorProto::FLOAT;
  if (!is_external(t) && !t.has_raw_data() && n > 0) {  // typed fields
    const std::int64_t have = half ? t.int32_data_size() : t.float_data_size();
    if (have != n)
      return Error(Errc::bad_input,
                   fmt::format("tensor '{}' holds {} values, its dims need {}", t.name(), have, n),
                   where);
    v.reserve(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) {
      if (!half) {
        v.push_back(t.float_data(static_cast<int>(i)));
        continue;
      }
      const auto bits = static_cast<std::uint16_t>(t.int32_data(static_cast<int>(i)));
      v.push_back(t.data_type() == TensorProto::FLOAT16 ? half_to_float(bits)
                                                        : bf16_to_float(bits));
    }
    return v;
  }
  HP_ASSIGN_OR_RETURN(std::string bytes, initializer_bytes(t, base, where));
  v.resize(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    if (!half) {
      float f;
      std::memcpy(&f, bytes.data() + 4 * i, 4);
      v[static_cast<std::size_t>(i)] = f;
      continue;
    }
    std::uint16_t bits;
    std::memcpy(&bits, bytes.data() + 2 * i, 2);
    v[static_cast<std::size_t>(i)] =
        t.data_type() == TensorProto::FLOAT16 ? half_to_float(bits) : bf16_to_float(bits);
  }
  return v;
}

/// `t` with its values in double, inline (raw_data).
Status widen_tensor(TensorProto& t, const std::filesystem::path& base, const std::string& where) {
  if (!narrow_float(t.data_type())) return {};
  HP_ASSIGN_OR_RETURN(auto v, float_values(t, base, where));
  t.clear_float_data();
  t.clear_int32_data();
  t.clear_external_data();
  t.clear_data_location();
  t.set_data_type(TensorProto::DOUBLE);
  t.set_raw_data(std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(double)));
  return {};
}

void widen_type(onnx::TypeProto& t) {
  if (t.has_tensor_type()) {
    if (narrow_float(t.tensor_type().elem_type()))
      t.mutable_tensor_type()->set_elem_type(TensorProto::DOUBLE);
  } else if (t.has_sequence_type()) {
    widen_type(*t.mutable_sequence_type()->mutable_elem_type());
  } else if (t.has_optional_type()) {
    widen_type(*t.mutable_optional_type()->mutable_elem_type());
  } else if (t.has_map_type()) {
    widen_type(*t.mutable_map_type()->mutable_value_type());
  } else if (t.has_sparse_tensor_type()) {
    if (narrow_float(t.sparse_tensor_type().elem_type()))
      t.mutable_sparse_tensor_type()->set_elem_type(TensorProto::DOUBLE);
  }
}

bool is_ai_onnx(const onnx::NodeProto& n) { return n.domain().empty() || n.domain() == "ai.onnx"; }

struct Widener {
  std::filesystem::path base;

  Status graph(onnx::GraphProto& g) {
    for (auto& t : *g.mutable_initializer()) HP_TRY(widen_tensor(t, base, t.name()));
    for (auto& s : *g.mutable_sparse_initializer())
      HP_TRY(widen_tensor(*s.mutable_values(), base, s.values().name()));
    for (auto* vs : {g.mutable_input(), g.mutable_output(), g.mutable_value_info()})
      for (auto& v : *vs)
        if (v.has_type()) widen_type(*v.mutable_type());
    for (auto& n : *g.mutable_node()) HP_TRY(node(n));
    return {};
  }

  Status node(onnx::NodeProto& n) {
    const std::string where =
        fmt::format("node '{}' ({})", n.name().empty() ? n.output(0) : n.name(), n.op_type());
    if (is_ai_onnx(n) && n.op_type() == "Constant") constant_floats(n);
    for (auto& a : *n.mutable_attribute()) {
      if (a.has_t()) HP_TRY(widen_tensor(*a.mutable_t(), base, where));
      for (auto& t : *a.mutable_tensors()) HP_TRY(widen_tensor(t, base, where));
      if (a.has_sparse_tensor())
        HP_TRY(widen_tensor(*a.mutable_sparse_tensor()->mutable_values(), base, where));
      if (a.has_tp()) widen_type(*a.mutable_tp());
      for (auto& tp : *a.mutable_type_protos()) widen_type(tp);
      if (a.has_g()) HP_TRY(graph(*a.mutable_g()));
      for (auto& g : *a.mutable_graphs()) HP_TRY(graph(g));
      const bool names_type = a.name() == "to" || a.name() == "dtype" || a.name() == "output_dtype";
      if (is_ai_onnx(n) && names_type && a.type() == onnx::AttributeProto::INT &&
          narrow_float(static_cast<std::int32_t>(a.i())))
        a.set_i(TensorProto::DOUBLE);
    }
    return {};
  }

  /// Constant's value_float / value_floats are float32 by definition: they become `value`.
  static void constant_floats(onnx::NodeProto& n) {
    for (auto& a : *n.mutable_attribute()) {
      const bool one = a.name() == "value_float", many = a.name() == "value_floats";
      if (!one && !many) continue;
      std::vector<double> v;
      if (one) v.push_back(a.f());
      for (float f : a.floats()) v.push_back(f);
      a.Clear();
      a.set_name("value");
      a.set_type(onnx::AttributeProto::TENSOR);
      TensorProto* t = a.mutable_t();
      t->set_data_type(TensorProto::DOUBLE);
      if (many) t->add_dims(static_cast<std::int64_t>(v.size()));
      t->set_raw_data(
          std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(double)));
      return;
    }
  }
};

}  // namespace

Expected<model::Model> to_float64(const model::Model& m) {
  if (!m.proto) return Error(Errc::internal, "to_float64: the model has no proto");
  auto proto = std::make_shared<onnx::ModelProto>(*m.proto);
  Widener w{m.path.parent_path()};
  HP_TRY(w.graph(*proto->mutable_graph()));
  for (auto& f : *proto->mutable_functions())
    for (auto& n : *f.mutable_node()) HP_TRY(w.node(n));
  model::Model out = m;
  out.proto = std::move(proto);
  return out;
}

}  // namespace hp::train

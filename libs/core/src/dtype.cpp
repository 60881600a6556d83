// The dtype table: one row per DType with its names, size and ONNX code, read by every function
// below.
#include "hp/core/dtype.h"

#include <array>

#include <fmt/format.h>

#include "hp/core/optimizer.h"

namespace hp {
namespace {

struct Row {
  DType type;
  const char* name;
  std::array<const char*, 3> aliases;  // nullptr-terminated when shorter
  int size;
  bool is_float;
  std::int32_t onnx;  // 0 when ONNX has no (single) type
};

namespace ot = onnx_type;

// In enum order: kRows[static_cast<int>(t)].type == t (checked below).
constexpr std::array<Row, 17> kRows{{
    {DType::f32, "f32", {"fp32", "float32", "float"}, 4, true, ot::float32},
    {DType::f16, "f16", {"fp16", "float16", "half"}, 2, true, ot::float16},
    {DType::bf16, "bf16", {"bfloat16", nullptr, nullptr}, 2, true, ot::bfloat16},
    {DType::f64, "f64", {"fp64", "float64", "double"}, 8, true, ot::float64},
    {DType::i8, "i8", {"int8", nullptr, nullptr}, 1, false, ot::int8},
    {DType::i32, "i32", {"int32", nullptr, nullptr}, 4, false, ot::int32},
    {DType::i64, "i64", {"int64", nullptr, nullptr}, 8, false, ot::int64},
    {DType::f8, "f8", {"fp8", "float8", nullptr}, 1, true, ot::undefined},
    {DType::boolean, "bool", {nullptr, nullptr, nullptr}, 1, false, ot::boolean},
    {DType::u8, "u8", {"uint8", nullptr, nullptr}, 1, false, ot::uint8},
    {DType::i16, "i16", {"int16", nullptr, nullptr}, 2, false, ot::int16},
    {DType::u16, "u16", {"uint16", nullptr, nullptr}, 2, false, ot::uint16},
    {DType::u32, "u32", {"uint32", nullptr, nullptr}, 4, false, ot::uint32},
    {DType::u64, "u64", {"uint64", nullptr, nullptr}, 8, false, ot::uint64},
    {DType::c64, "c64", {"complex64", nullptr, nullptr}, 8, false, ot::complex64},
    {DType::c128, "c128", {"complex128", nullptr, nullptr}, 16, false, ot::complex128},
    {DType::tf32, "tf32", {nullptr, nullptr, nullptr}, 4, true, ot::undefined},
}};

constexpr bool rows_in_enum_order() {
  for (std::size_t i = 0; i < kRows.size(); ++i)
    if (static_cast<std::size_t>(kRows[i].type) != i) return false;
  return true;
}
static_assert(rows_in_enum_order(), "kRows must list the DTypes in enum order");

constexpr std::array<DType, kRows.size()> kAll = [] {
  std::array<DType, kRows.size()> a{};
  for (std::size_t i = 0; i < kRows.size(); ++i) a[i] = kRows[i].type;
  return a;
}();

const Row& row(DType t) { return kRows[static_cast<std::size_t>(t)]; }

}  // namespace

std::span<const DType> all_dtypes() { return kAll; }

const char* dtype_name(DType t) { return row(t).name; }

int dtype_size(DType t) { return row(t).size; }

bool dtype_is_float(DType t) { return row(t).is_float; }

std::string dtype_names_help() {
  std::string s;
  for (const Row& r : kRows) {
    s += s.empty() ? "" : ", ";
    s += r.name;
    std::string aliases;
    for (const char* a : r.aliases)
      if (a) aliases += (aliases.empty() ? "" : ", ") + std::string(a);
    if (!aliases.empty()) s += " (" + aliases + ")";
  }
  return s;
}

Expected<DType> parse_dtype(std::string_view name) {
  for (const Row& r : kRows) {
    if (name == r.name) return r.type;
    for (const char* a : r.aliases)
      if (a && name == a) return r.type;
  }
  return Error(Errc::usage, fmt::format("unknown dtype '{}'", name), "",
               "use one of " + dtype_names_help());
}

std::optional<DType> dtype_from_onnx(std::int32_t code) {
  switch (code) {
    case ot::float8e4m3fn:
    case ot::float8e4m3fnuz:
    case ot::float8e5m2:
    case ot::float8e5m2fnuz: return DType::f8;
    case ot::undefined: return std::nullopt;
    default:
      for (const Row& r : kRows)
        if (r.onnx == code) return r.type;
      return std::nullopt;
  }
}

std::int32_t dtype_to_onnx(DType t) { return row(t).onnx; }

// Optimizers (optimizer.h) live here too: their state sizes are a function of the training dtype.

const char* optimizer_name(Optimizer o) {
  switch (o) {
    case Optimizer::none: return "none";
    case Optimizer::sgd: return "sgd";
    case Optimizer::adam: return "adam";
    case Optimizer::adamw: return "adamw";
  }
  return "none";
}

Expected<Optimizer> parse_optimizer(std::string_view name) {
  for (Optimizer o : {Optimizer::adam, Optimizer::adamw, Optimizer::sgd, Optimizer::none})
    if (name == optimizer_name(o)) return o;
  return Error(Errc::usage, fmt::format("unknown optimizer '{}'", name), "",
               "use adam, adamw, sgd or none");
}

double optimizer_state_bytes(Optimizer o, DType compute) {
  // An fp32 master copy of the weights when training in a narrower type.
  const double master = dtype_size(compute) < 4 ? 4 : 0;
  switch (o) {
    case Optimizer::adam:
    case Optimizer::adamw: return master + 8;  // two fp32 moments
    case Optimizer::sgd: return master + 4;    // one fp32 momentum
    case Optimizer::none: return 0;
  }
  return 0;
}

}  // namespace hp

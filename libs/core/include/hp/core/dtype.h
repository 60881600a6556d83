// Element types: the one list of the data types hp deals with, their names, byte sizes and ONNX
// codes. Every layer speaks it: recipes and --dtype options are parsed with parse_dtype, the
// planner and offload-profile cost with dtype_size, the plugin ABI's hp_dtype is the same numbering
// for its first fourteen values, and the model and executor translate ONNX TensorProto::DataType
// with dtype_from_onnx / dtype_to_onnx (plain integers: core does not include the ONNX headers).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "hp/core/expected.h"

namespace hp {

/// The values 0..13 are the plugin ABI's hp_dtype (hp/plugin/hp_plugin.h: HP_F32 .. HP_U64), so an
/// hp_dtype converts with a static_cast (libs/plugin static_asserts the correspondence). The rest
/// are types the model library reads from ONNX files, and tf32, a compute format that is only a
/// peak-FLOP/s key (stored as f32).
enum class DType : std::int8_t {
  f32 = 0,
  f16 = 1,
  bf16 = 2,
  f64 = 3,
  i8 = 4,
  i32 = 5,
  i64 = 6,
  f8 = 7,  ///< any 8-bit float (ONNX has four: E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ)
  boolean = 8,
  u8 = 9,
  i16 = 10,
  u16 = 11,
  u32 = 12,
  u64 = 13,
  // beyond the plugin ABI
  c64 = 14,   ///< complex of two f32
  c128 = 15,  ///< complex of two f64
  tf32 = 16,  ///< TensorFloat-32: a compute format, 4 bytes in memory; no ONNX type
};

/// Every DType, in enum order.
std::span<const DType> all_dtypes();

/// The canonical name: "f32", "f16", "bf16", "f64", "i8", "i32", "i64", "f8", "bool", "u8", "i16",
/// "u16", "u32", "u64", "c64", "c128", "tf32" (the labels of `hp devices` and the executor).
const char* dtype_name(DType t);

/// Bytes per element (f8 1, f16/bf16 2, f32/tf32 4, c128 16, ...).
int dtype_size(DType t);

/// f32, f16, bf16, f64, f8 and tf32.
bool dtype_is_float(DType t);

/// A dtype by its canonical name or an alias: "fp32"/"float32"/"float", "fp16"/"float16"/"half",
/// "bfloat16", "fp64"/"float64"/"double", "fp8"/"float8", "int8", "uint8", "int16", "uint16",
/// "int32", "uint32", "int64", "uint64", "complex64", "complex128". Exact, lower-case match.
/// Errc::usage naming the text and listing every valid name otherwise.
Expected<DType> parse_dtype(std::string_view name);

/// "f32 (fp32, float32, float), f16 (fp16, float16, half), ..." for messages and help text.
std::string dtype_names_help();

/// The DType of an ONNX TensorProto::DataType code; nullopt for UNDEFINED, STRING and unknown
/// codes.
std::optional<DType> dtype_from_onnx(std::int32_t onnx_type);
/// The ONNX TensorProto::DataType code of a DType; 0 (UNDEFINED) for tf32 and f8, which have no
/// single ONNX type.
std::int32_t dtype_to_onnx(DType t);

/// ONNX TensorProto::DataType codes (onnx.proto3), for code that must not include the ONNX headers.
namespace onnx_type {
inline constexpr std::int32_t undefined = 0, float32 = 1, uint8 = 2, int8 = 3, uint16 = 4,
                              int16 = 5, int32 = 6, int64 = 7, string = 8, boolean = 9,
                              float16 = 10, float64 = 11, uint32 = 12, uint64 = 13, complex64 = 14,
                              complex128 = 15, bfloat16 = 16, float8e4m3fn = 17,
                              float8e4m3fnuz = 18, float8e5m2 = 19, float8e5m2fnuz = 20;
}  // namespace onnx_type

}  // namespace hp

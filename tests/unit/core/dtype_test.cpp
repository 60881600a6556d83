// hp/core/dtype.h and optimizer.h: the one dtype table (names, aliases, sizes, ONNX codes) and the
// optimizer-state sizes the planner and offload-profile share.
#include <catch2/catch.hpp>

#include <set>
#include <string>

#include "hp/core/dtype.h"
#include "hp/core/optimizer.h"

using hp::DType;

TEST_CASE("dtype: every canonical name parses back to its type, names are distinct",
          "[core][dtype]") {
  std::set<std::string> names;
  for (DType t : hp::all_dtypes()) {
    auto p = hp::parse_dtype(hp::dtype_name(t));
    REQUIRE(p.ok());
    CHECK(*p == t);
    names.insert(hp::dtype_name(t));
    CHECK(hp::dtype_size(t) > 0);
  }
  CHECK(names.size() == hp::all_dtypes().size());
  CHECK(hp::all_dtypes().size() == 17);
}

TEST_CASE("dtype: aliases of the recipe and ONNX spellings", "[core][dtype]") {
  const std::pair<const char*, DType> cases[] = {
      {"fp32", DType::f32},       {"float32", DType::f32}, {"float", DType::f32},
      {"f32", DType::f32},        {"fp16", DType::f16},    {"float16", DType::f16},
      {"half", DType::f16},       {"bf16", DType::bf16},   {"bfloat16", DType::bf16},
      {"fp64", DType::f64},       {"double", DType::f64},  {"fp8", DType::f8},
      {"float8", DType::f8},      {"int8", DType::i8},     {"uint8", DType::u8},
      {"int32", DType::i32},      {"int64", DType::i64},   {"bool", DType::boolean},
      {"tf32", DType::tf32},      {"uint64", DType::u64},  {"complex64", DType::c64},
      {"complex128", DType::c128}};
  for (auto [name, want] : cases) {
    INFO(name);
    auto p = hp::parse_dtype(name);
    REQUIRE(p.ok());
    CHECK(*p == want);
  }
}

TEST_CASE("dtype: byte sizes", "[core][dtype]") {
  CHECK(hp::dtype_size(DType::f32) == 4);
  CHECK(hp::dtype_size(DType::tf32) == 4);
  CHECK(hp::dtype_size(DType::bf16) == 2);
  CHECK(hp::dtype_size(DType::f16) == 2);
  CHECK(hp::dtype_size(DType::f8) == 1);
  CHECK(hp::dtype_size(DType::f64) == 8);
  CHECK(hp::dtype_size(DType::i8) == 1);
  CHECK(hp::dtype_size(DType::u8) == 1);
  CHECK(hp::dtype_size(DType::boolean) == 1);
  CHECK(hp::dtype_size(DType::i32) == 4);
  CHECK(hp::dtype_size(DType::i64) == 8);
  CHECK(hp::dtype_size(DType::c64) == 8);
  CHECK(hp::dtype_size(DType::c128) == 16);
  CHECK(hp::dtype_is_float(DType::bf16));
  CHECK(hp::dtype_is_float(DType::f8));
  CHECK_FALSE(hp::dtype_is_float(DType::i64));
  CHECK_FALSE(hp::dtype_is_float(DType::boolean));
}

TEST_CASE("dtype: malformed names are a usage error listing the valid ones", "[core][dtype]") {
  for (const char* bad :
       {"", "FP32", "Bf16", " bf16", "bf16 ", "float33", "f", "fp", "int", "string", "bf16\n"}) {
    INFO("'" << bad << "'");
    auto p = hp::parse_dtype(bad);
    REQUIRE_FALSE(p.ok());
    CHECK(p.error().code == hp::Errc::usage);
    CHECK_THAT(p.error().message(), Catch::Contains("unknown dtype"));
    CHECK_THAT(p.error().what.hint, Catch::Contains("f32 (fp32, float32, float)"));
    CHECK_THAT(p.error().what.hint, Catch::Contains("bf16 (bfloat16)"));
    CHECK_THAT(p.error().what.hint, Catch::Contains("bool"));
  }
  CHECK_THAT(hp::parse_dtype("fp33").error().message(), Catch::Contains("'fp33'"));
}

TEST_CASE("dtype: ONNX TensorProto::DataType codes both ways", "[core][dtype]") {
  namespace ot = hp::onnx_type;
  CHECK(hp::dtype_to_onnx(DType::f32) == 1);
  CHECK(hp::dtype_to_onnx(DType::bf16) == 16);
  CHECK(hp::dtype_to_onnx(DType::i64) == 7);
  CHECK(hp::dtype_to_onnx(DType::boolean) == 9);
  CHECK(hp::dtype_to_onnx(DType::tf32) == ot::undefined);
  CHECK(hp::dtype_to_onnx(DType::f8) == ot::undefined);
  for (DType t : hp::all_dtypes()) {
    const std::int32_t code = hp::dtype_to_onnx(t);
    if (code == ot::undefined) continue;
    INFO(hp::dtype_name(t));
    auto back = hp::dtype_from_onnx(code);
    REQUIRE(back.has_value());
    CHECK(*back == t);
  }
  for (std::int32_t f8 : {ot::float8e4m3fn, ot::float8e4m3fnuz, ot::float8e5m2, ot::float8e5m2fnuz})
    CHECK(hp::dtype_from_onnx(f8) == DType::f8);
  for (std::int32_t bad : {ot::undefined, ot::string, -1, 21, 22, 23, 1000})
    CHECK_FALSE(hp::dtype_from_onnx(bad).has_value());
}

TEST_CASE("optimizer: names and state bytes per parameter", "[core][dtype]") {
  for (hp::Optimizer o :
       {hp::Optimizer::none, hp::Optimizer::sgd, hp::Optimizer::adam, hp::Optimizer::adamw}) {
    auto p = hp::parse_optimizer(hp::optimizer_name(o));
    REQUIRE(p.ok());
    CHECK(*p == o);
  }
  for (const char* bad : {"", "Adam", "lamb", "adam ", "sgd-momentum"}) {
    auto p = hp::parse_optimizer(bad);
    REQUIRE_FALSE(p.ok());
    CHECK(p.error().code == hp::Errc::usage);
    CHECK_THAT(p.error().what.hint, Catch::Contains("adam, adamw, sgd or none"));
  }
  using hp::Optimizer;
  // Mixed precision: fp32 master (4) + two fp32 moments (8) = 12, the ZeRO paper's K.
  CHECK(hp::optimizer_state_bytes(Optimizer::adam, DType::bf16) == 12);
  CHECK(hp::optimizer_state_bytes(Optimizer::adamw, DType::f16) == 12);
  CHECK(hp::optimizer_state_bytes(Optimizer::adam, DType::f8) == 12);
  CHECK(hp::optimizer_state_bytes(Optimizer::adam, DType::f32) == 8);
  CHECK(hp::optimizer_state_bytes(Optimizer::sgd, DType::bf16) == 8);
  CHECK(hp::optimizer_state_bytes(Optimizer::sgd, DType::f32) == 4);
  CHECK(hp::optimizer_state_bytes(Optimizer::none, DType::bf16) == 0);
  CHECK(hp::optimizer_state_bytes(Optimizer::none, DType::f32) == 0);
}

// The overflow-checked size arithmetic of hp/core/checked.h: products and sums report overflow
// instead of wrapping, and bounded_numel enforces the documented dim and element limits.
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <vector>

#include "hp/core/checked.h"

using hp::bounded_numel;
using hp::checked_add;
using hp::checked_mul;

TEST_CASE("checked: multiply and add report overflow", "[core]") {
  constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
  CHECK(checked_mul(3, 4) == 12);
  CHECK_FALSE(checked_mul(std::int64_t{1} << 32, std::int64_t{1} << 32));
  CHECK_FALSE(checked_mul(kMax, 2));
  CHECK(checked_mul(kMax, 1) == kMax);
  CHECK(checked_add(kMax - 1, 1) == kMax);
  CHECK_FALSE(checked_add(kMax, 1));
  CHECK(hp::saturating_add(kMax, 5) == kMax);
  CHECK(hp::saturating_add(2, 5) == 7);
}

TEST_CASE("checked: bounded_numel enforces the dim and element limits", "[core]") {
  CHECK(bounded_numel(std::vector<std::int64_t>{}) == 1);
  CHECK(bounded_numel(std::vector<std::int64_t>{2, 3, 4}) == 24);
  CHECK(bounded_numel(std::vector<std::int64_t>{0, hp::kMaxDim}) == 0);
  CHECK(bounded_numel(std::vector<std::int64_t>{hp::kMaxDim}) == hp::kMaxDim);
  // [2^40, 2^40] wrapped to 0 elements before; now it is beyond the limits.
  CHECK_FALSE(bounded_numel(std::vector<std::int64_t>{hp::kMaxDim, hp::kMaxDim}));
  CHECK_FALSE(bounded_numel(std::vector<std::int64_t>{hp::kMaxDim + 1}));
  CHECK_FALSE(bounded_numel(std::vector<std::int64_t>{-1, 4}));
  CHECK_FALSE(bounded_numel(std::vector<std::int64_t>{1000000000000000}));
  CHECK(bounded_numel(std::vector<std::int64_t>{std::int64_t{1} << 28, std::int64_t{1} << 28}) ==
        hp::kMaxElements);
  CHECK_FALSE(
      bounded_numel(std::vector<std::int64_t>{std::int64_t{1} << 28, std::int64_t{1} << 28, 2}));
}

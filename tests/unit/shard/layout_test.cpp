// Layout algebra: every example of docs/shard.md, "Worked slices", every row of its "Validation",
// the integer tensor_map, shape round trips and the uneven (torch.chunk) mode of "Uneven
// dimensions".
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "hp/shard/layout.h"

using namespace hp::shard;
using Map = std::vector<std::vector<std::string>>;
using Ranges = std::vector<Range>;

namespace {

Mesh mesh(std::vector<std::int64_t> dims, std::vector<std::string> axes,
          std::vector<std::int64_t> ranks = {}) {
  auto m = Mesh::make(std::move(dims), std::move(axes), std::move(ranks));
  REQUIRE(m.ok());
  return *m;
}

Sharding sharding(const Mesh& m, const Map& map) {
  auto s = parse_tensor_map(m, map, "t");
  REQUIRE(s.ok());
  return *s;
}

std::string error_of(const hp::Expected<Mesh>& m) {
  REQUIRE_FALSE(m.ok());
  CHECK(m.error().code == hp::Errc::bad_input);
  return m.error().message();
}

std::string error_of(const hp::Expected<Sharding>& s) {
  REQUIRE_FALSE(s.ok());
  CHECK(s.error().code == hp::Errc::bad_input);
  return s.error().message();
}

const Range all4{0, 4};

}  // namespace

TEST_CASE("layout: mesh (2,2) worked slices", "[shard][layout]") {
  Mesh m = mesh({2, 2}, {"x", "y"});
  std::vector<std::int64_t> s44{4, 4}, s84{8, 4};
  auto slices = [&](const Map& map, const std::vector<std::int64_t>& shape) {
    Sharding s = sharding(m, map);
    REQUIRE(check_shape(m, s, shape, "t").ok());
    std::vector<Ranges> out;
    for (std::int64_t r = 0; r < 4; ++r) out.push_back(slice_of(m, s, shape, r));
    return out;
  };
  CHECK(
      slices({{"x"}, {"y"}}, s44) ==
      std::vector<Ranges>{{{0, 2}, {0, 2}}, {{0, 2}, {2, 4}}, {{2, 4}, {0, 2}}, {{2, 4}, {2, 4}}});
  CHECK(
      slices({{"y"}, {"x"}}, s44) ==
      std::vector<Ranges>{{{0, 2}, {0, 2}}, {{2, 4}, {0, 2}}, {{0, 2}, {2, 4}}, {{2, 4}, {2, 4}}});
  CHECK(slices({{"x"}, {"None"}}, s44) ==
        std::vector<Ranges>{{{0, 2}, all4}, {{0, 2}, all4}, {{2, 4}, all4}, {{2, 4}, all4}});
  CHECK(slices({{"x", "y"}, {}}, s84) ==
        std::vector<Ranges>{{{0, 2}, all4}, {{2, 4}, all4}, {{4, 6}, all4}, {{6, 8}, all4}});
  CHECK(slices({{"y", "x"}, {}}, s84) ==
        std::vector<Ranges>{{{0, 2}, all4}, {{4, 6}, all4}, {{2, 4}, all4}, {{6, 8}, all4}});
}

TEST_CASE("layout: rank_list variants place global ranks at mesh positions", "[shard][layout]") {
  std::vector<std::int64_t> shape{4, 4};
  Mesh m = mesh({2, 2}, {"x", "y"}, {4, 5, 6, 7});
  Sharding s = sharding(m, {{"x"}, {"y"}});
  CHECK(slice_of(m, s, shape, 4) == Ranges{{0, 2}, {0, 2}});
  CHECK(slice_of(m, s, shape, 5) == Ranges{{0, 2}, {2, 4}});
  CHECK(slice_of(m, s, shape, 6) == Ranges{{2, 4}, {0, 2}});
  CHECK(slice_of(m, s, shape, 7) == Ranges{{2, 4}, {2, 4}});
  CHECK_FALSE(m.holds(0));
  CHECK(m.holds(7));
  CHECK(slice_of(m, s, shape, 0).empty());  // rank 0 is not on this mesh
  CHECK(m.group(0, {0}).empty());

  Mesh p = mesh({2, 2}, {"x", "y"}, {0, 2, 1, 3});
  CHECK(slice_of(p, s, shape, 0) == Ranges{{0, 2}, {0, 2}});
  CHECK(slice_of(p, s, shape, 1) == Ranges{{2, 4}, {0, 2}});
  CHECK(slice_of(p, s, shape, 2) == Ranges{{0, 2}, {2, 4}});
  CHECK(slice_of(p, s, shape, 3) == Ranges{{2, 4}, {2, 4}});
  CHECK(p.coords(1) == std::vector<std::int64_t>{1, 0});
  CHECK(p.rank_at({0, 1}) == 2);
  // Groups follow mesh coordinates, not ascending rank: along x from rank 0 is [0, 1].
  CHECK(p.group(0, {0}) == std::vector<std::int64_t>{0, 1});
  CHECK(p.groups({1}) == std::vector<std::vector<std::int64_t>>{{0, 2}, {1, 3}});
}

TEST_CASE("layout: mesh (2,4) slices", "[shard][layout]") {
  Mesh m = mesh({2, 4}, {"dp", "mp"});
  SECTION("(dp, mp) on (4,8)") {
    Sharding s = sharding(m, {{"dp"}, {"mp"}});
    for (std::int64_t r = 0; r < 8; ++r) {
      std::int64_t row = r / 4, col = r % 4;
      CHECK(slice_of(m, s, {4, 8}, r) == Ranges{{2 * row, 2 * row + 2}, {2 * col, 2 * col + 2}});
    }
  }
  SECTION("(mp, dp) on (8,4)") {
    Sharding s = sharding(m, {{"mp"}, {"dp"}});
    for (std::int64_t r = 0; r < 8; ++r) {
      std::int64_t col = r / 4, row = r % 4;
      CHECK(slice_of(m, s, {8, 4}, r) == Ranges{{2 * row, 2 * row + 2}, {2 * col, 2 * col + 2}});
    }
  }
  SECTION("((dp, mp), None) on (8,2): rank r holds row r") {
    Sharding s = sharding(m, {{"dp", "mp"}, {"None"}});
    for (std::int64_t r = 0; r < 8; ++r)
      CHECK(slice_of(m, s, {8, 2}, r) == Ranges{{r, r + 1}, {0, 2}});
  }
  SECTION("((mp, dp), None) on (8,2)") {
    Sharding s = sharding(m, {{"mp", "dp"}, {"None"}});
    std::vector<std::int64_t> rows{0, 2, 4, 6, 1, 3, 5, 7};
    for (std::int64_t r = 0; r < 8; ++r) {
      std::int64_t row = rows[static_cast<std::size_t>(r)];
      CHECK(slice_of(m, s, {8, 2}, r) == Ranges{{row, row + 1}, {0, 2}});
    }
  }
  SECTION("(dp, None) on (4,8) is replicated 4x over mp") {
    Sharding s = sharding(m, {{"dp"}, {"None"}});
    for (std::int64_t r = 0; r < 8; ++r)
      CHECK(slice_of(m, s, {4, 8}, r) == Ranges{{r < 4 ? 0 : 2, r < 4 ? 2 : 4}, {0, 8}});
    CHECK(repeat_num(m, s) == 4);
    CHECK(replication_groups(m, s) ==
          std::vector<std::vector<std::int64_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}});
  }
}

TEST_CASE("layout: 3-D mesh (2,2,2) slices", "[shard][layout]") {
  Mesh m = mesh({2, 2, 2}, {"dp", "sp", "mp"});
  SECTION("(dp, mp) on (4,4), replicated over sp") {
    Sharding s = sharding(m, {{"dp"}, {"mp"}});
    std::vector<Ranges> want{{{0, 2}, {0, 2}}, {{0, 2}, {2, 4}}, {{0, 2}, {0, 2}},
                             {{0, 2}, {2, 4}}, {{2, 4}, {0, 2}}, {{2, 4}, {2, 4}},
                             {{2, 4}, {0, 2}}, {{2, 4}, {2, 4}}};
    for (std::int64_t r = 0; r < 8; ++r)
      CHECK(slice_of(m, s, {4, 4}, r) == want[static_cast<std::size_t>(r)]);
    CHECK(replication_groups(m, s) ==
          std::vector<std::vector<std::int64_t>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
    CHECK(repeat_num(m, s) == 2);
  }
  SECTION("((dp, sp), mp) on (8,4)") {
    Sharding s = sharding(m, {{"dp", "sp"}, {"mp"}});
    for (std::int64_t r = 0; r < 8; ++r) {
      std::int64_t pair = r / 2;
      Range cols = r % 2 == 0 ? Range{0, 2} : Range{2, 4};
      CHECK(slice_of(m, s, {8, 4}, r) == Ranges{{2 * pair, 2 * pair + 2}, cols});
    }
    CHECK(repeat_num(m, s) == 1);
  }
  SECTION("(mp, (sp, dp)) on (2,4): ranks 0, 4, 2, 6 hold columns 0..3 of row 0") {
    Sharding s = sharding(m, {{"mp"}, {"sp", "dp"}});
    std::vector<std::int64_t> order{0, 4, 2, 6};
    for (std::size_t c = 0; c < 4; ++c) {
      auto col = static_cast<std::int64_t>(c);
      CHECK(slice_of(m, s, {2, 4}, order[c]) == Ranges{{0, 1}, {col, col + 1}});
    }
    CHECK(m.group(0, {1, 0}) == order);
  }
}

TEST_CASE("layout: tensor_map integers count axes from the right", "[shard][layout]") {
  Mesh m = mesh({2, 2, 2}, {"dp", "sp", "mp"});
  CHECK(tensor_map_ints(m, sharding(m, {{"dp"}, {"mp"}})) ==
        std::vector<std::vector<int>>{{2}, {0}});
  CHECK(tensor_map_ints(m, sharding(m, {{"None"}, {"sp", "mp"}})) ==
        std::vector<std::vector<int>>{{-1}, {1, 0}});
  CHECK(format_sharding(m, sharding(m, {{"dp"}, {"sp", "mp"}, {"None"}})) ==
        "(dp, (sp, mp), None)");
  Sharding p = sharding(m, {{"dp"}, {}});
  p.partial = {{2, ReduceOp::sum}, {1, ReduceOp::sum}};
  CHECK(format_sharding(m, p) == "(dp, None) partial(sum: mp, sp)");
}

TEST_CASE("layout: mesh validation messages", "[shard][layout]") {
  CHECK(error_of(Mesh::make({2, 2, 2}, {"dp", "mp"})) ==
        "layout: device_matrix has 3 axes but alias_name has 2");
  CHECK(error_of(Mesh::make({2, 0}, {"dp", "mp"})) == "layout: axis 'mp' has size 0");
  CHECK(error_of(Mesh::make({2, -2}, {"dp", "mp"})) == "layout: axis 'mp' has size -2");
  CHECK(error_of(Mesh::make({2, 2}, {"dp", "dp"})) == "layout: alias 'dp' appears twice");
  CHECK(error_of(Mesh::make({2, 2}, {"dp", "None"})) ==
        "layout: alias 'None' is reserved for an unsplit dim");
  CHECK(error_of(Mesh::make({2, 2}, {"dp", ""})) == "layout: axis 1 has an empty alias");
  CHECK(error_of(Mesh::make({2, 4}, {"dp", "mp"}, {0, 1, 2, 3, 4, 5})) ==
        "layout: rank_list has 6 entries, mesh has 8 devices");
  CHECK(error_of(Mesh::make({2, 2}, {"dp", "mp"}, {0, 1, 1, 3})) ==
        "layout: rank 1 appears twice in rank_list");
  CHECK(error_of(Mesh::make({2, 2}, {"dp", "mp"}, {0, 1, -2, 3})) ==
        "layout: rank_list entry -2 is negative");
  CHECK(error_of(Mesh::make({2, 2, 2}, {"dp", "interleaved_parallel", "mp"})) ==
        "layout: 'interleaved_parallel' must be the last axis");
  auto last = Mesh::make({2, 4, 2}, {"dp", "mp", "interleaved_parallel"});
  REQUIRE_FALSE(last.ok());
  CHECK(last.error().code == hp::Errc::not_implemented);
}

TEST_CASE("layout: tensor_map validation messages", "[shard][layout]") {
  Mesh m = mesh({2, 4}, {"dp", "mp"});
  CHECK(error_of(parse_tensor_map(m, {{"tp"}, {}}, "w")) == "layout: axis 'tp' is not in (dp, mp)");
  CHECK(error_of(parse_tensor_map(m, {{"dp"}, {"dp"}}, "w")) ==
        "layout: axis 'dp' shards both dim 0 and dim 1");
  CHECK(error_of(parse_tensor_map(m, {{"mp"}, {"dp", "mp"}}, "w")) ==
        "layout: axis 'mp' shards both dim 0 and dim 1");
  CHECK(error_of(parse_tensor_map(m, {{"dp", "dp"}, {}}, "w")) ==
        "layout: axis 'dp' appears twice in dim 0");
  CHECK(error_of(parse_tensor_map(m, {{"dp"}, {}, {}}, "w", 2)) ==
        "layout: tensor 'w' has rank 2 but layout has 3 entries");
  auto named = parse_tensor_map(m, {{"tp"}}, "w");
  REQUIRE_FALSE(named.ok());
  CHECK(named.error().where() == "w");

  Sharding s = sharding(m, {{"dp", "mp"}, {}});
  auto st = check_shape(m, s, {5, 4}, "w");
  REQUIRE_FALSE(st.ok());
  CHECK(st.error().message() == "layout: dim 0 of 'w' (5) is not divisible by 8 (dp*mp)");
  auto rank = check_shape(m, s, {8, 4, 2}, "w");
  REQUIRE_FALSE(rank.ok());
  CHECK(rank.error().message() == "layout: tensor 'w' has rank 3 but layout has 2 entries");
  Sharding both = sharding(m, {{"dp"}, {}});
  both.partial = {{0, ReduceOp::sum}};
  CHECK_FALSE(check_sharding(m, both, "w").ok());
}

TEST_CASE("layout: (5,4) on (2,2) is rejected, never floored", "[shard][layout]") {
  Mesh m = mesh({2, 2}, {"x", "y"});
  Sharding s = sharding(m, {{"x"}, {"y"}});
  auto st = check_shape(m, s, {5, 4}, "w");
  REQUIRE_FALSE(st.ok());
  CHECK(st.error().code == hp::Errc::bad_input);
  CHECK(st.error().message() == "layout: dim 0 of 'w' (5) is not divisible by 2 (x)");
  CHECK(check_shape(m, s, {5, 4}, "w", Uneven::chunk).ok());
  // Chunk mode keeps row 4: ranks 2 and 3 hold [3:5).
  CHECK(slice_of(m, s, {5, 4}, 2, Uneven::chunk) == Ranges{{3, 5}, {0, 2}});
}

TEST_CASE("layout: local and global shapes round trip", "[shard][layout]") {
  Mesh m = mesh({2, 2, 2}, {"dp", "sp", "mp"});
  std::vector<std::int64_t> shape{8, 12, 6};
  Sharding s = sharding(m, {{"dp", "sp"}, {"None"}, {"mp"}});
  REQUIRE(check_shape(m, s, shape, "t").ok());
  CHECK(shard_counts(m, s) == std::vector<std::int64_t>{4, 1, 2});
  for (std::int64_t r = 0; r < 8; ++r) {
    std::vector<std::int64_t> local = local_shape(m, s, shape, r);
    CHECK(local == std::vector<std::int64_t>{2, 12, 3});
    std::vector<std::int64_t> counts = shard_counts(m, s), global;
    for (std::size_t d = 0; d < local.size(); ++d) global.push_back(local[d] * counts[d]);
    CHECK(global == shape);
  }
}

TEST_CASE("layout: uneven chunk sizes follow torch.chunk", "[shard][layout]") {
  auto sizes = [](std::int64_t n, std::int64_t parts) {
    std::vector<std::int64_t> out;
    for (std::int64_t k = 0; k < parts; ++k)
      out.push_back(chunk_range(n, parts, k, Uneven::chunk).size());
    return out;
  };
  CHECK(sizes(5, 4) == std::vector<std::int64_t>{2, 2, 1, 0});
  CHECK(sizes(6, 4) == std::vector<std::int64_t>{2, 2, 2, 0});
  CHECK(sizes(10, 4) == std::vector<std::int64_t>{3, 3, 3, 1});
  CHECK(sizes(8, 4) == std::vector<std::int64_t>{2, 2, 2, 2});
  // Through slice_of on a 4-way mesh axis.
  Mesh m = mesh({4}, {"mp"});
  Sharding s = sharding(m, {{"mp"}});
  std::vector<std::int64_t> got;
  for (std::int64_t r = 0; r < 4; ++r) got.push_back(local_shape(m, s, {10}, r, Uneven::chunk)[0]);
  CHECK(got == std::vector<std::int64_t>{3, 3, 3, 1});
  CHECK(slice_of(m, s, {5}, 3, Uneven::chunk) == Ranges{{5, 5}});
}

// manifest.toml: the manifest of a real partition round-trips through format/parse, names every
// rank once with its stage and coordinates, orders group members, and malformed manifests are
// located errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>

#include "shard_test_util.h"

using namespace hp;
using namespace hp::shard;

TEST_CASE("the manifest of an 8-rank partition round-trips and is consistent",
          "[shard][manifest]") {
  auto p = prepare(shard_test::recipe_file("gpt2-dp2-tp2-pp2"));
  REQUIRE(p.ok());
  Manifest m = make_manifest(**p);
  CHECK(m.dp == 2);
  CHECK(m.tp == 2);
  CHECK(m.pp == 2);
  REQUIRE(m.ranks.size() == 8);
  std::set<std::int64_t> ranks;
  for (const auto& r : m.ranks) {
    ranks.insert(r.rank);
    CHECK(r.file == "rank" + std::to_string(r.rank) + ".onnx");
    // Megatron order: tp fastest, then dp, then pp.
    CHECK(r.rank == r.pp * 4 + r.dp * 2 + r.tp);
  }
  CHECK(ranks.size() == 8);
  int tp = 0, dp = 0, pp = 0;
  for (const auto& g : m.groups) {
    if (g.kind == "tp") {
      ++tp;
      CHECK(g.members[1] == g.members[0] + 1);
    }
    if (g.kind == "dp") {
      ++dp;
      CHECK(g.members[1] == g.members[0] + 2);
    }
    if (g.kind == "pp") {
      ++pp;
      CHECK(g.members[1] == g.members[0] + 4);
    }
  }
  CHECK(tp == 4);
  CHECK(dp == 4);
  CHECK(pp == 4);
  CHECK(!m.boundaries.empty());
  CHECK(!m.redistributions.empty());
  CHECK(!m.layouts.empty());
  std::string text = format_manifest(m);
  auto back = parse_manifest(text, "manifest.toml");
  REQUIRE(back.ok());
  CHECK(*back == m);
}

TEST_CASE("every comm node's group_name is a manifest group with the same ordered members",
          "[shard][manifest]") {
  auto p = prepare(shard_test::recipe_file("gpt2-dp2-tp2-pp2"));
  REQUIRE(p.ok());
  Manifest m = make_manifest(**p);
  std::map<std::string, std::vector<std::int64_t>> groups;
  for (const auto& g : m.groups) groups[g.name] = g.members;
  int checked = 0;
  for (const auto& st : (*p)->plan.stages)
    for (std::size_t pos = 0; pos < st.ranks.size(); ++pos) {
      auto part = build_partition((*p)->plan, st.index, static_cast<std::int64_t>(pos));
      REQUIRE(part.ok());
      onnx::ModelProto model;
      REQUIRE(model.ParseFromString(part->onnx));
      for (const auto& n : model.graph().node()) {
        if (n.domain() != "hp" || n.op_type() == "Send" || n.op_type() == "Recv") continue;
        std::string name;
        std::vector<std::int64_t> members;
        for (const auto& a : n.attribute()) {
          if (a.name() == "group_name") name = a.s();
          if (a.name() == "group") members.assign(a.ints().begin(), a.ints().end());
        }
        INFO(n.name() << " group_name " << name);
        REQUIRE(groups.count(name) == 1);
        CHECK(groups[name] == members);
        CHECK(std::find(members.begin(), members.end(), part->rank) != members.end());
        ++checked;
      }
    }
  CHECK(checked > 0);
}

TEST_CASE("malformed manifests are located errors", "[shard][manifest]") {
  auto bad_syntax = parse_manifest("[manifest\n", "m.toml");
  REQUIRE(!bad_syntax.ok());
  CHECK(bad_syntax.error().where().rfind("m.toml:1:", 0) == 0);
  auto missing = parse_manifest("[manifest]\nversion = 1\n", "m.toml");
  REQUIRE(!missing.ok());
  CHECK(missing.error().message().find("missing key") != std::string::npos);
  auto wrong_stage = parse_manifest(
      "[manifest]\nversion = 1\nmodel = \"m\"\nrecipe = \"r\"\ndp = 1\ntp = 1\npp = 1\nweights = "
      "true\n"
      "device_matrix = [1, 1]\nalias_name = [\"dp\", \"tp\"]\n[[ranks]]\nrank = 0\nstage = 3\nfile "
      "= \"rank0.onnx\"\n"
      "dp = 0\ntp = 0\npp = 3\n",
      "m.toml");
  REQUIRE(!wrong_stage.ok());
  CHECK(wrong_stage.error().where() == "m.toml:11:1");
  CHECK(parse_manifest("[manifest]\nversion = 2\n", "m.toml").error().message().find("version 2") !=
        std::string::npos);
}

TEST_CASE("values edited in a real manifest are checked against its own degrees and directory",
          "[shard][manifest]") {
  auto p = prepare(shard_test::recipe_file("gpt2-dp2-tp2-pp2"));
  REQUIRE(p.ok());
  const Manifest good = make_manifest(**p);
  REQUIRE(parse_manifest(format_manifest(good), "m.toml").ok());
  auto refused = [](const Manifest& m, const std::string& why) {
    auto back = parse_manifest(format_manifest(m), "m.toml");
    REQUIRE_FALSE(back.ok());
    INFO(back.error().str());
    CHECK(back.error().str().find(why) != std::string::npos);
  };
  Manifest m = good;
  m.ranks[1].tp = 9;
  refused(m, "rank 1 has coordinates dp=0 tp=9 pp=0 outside dp=2 tp=2 pp=2");
  m = good;
  m.ranks[2].file = "../../etc/passwd";
  refused(m, "rank 2's file '../../etc/passwd' is not a plain file name");
  m = good;
  m.ranks[3].file = "/etc/passwd";
  refused(m, "is not a plain file name");
  m = good;
  m.dp = 65536;
  refused(m, "device_matrix holds 4 devices but dp*tp is 131072");
  m = good;
  m.tp = std::int64_t{1} << 40;
  refused(m, "tp = 1099511627776 (must be 1..1048576)");
  m = good;
  m.ranks[0].rank = 8;
  refused(m, "rank 8 is outside 0..7");
  m = good;
  m.ranks.push_back(m.ranks[0]);
  refused(m, "rank 0 lists stage 0 twice");
  m = good;
  REQUIRE_FALSE(m.inputs.empty());
  m.inputs[0].shape[0] = std::int64_t{1} << 40;
  m.inputs[0].shape.back() = std::int64_t{1} << 40;
  refused(m, "at most 1125899906842624 elements");
  m = good;
  m.groups[0].members.push_back(-1);
  refused(m, "names rank -1");
  // A stage number beyond int reads as -1, not as a wrapped valid stage.
  std::string text = format_manifest(good);
  auto at = text.find("stage = 1\n");
  REQUIRE(at != std::string::npos);
  text.replace(at, 10, "stage = 4294967297\n");
  auto wrapped = parse_manifest(text, "m.toml");
  REQUIRE_FALSE(wrapped.ok());
  CHECK(wrapped.error().str().find("names stage -1") != std::string::npos);
}

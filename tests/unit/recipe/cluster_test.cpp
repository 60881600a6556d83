// Cluster files: every preset loads and validates, scaling to N nodes, round-trip, malformed files.
#include <catch2/catch.hpp>

#include <filesystem>

#include "fixtures.h"
#include "hp/recipe/cluster.h"
#include "hp/recipe/presets.h"

using namespace hp::recipe;
using test::dump;
using test::has;

namespace {

std::vector<std::filesystem::path> source_presets() { return preset_dirs({}, HP_SOURCE_DIR); }

Cluster preset(const std::string& name) {
  auto c = load_cluster_ref(name, {}, source_presets());
  if (!c) FAIL(c.error().str());
  return *c;
}

const char* kSmall = R"([cluster]
version = 1
name = "small"
nodes = 2

[[device_types]]
name = "g"
kind = "gpu"
per_node = 4
memory = "16 GiB"
memory_bandwidth = "1 TB/s"
h2d_bandwidth = "25 GB/s"
d2h_bandwidth = 25e9
peak_flops = { fp32 = 1e13, bf16 = 1e14 }

[[tiers]]
name = "node"
size = 4
bandwidth = "100 GB/s"
latency = "2us"

[[tiers]]
name = "scale-out"
bandwidth = "10 GB/s"
latency = 1e-5
)";

}  // namespace

TEST_CASE("cluster: every preset loads and validates", "[recipe]") {
  auto names = list_presets(source_presets());
  for (const char* want :
       {"local-cpu", "cloudmatrix384", "ascend-910b-8x", "dgx-a100", "dgx-h100", "gh200"})
    CHECK(std::find(names.begin(), names.end(), want) != names.end());
  for (const auto& name : names) {
    INFO(name);
    auto c = load_cluster_ref(name, {}, source_presets());
    if (!c) {
      for (const auto& d : c.error().all()) UNSCOPED_INFO(d.where + ": " + d.message);
    }
    REQUIRE(c.ok());
    CHECK(c->name == name);
    CHECK(c->rank_device_type() != nullptr);
    CHECK(c->ranks() >= 1);
    // Round-trip: the written form reads back to the same struct.
    ClusterDocument doc = parse_cluster(format_cluster(*c), "written.toml");
    INFO(dump(doc.problems));
    REQUIRE(doc.problems.empty());
    CHECK(doc.cluster == *c);
  }
}

TEST_CASE("cluster: peak FLOP/s by core dtype and by any of its names", "[recipe]") {
  PeakFlops f;
  f.fp32 = 1, f.tf32 = 2, f.bf16 = 3, f.fp16 = 4, f.fp8 = 5, f.int8 = 6;
  CHECK(f.of(hp::DType::f32) == 1);
  CHECK(f.of(hp::DType::tf32) == 2);
  CHECK(f.of(hp::DType::bf16) == 3);
  CHECK(f.of(hp::DType::f16) == 4);
  CHECK(f.of(hp::DType::f8) == 5);
  CHECK(f.of(hp::DType::i8) == 6);
  CHECK(f.of(hp::DType::f64) == 0);  // no field: unsupported as far as the cluster file says
  CHECK(f.of(hp::DType::i64) == 0);
  CHECK(f.of("fp32") == 1);
  CHECK(f.of("float32") == 1);
  CHECK(f.of("f32") == 1);
  CHECK(f.of("bfloat16") == 3);
  CHECK(f.of("half") == 4);
  CHECK(f.of("int8") == 6);
  CHECK(f.of("") == 0);
  CHECK(f.of("fp33") == 0);
  CHECK(f.of("BF16") == 0);
}

TEST_CASE("cluster: preset figures", "[recipe]") {
  Cluster h = preset("dgx-h100");
  CHECK(h.ranks_per_node() == 8);
  CHECK(h.rank_device_type()->peak_flops.of("bf16") == 989.4e12);
  CHECK(h.rank_device_type()->memory == 80.0 * (1ull << 30));
  CHECK(h.tiers.front().bandwidth == 450e9);
  CHECK(h.tiers.front().latency == Approx(3e-6));
  Cluster cm = preset("cloudmatrix384");
  CHECK(cm.nodes == 48);
  CHECK(cm.ranks() == 768);  // 384 NPUs x 2 dies
  CHECK(cm.rank_device_type()->peak_flops.bf16 == 376e12);
  CHECK(cm.rank_device_type()->memory_bandwidth == 1.6e12);
  CHECK(cm.tiers[1].bandwidth == 196e9);
  CHECK(cm.tiers[2].size == 768);
  CHECK(preset("gh200").device_types.size() == 2);
  CHECK(preset("local-cpu").ranks() == 1);
}

TEST_CASE("cluster: scaling to N nodes", "[recipe]") {
  Cluster h = preset("dgx-h100");
  auto four = scale_cluster(h, 4);
  REQUIRE(four.ok());
  CHECK(four->nodes == 4);
  CHECK(four->ranks() == 32);
  CHECK(four->tiers == h.tiers);
  CHECK(validate_cluster(*four, SourceMap("x")).empty());
  CHECK(!scale_cluster(h, 0).ok());

  // A cluster whose outermost tier is bounded cannot grow past it.
  Cluster bounded = preset("cloudmatrix384");
  bounded.tiers.pop_back();  // drop scale-out: only the 768-rank supernode remains
  CHECK(scale_cluster(bounded, 48).ok());
  auto too_many = scale_cluster(bounded, 49);
  REQUIRE(!too_many.ok());
  CHECK(too_many.error().message() ==
        "cluster 'cloudmatrix384' spans at most 48 nodes (tier 'supernode' has 768 ranks), 49 "
        "requested");
}

TEST_CASE("cluster: numbers and unit strings", "[recipe]") {
  ClusterDocument doc = parse_cluster(kSmall, "small.toml");
  INFO(dump(doc.problems));
  REQUIRE(doc.problems.empty());
  const Cluster& c = doc.cluster;
  CHECK(c.rank_device == "g");  // implied: the only device type
  CHECK(c.ranks() == 8);
  CHECK(c.device_types[0].memory == 16.0 * (1ull << 30));
  CHECK(c.device_types[0].memory_bandwidth == 1e12);
  CHECK(c.device_types[0].d2h_bandwidth == 25e9);
  CHECK(c.device_types[0].peak_flops.tf32 == 0);
  CHECK(c.tiers[0].latency == Approx(2e-6));
  CHECK(c.tiers[1].size == 0);
}

TEST_CASE("cluster: tier latencies follow core's duration rule", "[recipe]") {
  for (auto [text, want] : {std::pair{"\"500ns\"", 5e-7},
                            {"\"0\"", 0.0},
                            {"\"1.5 ms\"", 1.5e-3},
                            {"\"+3e-6\"", 3e-6},
                            {"\"3e-6\"", 3e-6},
                            {"\"2\xC2\xB5s\"", 2e-6}}) {
    std::string t = kSmall;
    t.replace(t.find("latency = \"2us\""), 16, std::string("latency = ") + text);
    ClusterDocument doc = parse_cluster(t, "c.toml");
    INFO(text << "\n" << dump(doc.problems));
    REQUIRE(doc.problems.empty());
    CHECK(doc.cluster.tiers[0].latency == Approx(want).margin(1e-18));
  }
  for (const char* bad : {"\"-2us\"", "\"2 min\"", "\"inf\"", "\"1 5us\"", "\"us\""}) {
    std::string t = kSmall;
    t.replace(t.find("latency = \"2us\""), 16, std::string("latency = ") + bad);
    ClusterDocument doc = parse_cluster(t, "c.toml");
    INFO(bad << "\n" << dump(doc.problems));
    CHECK(has(doc.problems, "c.toml:20:11", "'tiers[0].latency' is not a duration"));
  }
}

TEST_CASE("cluster: malformed files report every problem with locations", "[recipe]") {
  std::string text = kSmall;
  auto replace = [&](const std::string& from, const std::string& to) {
    text.replace(text.find(from), from.size(), to);
  };
  replace("kind = \"gpu\"", "kind = \"gpx\"");
  replace("per_node = 4", "per_nod = 4");
  replace("bandwidth = \"100 GB/s\"", "bandwidth = \"fast\"");
  replace("size = 4", "size = 3");
  ClusterDocument doc = parse_cluster(text, "c.toml");
  INFO(dump(doc.problems));
  CHECK(
      has(doc.problems, "c.toml:8:8", "'device_types[0].kind' must be cpu, gpu or npu, got 'gpx'"));
  CHECK(has(doc.problems, "c.toml:9:1", "unknown key 'per_nod' in [device_types[0]]"));
  CHECK(has(doc.problems, "c.toml:6:1", "missing required key 'device_types[0].per_node'"));
  CHECK(has(doc.problems, "c.toml:19:13", "'tiers[0].bandwidth' is not a bandwidth: 'fast'"));
}

TEST_CASE("cluster: tier structure is checked", "[recipe]") {
  std::string text = kSmall;
  text.replace(text.find("size = 4"), 8, "size = 3");
  ClusterDocument doc = parse_cluster(text, "c.toml");
  INFO(dump(doc.problems));
  CHECK(
      has(doc.problems, "c.toml:18:8", "tier 'node' (size 3) does not nest with nodes of 4 ranks"));

  doc = parse_cluster(
      std::string(kSmall) + "\n[[tiers]]\nname = \"x\"\nsize = 2\nbandwidth = 1\nlatency = 0\n",
      "c.toml");
  INFO(dump(doc.problems));
  CHECK(has(doc.problems, "c.toml:", "tier 'scale-out' has no size but is not the outermost tier"));
  CHECK(has(doc.problems, "c.toml:29:8",
            "the outermost tier 'x' spans 2 ranks but the cluster has 8 (2 nodes x 4)"));

  std::string shrinking = kSmall;
  shrinking.replace(shrinking.find("name = \"scale-out\""), 18, "name = \"rack\"\nsize = 2");
  doc = parse_cluster(shrinking, "c.toml");
  INFO(dump(doc.problems));
  CHECK(has(doc.problems,
            "c.toml:", "tier 'rack' (size 2) must be a larger multiple of tier 'node' (size 4)"));
}

TEST_CASE("cluster: unsupported version and syntax errors", "[recipe]") {
  ClusterDocument doc = parse_cluster("[cluster]\nversion = 3\n", "c.toml");
  REQUIRE(doc.problems.size() == 1);
  CHECK(doc.problems[0].where == "c.toml:2:11");
  CHECK(doc.problems[0].message == "unsupported cluster version 3");
  doc = parse_cluster("[cluster\nversion = 1\n", "c.toml");
  REQUIRE(doc.problems.size() == 1);
  CHECK(doc.problems[0].where.rfind("c.toml:1:", 0) == 0);
}

TEST_CASE("cluster: preset lookup by name and by path", "[recipe]") {
  auto dirs = source_presets();
  REQUIRE(!dirs.empty());
  CHECK(looks_like_path("clusters/x.toml"));
  CHECK(looks_like_path("x.toml"));
  CHECK(!looks_like_path("dgx-h100"));
  auto p = find_cluster("dgx-h100", {}, dirs);
  REQUIRE(p.ok());
  CHECK(p->filename() == "dgx-h100.toml");
  auto by_path =
      find_cluster("clusters/dgx-h100.toml", std::filesystem::path(HP_SOURCE_DIR) / "recipes", {});
  CHECK(by_path.ok());
  auto typo = find_cluster("dgx-h10", {}, dirs);
  REQUIRE(!typo.ok());
  CHECK(typo.error().message() == "unknown cluster preset 'dgx-h10'");
  CHECK(typo.error().what.hint == "did you mean 'dgx-h100'?");
  auto none = find_cluster("tpu-v5", {}, dirs);
  REQUIRE(!none.ok());
  CHECK(none.error().what.hint.find("presets: ") == 0);
}

TEST_CASE("cluster: non-finite and absurd figures are refused", "[recipe]") {
  std::string text = kSmall;
  text.replace(text.find("bandwidth = \"100 GB/s\""), 22, "bandwidth = inf");
  text.replace(text.find("latency = 1e-5"), 14, "latency = nan");
  text.replace(text.find("nodes = 2"), 9, "nodes = 9223372036854775807");
  ClusterDocument doc = parse_cluster(text, "c.toml");
  INFO(dump(doc.problems));
  CHECK(has(doc.problems, "c.toml:19:", "'tiers[0].bandwidth' must be a finite, positive number"));
  CHECK(
      has(doc.problems, "c.toml:25:", "'tiers[1].latency' must be a finite, non-negative number"));
  CHECK(has(doc.problems, "c.toml:4:", "'cluster.nodes' must be 1..1048576"));
  CHECK(!scale_cluster(parse_cluster(kSmall, "c").cluster, std::int64_t{1} << 40).ok());
}

TEST_CASE("cluster: a measured sustained GEMM rate is optional, round-trips and is checked",
          "[recipe]") {
  std::string text = kSmall;
  text.replace(text.find("peak_flops = { fp32 = 1e13, bf16 = 1e14 }"), 41,
               "peak_flops = { fp32 = 1e13, bf16 = 1e14 }\nsustained_flops = { fp32 = 7.5e12 }");
  ClusterDocument doc = parse_cluster(text, "c.toml");
  INFO(dump(doc.problems));
  REQUIRE(doc.problems.empty());
  CHECK(doc.cluster.device_types[0].sustained_flops.of("fp32") == 7.5e12);
  CHECK(doc.cluster.device_types[0].sustained_flops.of("bf16") == 0);
  ClusterDocument back = parse_cluster(format_cluster(doc.cluster), "written.toml");
  REQUIRE(back.problems.empty());
  CHECK(back.cluster == doc.cluster);
  // Without it (every preset) nothing is written for it.
  CHECK(format_cluster(parse_cluster(kSmall, "c").cluster).find("sustained") == std::string::npos);

  for (const char* bad : {"{ fp32 = -1.0 }", "{ fp32 = inf }", "{ fp33 = 1e12 }", "\"fast\""}) {
    std::string t = kSmall;
    t.replace(t.find("peak_flops = { fp32 = 1e13, bf16 = 1e14 }"), 41,
              std::string("peak_flops = { fp32 = 1e13 }\nsustained_flops = ") + bad);
    ClusterDocument d = parse_cluster(t, "c.toml");
    INFO(bad << "\n" << dump(d.problems));
    CHECK(!d.problems.empty());
    CHECK(has(d.problems, "c.toml:", "sustained_flops"));
  }
}

// The manifest's view of the graph's inputs and outputs and of micro-batching: what the runtime
// needs to feed the ranks and to reassemble the outputs (hp/job/sharded.h).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "shard_test_util.h"

using namespace hp;
using namespace hp::shard;
using namespace shard_test;

TEST_CASE("a pipeline with micro-batches specialises the partitions to one micro-batch",
          "[shard][manifest]") {
  auto p = prepare(recipe_file("gpt2-dp2-pp2-mb2"));
  REQUIRE(p.ok());
  Manifest m = make_manifest(**p);
  CHECK(m.micro_batches == 2);
  CHECK(m.dims.at("batch") == 2);  // 4 rows / 2 micro-batches; dp splits it further per rank
  CHECK(m.dims.at("seq") == 12);
  REQUIRE(m.inputs.size() == 1);
  CHECK(m.inputs[0].shape == std::vector<std::int64_t>{2, 12});
  CHECK(m.inputs[0].tensor_map[0] == std::vector<std::string>{"dp"});
  CHECK(m.inputs[0].batched);
  CHECK(m.outputs[0].batched);
  REQUIRE(m.outputs.size() == 1);
  CHECK(m.outputs[0].shape[0] == 2);
  CHECK(m.outputs[0].partial.empty());
  CHECK(m.outputs[0].origin == "stage 1");
  auto back = parse_manifest(format_manifest(m), "m.toml");
  REQUIRE(back.ok());
  CHECK(*back == m);
}

TEST_CASE("micro-batches that do not divide the batch are a located error", "[shard][manifest]") {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("hp_shard_mb_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "r.toml")
      << "[recipe]\nversion = 1\nname = \"x\"\nmodel = \"" << HP_SOURCE_DIR
      << "/tests/data/models/tiny-gpt2.onnx\"\ncluster = \"local-cpu\"\n[model]\n"
         "dims = { batch = 3, seq = 12 }\n[parallel]\ndp = 1\ntp = 1\npp = 2\n"
         "micro_batches = 2\n";
  auto p = prepare(dir / "r.toml");
  fs::remove_all(dir);
  REQUIRE_FALSE(p.ok());
  CHECK(p.error().str().find("micro_batches") != std::string::npos);
  CHECK(p.error().str().find("r.toml:") != std::string::npos);
}

TEST_CASE("interleaved stages give every rank one partition per model chunk", "[shard][manifest]") {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("hp_shard_il_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "r.toml")
      << "[recipe]\nversion = 1\nname = \"il\"\nmodel = \"" << HP_SOURCE_DIR
      << "/tests/data/models/tiny-gpt2.onnx\"\ncluster = \"local-cpu\"\nnodes = 2\n"
         "[model]\ndims = { batch = 2, seq = 12 }\n[parallel]\ndp = 1\ntp = 1\npp = 2\n"
         "micro_batches = 2\nschedule = \"interleaved\"\nvirtual_stages = 2\n";
  auto p = prepare(dir / "r.toml");
  REQUIRE(p.ok());
  Manifest m = make_manifest(**p);
  CHECK(m.virtual_stages == 2);
  REQUIRE(m.ranks.size() == 4);  // (rank, chunk) entries
  CHECK(m.ranks[0].rank == 0);
  CHECK(m.ranks[0].stage == 0);
  CHECK(m.ranks[0].file == "rank0.c0.onnx");
  CHECK(m.ranks[1].rank == 0);
  CHECK(m.ranks[1].stage == 2);
  CHECK(m.ranks[1].file == "rank0.c1.onnx");
  CHECK(m.stages.size() == 4);
  CHECK(m.stages[2].ranks == m.stages[0].ranks);  // virtual stage 2 is chunk 1 of stage 0's ranks
  auto back = parse_manifest(format_manifest(m), "m.toml");
  INFO((back.ok() ? std::string() : back.error().str()));
  REQUIRE(back.ok());
  CHECK(*back == m);
  auto w = write_partitions(**p, dir / "parts");
  REQUIRE(w.ok());
  CHECK(fs::exists(dir / "parts" / "rank1.c1.onnx"));
  fs::remove_all(dir);
}

TEST_CASE("malformed micro-batch, chunk and input entries of a manifest are located errors",
          "[shard][manifest]") {
  const std::string head =
      "[manifest]\nversion = 1\nmodel = \"m.onnx\"\nrecipe = \"r.toml\"\ndp = 1\ntp = 1\npp = 1\n"
      "weights = true\ndevice_matrix = [1, 1]\nalias_name = [\"dp\", \"tp\"]\n";
  auto bad_mb = parse_manifest(head + "micro_batches = 0\n", "m.toml");
  REQUIRE_FALSE(bad_mb.ok());
  CHECK(bad_mb.error().str().find("micro_batches = 0") != std::string::npos);
  CHECK(bad_mb.error().str().find("m.toml:") != std::string::npos);
  auto bad_v = parse_manifest(head + "virtual_stages = -1\n", "m.toml");
  REQUIRE_FALSE(bad_v.ok());
  CHECK(bad_v.error().str().find("virtual_stages = -1") != std::string::npos);
  auto bad_in =
      parse_manifest(head +
                         "\n[[inputs]]\ntensor = \"x\"\nshape = [2, 3]\ntensor_map = [[\"dp\"]]\n"
                         "partial = []\n",
                     "m.toml");
  REQUIRE_FALSE(bad_in.ok());
  CHECK(bad_in.error().str().find("'x' has 2 dims but a tensor_map of 1") != std::string::npos);
  CHECK(bad_in.error().str().find("m.toml:") != std::string::npos);
}

TEST_CASE("format_manifest writes the documented layout byte for byte and reads back",
          "[shard][manifest]") {
  // The text is what the manifest writer produced before it shared hp/recipe/toml_writer.h.
  Manifest m;
  m.model = "m \"x\".onnx";
  m.recipe = "dir\\r.toml";
  m.dp = 2, m.tp = 2, m.pp = 2;
  m.weights = false;
  m.micro_batches = 4;
  m.virtual_stages = 2;
  m.device_matrix = {2, 2};
  m.alias_name = {"dp", "tp"};
  m.dims = {{"batch", 8}, {"seq", 12}, {"odd key", 1}};
  m.ranks = {{0, 0, "rank0.onnx", 0, 0, 0}, {1, 1, "rank1.c1.onnx", 1, 0, 1}};
  m.groups = {{"tp.s0.d0", "tp", {0, 1}}, {"dp", "dp", {}}};
  m.stages = {{0, {0, 1}, {0, 1}}, {1, {}, {2, 3}}};
  m.boundaries = {{"h\"1", 0, 1, 7}};
  m.inputs = {{"ids", {8, 12}, {{"dp"}, {}}, {}, "stage 0", true}};
  m.outputs = {{"logits", {8, 12, 50}, {{"dp"}, {}, {"tp", "dp"}}, {}, "stage 1", false}};
  m.layouts = {{"w", {4, 4}, {{}, {"tp"}}, {"dp"}, "recipe (r.toml:12:1)", false}};
  m.redistributions = {{"x", "", "S(0)", "R", {"all_gather tp", "slice \"dp\""}}};
  const std::string want =
      R"TOML(# Written by hp shard: the per-rank partitions of this directory (see hp-shard(1)).
[manifest]
version = 1
model = "m \"x\".onnx"
recipe = "dir\\r.toml"
dp = 2
tp = 2
pp = 2
weights = false
micro_batches = 4
virtual_stages = 2
device_matrix = [2, 2]
alias_name = ["dp", "tp"]
dims = { "batch" = 8, "odd key" = 1, "seq" = 12 }

[[ranks]]
rank = 0
stage = 0
file = "rank0.onnx"
dp = 0
tp = 0
pp = 0

[[ranks]]
rank = 1
stage = 1
file = "rank1.c1.onnx"
dp = 1
tp = 0
pp = 1

[[groups]]
name = "tp.s0.d0"
kind = "tp"
members = [0, 1]

[[groups]]
name = "dp"
kind = "dp"
members = []

[[stages]]
index = 0
layers = [0, 1]
ranks = [0, 1]

[[stages]]
index = 1
layers = []
ranks = [2, 3]

[[boundaries]]
tensor = "h\"1"
from_stage = 0
to_stage = 1
tag = 7

[[inputs]]
tensor = "ids"
shape = [8, 12]
tensor_map = [["dp"], []]
partial = []
origin = "stage 0"
batched = true

[[outputs]]
tensor = "logits"
shape = [8, 12, 50]
tensor_map = [["dp"], [], ["tp", "dp"]]
partial = []
origin = "stage 1"

[[layouts]]
tensor = "w"
shape = [4, 4]
tensor_map = [[], ["tp"]]
partial = ["dp"]
origin = "recipe (r.toml:12:1)"

[[redistributions]]
tensor = "x"
consumer = ""
from = "S(0)"
to = "R"
steps = ["all_gather tp", "slice \"dp\""]
)TOML";
  CHECK(format_manifest(m) == want);
  auto back = parse_manifest(want, "m.toml");
  REQUIRE(back.ok());
  CHECK(*back == m);
  // Control characters are escaped (the manifest's own copy wrote DEL raw, which TOML forbids).
  m.recipe = std::string("r\t\n\r\x01\x7f.toml");
  m.dims.clear();
  const std::string text = format_manifest(m);
  CHECK(text.find("recipe = \"r\\t\\n\\r\\u0001\\u007F.toml\"\n") != std::string::npos);
  CHECK(text.find("dims = {}\n") != std::string::npos);
  back = parse_manifest(text, "m.toml");
  REQUIRE(back.ok());
  CHECK(*back == m);
}

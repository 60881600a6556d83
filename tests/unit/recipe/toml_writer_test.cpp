// hp/recipe/toml_writer.h: value escaping, arrays, inline tables and the table layout of the one
// TOML writer behind recipes, clusters and shard manifests. Every string and key hp writes must
// read back (TOML++) as the same bytes, control characters included; the recipe and cluster texts
// below are what the writers produced before they shared this writer, byte for byte.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>

#include <toml++/toml.h>

#include "fixtures.h"
#include "hp/recipe/cluster.h"
#include "hp/recipe/recipe.h"
#include "hp/recipe/toml_writer.h"

using namespace hp::recipe;

TEST_CASE("toml writer: strings escape quotes, backslashes and control characters",
          "[recipe][toml]") {
  CHECK(toml_string("") == "\"\"");
  CHECK(toml_string("plain text") == "\"plain text\"");
  CHECK(toml_string("a \"q\" \\ b") == "\"a \\\"q\\\" \\\\ b\"");
  CHECK(toml_string("l1\nl2\tx\ry") == "\"l1\\nl2\\tx\\ry\"");
  CHECK(toml_string(std::string("\x01\x1f\x7f", 3)) == "\"\\u0001\\u001F\\u007F\"");
  CHECK(toml_string(std::string("nul\0in", 6)) == "\"nul\\u0000in\"");
  CHECK(toml_string("caf\xC3\xA9") == "\"caf\xC3\xA9\"");  // UTF-8 as is
}

TEST_CASE("toml writer: every ASCII byte in a string or key reads back unchanged",
          "[recipe][toml]") {
  std::string all;
  for (int c = 0; c < 0x80; ++c) all += static_cast<char>(c);
  TomlWriter w;
  w.table("t")
      .string("s", all)
      .string(all, "key")
      .value("k", toml_inline_table({{all, toml_string(all)}}));
  w.table("u", all).integer("n", 1);
  toml::table doc;
  REQUIRE_NOTHROW(doc = toml::parse(w.str()));
  CHECK(doc["t"]["s"].value<std::string>() == all);
  CHECK(doc["t"][all].value<std::string>() == std::string("key"));
  CHECK(doc["t"]["k"][all].value<std::string>() == all);
  CHECK(doc["u"][all]["n"].value<std::int64_t>() == 1);
}

TEST_CASE("toml writer: keys are bare when they can be, else quoted", "[recipe][toml]") {
  CHECK(toml_key("batch") == "batch");
  CHECK(toml_key("ok_key-1") == "ok_key-1");
  CHECK(toml_key("NCCL_DEBUG") == "NCCL_DEBUG");
  CHECK(toml_key("") == "\"\"");
  CHECK(toml_key("my dim") == "\"my dim\"");
  CHECK(toml_key("h.*.weight") == "\"h.*.weight\"");
  CHECK(toml_key("a\"b") == "\"a\\\"b\"");
  CHECK(toml_key("new\nline") == "\"new\\nline\"");
  CHECK(toml_key("caf\xC3\xA9") == "\"caf\xC3\xA9\"");
}

TEST_CASE("toml writer: numbers, booleans and arrays", "[recipe][toml]") {
  CHECK(toml_float(1) == "1.0");
  CHECK(toml_float(0) == "0.0");
  CHECK(toml_float(-0.0) == "-0.0");
  CHECK(toml_float(0.15) == "0.15");
  CHECK(toml_float(1e-6) == "1e-06");
  CHECK(toml_float(25.1e9) == "25100000000.0");
  CHECK(toml_float(std::numeric_limits<double>::infinity()) == "inf");
  CHECK(toml_float(-std::numeric_limits<double>::infinity()) == "-inf");
  CHECK(toml_float(std::nan("")) == "nan");
  for (double v : {0.1, 1.0 / 3, 4.9999999999999996e-05, 1e300, 5e-324}) {
    auto doc = toml::parse("x = " + toml_float(v));
    CHECK(doc["x"].value<double>() == v);
  }
  CHECK(toml_int(-42) == "-42");
  CHECK(toml_bool(true) == "true");
  CHECK(toml_bool(false) == "false");
  CHECK(toml_int_array({}) == "[]");
  CHECK(toml_int_array({1, -2, 3}) == "[1, -2, 3]");
  CHECK(toml_string_array({}) == "[]");
  CHECK(toml_string_array({"a", "b\"c"}) == "[\"a\", \"b\\\"c\"]");
  CHECK(toml_array({toml_string("None"), toml_string_array({"sp", "dp"})}) ==
        "[\"None\", [\"sp\", \"dp\"]]");
  CHECK(toml_array({}) == "[]");
}

TEST_CASE("toml writer: inline tables", "[recipe][toml]") {
  CHECK(toml_inline_table({}) == "{}");
  CHECK(toml_inline_table({}, TomlKeys::quoted) == "{}");
  CHECK(toml_inline_table({{"batch", toml_int(8)}, {"my dim", toml_int(2)}}) ==
        "{ batch = 8, \"my dim\" = 2 }");
  CHECK(toml_inline_table({{"batch", toml_int(8)}, {"seq", toml_int(12)}}, TomlKeys::quoted) ==
        "{ \"batch\" = 8, \"seq\" = 12 }");
}

TEST_CASE("toml writer: headers, blank lines and comments", "[recipe][toml]") {
  TomlWriter w;
  w.comment("first\nsecond");
  w.table("a").integer("x", 1);
  w.table("layouts", "h.*.weight").string("y", "z");
  w.array_table("items").boolean("on", true);
  w.array_table("items").number("f", 0.5);
  CHECK(w.str() ==
        "# first\n# second\n[a]\nx = 1\n\n[layouts.\"h.*.weight\"]\ny = \"z\"\n\n[[items]]\non = "
        "true\n\n[[items]]\nf = 0.5\n");
  TomlWriter root;  // keys before any header, then a header: separated by a blank line
  root.integer("top", 1).table("t");
  CHECK(root.str() == "top = 1\n\n[t]\n");
  TomlWriter bare;  // nothing before the first header: no blank line
  bare.table("t");
  CHECK(std::move(bare).str() == "[t]\n");
}

TEST_CASE("toml writer: format_recipe writes the documented layout byte for byte",
          "[recipe][toml]") {
  const char* want = R"TOML(# hp recipe (see hp-recipe(5)); paths are relative to this file
[recipe]
version = 1
name = "gpt-2x2x2"
model = "../models/gpt.onnx"
cluster = "dgx-h100"
nodes = 1

[model]
dims = { batch = 8, seq = 2048 }

[parallel]
dp = 2
tp = 2
pp = 2
optimizer_shard = "parameters"
shard_group = 1
bucket_mb = 25.0
micro_batch_size = 4
micro_batches = 8
schedule = "interleaved"
virtual_stages = 2
sequence_parallel = true
expert_parallel = 2
expert_dispatch = "gather"
zero3_gather = "per-step"

[[stages]]
index = 0
layers = "0-2"
recompute = "selective"
ranks = "0-3"

[[stages]]
index = 1
layers = "3-5"
recompute = "none"
recompute_layers = { selective = "3", full = "4-5" }
ranks = "4-7"

[[stages]]
index = 2
layers = "6-8"
recompute = "none"
ranks = "0-3"

[[stages]]
index = 3
layers = "9-11"
recompute = "full"
ranks = "4-7"

[layouts."h.*.attn.c_attn.weight"]
device_matrix = [2, 2]
alias_name = ["dp", "tp"]
tensor_map = ["None", "tp"]

[layouts."wte.weight"]
device_matrix = [2, 2, 2]
alias_name = ["dp", "sp", "mp"]
tensor_map = ["mp", ["sp", "dp"]]
rank_list = [7, 6, 5, 4, 3, 2, 1, 0]

[[groups]]
name = "train"
ranks = "0-7"
module = "stage"
backend = "cuda"
inputs = ["input_ids"]
outputs = ["logits"]
env = { NCCL_DEBUG = "WARN", OMP_NUM_THREADS = "1" }

[[groups]]
name = "sched"
ranks = "8"
module = "scheduler"
backend = "cpu"
inputs = []
outputs = []
env = {}

[offload]
enabled = true
targets = ["optimizer", "activations"]
h2d_bandwidth = 25100000000.0
h2d_bandwidth_source = "measured:cpu-plugin 2026-11-20"
d2h_bandwidth = 24000000000.0
d2h_bandwidth_source = "table"
host_memory = 549755813888.0
host_memory_source = "user"
margin = 0.15
prefetch_lookahead = 2
device_budget = 0.0

[workload]
mode = "train"
dtype = "bf16"
optimizer = "adamw"
global_batch = 64
seq = 2048
command = "hp plan '../models/my gpt.onnx' --cluster dgx-h100 --global-batch 64"

[train]
loss = "mse"
logits = "logits"
labels = "targets"
optimizer = "sgd"
lr = 0.05
betas = [0.8, 0.95]
eps = 1e-06
weight_decay = 0.0
momentum = 0.9
clip_norm = 1.0
lr_schedule = "cosine"
warmup_steps = 10
min_lr = 0.0001
steps = 500
seed = 7
frozen = ["rope.*", "mask"]
)TOML";
  CHECK(format_recipe(test::full_recipe()) == want);
}

TEST_CASE("toml writer: format_cluster writes the documented layout byte for byte",
          "[recipe][toml]") {
  const char* want =
      R"TOML(# hp cluster description (see hp-recipe(5)); bandwidths in bytes/s, latencies in s
[cluster]
version = 1
name = "local-cpu"
description = "the local CPU as one rank (conservative table figures; hp devices / offload-profile --measure give real ones)"
nodes = 1
rank_device = "cpu"

[[device_types]]
name = "cpu"
kind = "cpu"
per_node = 1
memory = 8589934592.0
memory_bandwidth = 10000000000.0
h2d_bandwidth = 10000000000.0
d2h_bandwidth = 10000000000.0
peak_flops = { fp32 = 100000000000.0, tf32 = 0.0, bf16 = 0.0, fp16 = 0.0, fp8 = 0.0, int8 = 0.0 }

[[tiers]]
name = "node"
size = 1
bandwidth = 10000000000.0
latency = 1e-06

[[tiers]]
name = "scale-out"
bandwidth = 1250000000.0
latency = 4.9999999999999996e-05
)TOML";
  ClusterDocument doc = parse_cluster(want, "local-cpu.toml");  // the local-cpu preset, as written
  INFO(test::dump(doc.problems));
  REQUIRE(doc.problems.empty());
  CHECK(format_cluster(doc.cluster) == want);
}

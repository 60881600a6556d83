// Malformed recipes: each mistake is reported with file:line:column and a hint, and several
// mistakes are all reported by one parse.
#include <catch2/catch.hpp>

#include <limits>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "fixtures.h"
#include "hp/recipe/recipe.h"

using namespace hp::recipe;
using test::dump;
using test::has;

namespace {

const char* kHead = R"([recipe]
version = 1
name = "t"
model = "m.onnx"
cluster = "local-cpu"
)";

RecipeDocument parse_with(const std::string& rest) {
  return parse_recipe(kHead + rest, "recipe.toml");
}

}  // namespace

TEST_CASE("recipe: a TOML syntax error is located", "[recipe]") {
  RecipeDocument doc = parse_with("[parallel]\ndp = 1\ntp = = 2\n");
  INFO(dump(doc.problems));
  REQUIRE(doc.problems.size() == 1);
  CHECK(!doc.syntax_ok);
  CHECK(doc.problems[0].where.rfind("recipe.toml:8:", 0) == 0);
  CHECK(doc.problems[0].message.find("TOML syntax error") != std::string::npos);
}

TEST_CASE("recipe: a wrong type names the key, the line and the column", "[recipe]") {
  // Line 7 is "tp = ..." and the value starts at column 6.
  RecipeDocument doc = parse_with("[parallel]\ntp = \"four\"\ndp = 1\npp = 1\n");
  INFO(dump(doc.problems));
  REQUIRE(doc.problems.size() == 1);
  CHECK(doc.problems[0].where == "recipe.toml:7:6");
  CHECK(doc.problems[0].message == "'parallel.tp' must be an integer, got a string");
  CHECK(!doc.problems[0].hint.empty());
}

TEST_CASE("recipe: an unknown key gets a did-you-mean hint", "[recipe]") {
  RecipeDocument doc = parse_with("[parallel]\ndp = 1\ntp = 1\npp = 1\nmicro_batchs = 4\n");
  INFO(dump(doc.problems));
  REQUIRE(doc.problems.size() == 1);
  CHECK(doc.problems[0].where == "recipe.toml:10:1");
  CHECK(doc.problems[0].message == "unknown key 'micro_batchs' in [parallel]");
  CHECK(doc.problems[0].hint == "did you mean 'micro_batches'?");
}

TEST_CASE("recipe: an unknown section is reported too", "[recipe]") {
  RecipeDocument doc = parse_with("[parallel]\ndp = 1\ntp = 1\npp = 1\n[paralel]\nx = 1\n");
  INFO(dump(doc.problems));
  CHECK(has(doc.problems, "recipe.toml:10:", "unknown key 'paralel' at the top level"));
}

TEST_CASE("recipe: missing required keys are reported at their table", "[recipe]") {
  RecipeDocument doc =
      parse_recipe("[recipe]\nversion = 1\nname = \"t\"\n[parallel]\ndp = 1\n", "recipe.toml");
  INFO(dump(doc.problems));
  CHECK(has(doc.problems, "recipe.toml:1:1", "missing required key 'recipe.model'"));
  CHECK(has(doc.problems, "recipe.toml:1:1", "missing required key 'recipe.cluster'"));
  CHECK(has(doc.problems, "recipe.toml:4:1", "missing required key 'parallel.tp'"));
  CHECK(has(doc.problems, "recipe.toml:4:1", "missing required key 'parallel.pp'"));
}

TEST_CASE("recipe: an unsupported version stops with a hint", "[recipe]") {
  RecipeDocument doc = parse_recipe("[recipe]\nversion = 2\nfuture_key = 1\n", "recipe.toml");
  INFO(dump(doc.problems));
  REQUIRE(doc.problems.size() == 1);
  CHECK(doc.problems[0].where == "recipe.toml:2:11");
  CHECK(doc.problems[0].message == "unsupported recipe version 2");
  CHECK(doc.problems[0].hint.find("version 1") != std::string::npos);
}

TEST_CASE("recipe: out-of-range values", "[recipe]") {
  RecipeDocument doc = parse_with(R"([parallel]
dp = 0
tp = 1
pp = 3
micro_batches = 4
schedule = "interleaved"
virtual_stages = 2
optimizer_shard = 5
sequence_parallel = true
)");
  INFO(dump(doc.problems));
  CHECK(has(doc.problems, "recipe.toml:7:6", "'parallel.dp' must be at least 1, got 0"));
  CHECK(has(doc.problems, "recipe.toml:10:17",
            "must be a multiple of pp (3) for the interleaved schedule"));
  CHECK(has(doc.problems, "recipe.toml:13:19", "'parallel.optimizer_shard' must be 0..3, got 5"));
  CHECK(has(doc.problems, "recipe.toml:14:21", "sequence parallelism needs tp > 1"));
}

TEST_CASE("recipe: an HSDP shard_group must divide dp and shard something", "[recipe]") {
  RecipeDocument bad = parse_with(
      "[parallel]\ndp = 4\ntp = 1\npp = 1\noptimizer_shard = 2\n"
      "shard_group = 3\n");
  INFO(dump(bad.problems));
  CHECK(has(bad.problems, "recipe.toml:11:15", "'parallel.shard_group' (3) must divide dp (4)"));
  RecipeDocument none = parse_with("[parallel]\ndp = 4\ntp = 1\npp = 1\nshard_group = 2\n");
  INFO(dump(none.problems));
  CHECK(has(none.problems, "recipe.toml:10:15", "nothing is sharded"));
  RecipeDocument negative =
      parse_with("[parallel]\ndp = 4\ntp = 1\npp = 1\noptimizer_shard = 1\nshard_group = -1\n");
  CHECK(has(negative.problems, "recipe.toml:11:15", "'parallel.shard_group' must be 0"));
  RecipeDocument text =
      parse_with("[parallel]\ndp = 4\ntp = 1\npp = 1\noptimizer_shard = 1\nshard_group = \"2\"\n");
  CHECK(!text.problems.empty());
  RecipeDocument ok =
      parse_with("[parallel]\ndp = 4\ntp = 1\npp = 1\noptimizer_shard = 3\nshard_group = 2\n");
  INFO(dump(ok.problems));
  CHECK(ok.problems.empty());
  CHECK(ok.recipe.parallel.shard_group == 2);
  // Written back only when set, and read back equal.
  const std::string text_out = format_recipe(ok.recipe);
  CHECK(text_out.find("shard_group = 2") != std::string::npos);
  CHECK(parse_recipe(text_out, "again.toml").recipe.parallel == ok.recipe.parallel);
  ok.recipe.parallel.shard_group = 0;
  CHECK(format_recipe(ok.recipe).find("shard_group") == std::string::npos);
}

TEST_CASE("recipe: bucket_mb is a positive size in MiB, written back only when set", "[recipe]") {
  for (const char* bad : {"0", "-2", "nan", "2e9"}) {
    RecipeDocument doc =
        parse_with(std::string("[parallel]\ndp = 2\ntp = 1\npp = 1\nbucket_mb = ") + bad + "\n");
    INFO(bad << "\n" << dump(doc.problems));
    CHECK(has(doc.problems, "recipe.toml:10:13", "'parallel.bucket_mb' must be more than 0 MiB"));
  }
  RecipeDocument text = parse_with("[parallel]\ndp = 2\ntp = 1\npp = 1\nbucket_mb = \"4\"\n");
  CHECK(!text.problems.empty());
  RecipeDocument ok = parse_with("[parallel]\ndp = 2\ntp = 1\npp = 1\nbucket_mb = 0.5\n");
  INFO(dump(ok.problems));
  CHECK(ok.problems.empty());
  CHECK(ok.recipe.parallel.bucket_mb == 0.5);
  const std::string out = format_recipe(ok.recipe);
  CHECK(out.find("bucket_mb = 0.5") != std::string::npos);
  CHECK(parse_recipe(out, "again.toml").recipe.parallel == ok.recipe.parallel);
  RecipeDocument integer = parse_with("[parallel]\ndp = 2\ntp = 1\npp = 1\nbucket_mb = 25\n");
  CHECK(integer.problems.empty());
  CHECK(integer.recipe.parallel.bucket_mb == 25);
  CHECK(format_recipe(RecipeDocument{}.recipe).find("bucket_mb") == std::string::npos);
}

TEST_CASE("recipe: expert_dispatch is routed or gather, written back only when gather",
          "[recipe]") {
  RecipeDocument bad = parse_with(
      "[parallel]\ndp = 2\ntp = 1\npp = 1\nexpert_parallel = 2\nexpert_dispatch = \"dense\"\n");
  INFO(dump(bad.problems));
  CHECK(has(bad.problems, "recipe.toml:11:19",
            "'parallel.expert_dispatch' must be one of routed, gather, got 'dense'"));
  RecipeDocument ok = parse_with(
      "[parallel]\ndp = 2\ntp = 1\npp = 1\nexpert_parallel = 2\nexpert_dispatch = \"gather\"\n");
  CHECK(ok.problems.empty());
  CHECK(!ok.recipe.parallel.routed_experts);
  const std::string out = format_recipe(ok.recipe);
  CHECK(out.find("expert_dispatch = \"gather\"") != std::string::npos);
  CHECK(parse_recipe(out, "again.toml").recipe.parallel == ok.recipe.parallel);
  CHECK(RecipeDocument{}.recipe.parallel.routed_experts);
  CHECK(format_recipe(RecipeDocument{}.recipe).find("expert_dispatch") == std::string::npos);
}

TEST_CASE("recipe: zero3_gather is per-use or per-step, and per-step needs ZeRO-3", "[recipe]") {
  RecipeDocument bad = parse_with(
      "[parallel]\ndp = 2\ntp = 1\npp = 1\noptimizer_shard = 3\nzero3_gather = \"once\"\n");
  INFO(dump(bad.problems));
  CHECK(has(bad.problems, "recipe.toml:11:16",
            "'parallel.zero3_gather' must be one of per-use, per-step, got 'once'"));
  RecipeDocument unsharded = parse_with(
      "[parallel]\ndp = 2\ntp = 1\npp = 1\noptimizer_shard = 2\nzero3_gather = \"per-step\"\n");
  INFO(dump(unsharded.problems));
  CHECK(has(unsharded.problems, "recipe.toml",
            "'parallel.zero3_gather' is per-step but the parameters are not sharded "
            "(optimizer_shard is gradients)"));
  RecipeDocument ok = parse_with(
      "[parallel]\ndp = 2\ntp = 1\npp = 1\noptimizer_shard = 3\nzero3_gather = \"per-step\"\n");
  CHECK(ok.problems.empty());
  CHECK(ok.recipe.parallel.zero3_per_step);
  const std::string out = format_recipe(ok.recipe);
  CHECK(out.find("zero3_gather = \"per-step\"") != std::string::npos);
  CHECK(parse_recipe(out, "again.toml").recipe.parallel == ok.recipe.parallel);
  CHECK(format_recipe(RecipeDocument{}.recipe).find("zero3_gather") == std::string::npos);
}

TEST_CASE("recipe: enumerations list their values", "[recipe]") {
  RecipeDocument doc = parse_with("[parallel]\ndp = 1\ntp = 1\npp = 1\nschedule = \"1F1B\"\n");
  INFO(dump(doc.problems));
  REQUIRE(doc.problems.size() == 1);
  CHECK(doc.problems[0].message ==
        "'parallel.schedule' must be one of gpipe, 1f1b, interleaved, zb-h1, zbv, got '1F1B'");
  CHECK(doc.problems[0].hint == "did you mean '1f1b'?");
  RecipeDocument zb = parse_with("[parallel]\ndp = 1\ntp = 1\npp = 1\nschedule = \"zb_h1\"\n");
  REQUIRE(zb.problems.size() == 1);
  CHECK(zb.problems[0].hint == "did you mean 'zb-h1'?");
}

TEST_CASE("recipe: zero-bubble schedules and their chunks per rank", "[recipe]") {
  // zb-h1 is one chunk per rank, like 1f1b.
  RecipeDocument h1 = parse_with("[parallel]\ndp = 1\ntp = 1\npp = 2\nschedule = \"zb-h1\"\n");
  INFO(dump(h1.problems));
  CHECK(h1.problems.empty());
  CHECK(h1.recipe.parallel.schedule == Schedule::zb_h1);
  CHECK(h1.recipe.parallel.virtual_stages == 1);
  // zbv without virtual_stages reads as 2 chunks per rank; 2 written out is the same recipe.
  RecipeDocument v = parse_with("[parallel]\ndp = 1\ntp = 1\npp = 2\nschedule = \"zbv\"\n");
  INFO(dump(v.problems));
  CHECK(v.problems.empty());
  CHECK(v.recipe.parallel.schedule == Schedule::zbv);
  CHECK(v.recipe.parallel.virtual_stages == 2);
  RecipeDocument v2 =
      parse_with("[parallel]\ndp = 1\ntp = 1\npp = 2\nschedule = \"zbv\"\nvirtual_stages = 2\n");
  CHECK(v2.problems.empty());
  CHECK(v2.recipe.parallel == v.recipe.parallel);
  CHECK(std::string(schedule_name(Schedule::zbv)) == "zbv");
  CHECK(std::string(schedule_name(Schedule::zb_h1)) == "zb-h1");
  // Any other chunk count is refused at the key, with a hint.
  for (const char* n : {"1", "3"}) {
    RecipeDocument bad = parse_with(
        std::string("[parallel]\ndp = 1\ntp = 1\npp = 2\nschedule = \"zbv\"\nvirtual_stages = ") +
        n + "\n");
    INFO(dump(bad.problems));
    REQUIRE(bad.problems.size() == 1);
    CHECK(bad.problems[0].where == "recipe.toml:11:18");
    CHECK(bad.problems[0].message ==
          std::string("the zbv schedule runs 2 model chunks per rank, but "
                      "'parallel.virtual_stages' is ") +
              n);
    CHECK(bad.problems[0].hint.find("leave virtual_stages out or set it to 2") == 0);
  }
  // zb-h1 with chunks is the one-chunk rule's error.
  RecipeDocument h2 =
      parse_with("[parallel]\ndp = 1\ntp = 1\npp = 2\nschedule = \"zb-h1\"\nvirtual_stages = 2\n");
  REQUIRE(h2.problems.size() == 1);
  CHECK(h2.problems[0].message == "'parallel.virtual_stages' is 2 but the schedule is 'zb-h1'");
  // A zbv recipe with stages needs 2*pp of them.
  RecipeDocument st = parse_with(R"([parallel]
dp = 1
tp = 1
pp = 2
schedule = "zbv"
[[stages]]
index = 0
layers = "0-1"
[[stages]]
index = 1
layers = "2-3"
)");
  CHECK(has(st.problems, "recipe.toml", "the recipe has 2 stages but pp*virtual_stages is 4"));
}

TEST_CASE("recipe: stage, layout, group and offload mistakes", "[recipe]") {
  RecipeDocument doc = parse_with(R"([parallel]
dp = 2
tp = 1
pp = 2
[[stages]]
index = 0
layers = "0-3"
ranks = "0-1"
[[stages]]
index = 1
layers = "3-5"
ranks = "1-3"
[layouts.w]
device_matrix = [2, 2]
alias_name = ["dp"]
tensor_map = ["dp", "tp"]
rank_list = [0, 1, 2]
[[groups]]
name = "a"
ranks = "1-2"
[offload]
enabled = true
h2d_bandwidth = 1e9
h2d_bandwidth_source = "guess"
margin = 0.9
)");
  INFO(dump(doc.problems));
  CHECK(has(doc.problems, "recipe.toml:16:", "layer 3 is in stage 0 and stage 1"));
  CHECK(has(doc.problems, "recipe.toml:17:", "stage 1 has 3 ranks but dp*tp is 2"));
  CHECK(has(doc.problems, "recipe.toml:17:", "rank 1 runs stage 0 and stage 1"));
  CHECK(has(doc.problems, "recipe.toml:20:", "device_matrix has 2 axes but alias_name has 1"));
  CHECK(has(doc.problems, "recipe.toml:21:", "axis 'tp' is not in alias_name"));
  CHECK(has(doc.problems, "recipe.toml:22:", "rank_list has 3 entries, mesh has 4 devices"));
  CHECK(has(doc.problems, "recipe.toml:25:", "group 'a' has ranks 1-2 but must have 0-1"));
  CHECK(has(doc.problems, "recipe.toml:29:", "'offload.h2d_bandwidth_source' is 'guess'"));
  CHECK(has(doc.problems, "recipe.toml:30:", "'offload.margin' must be between 0 and 0.5"));
}

TEST_CASE("recipe: several errors are all reported at once, in file order", "[recipe]") {
  RecipeDocument doc = parse_recipe(R"([recipe]
version = 1
name = "t"
modle = "m.onnx"
cluster = 7
[parallel]
dp = "two"
tp = 0
pp = 1
schedule = "gpipe"
virtual_stages = 2
)",
                                    "recipe.toml");
  INFO(dump(doc.problems));
  CHECK(has(doc.problems, "recipe.toml:4:1", "unknown key 'modle' in [recipe]"));
  CHECK(has(doc.problems, "recipe.toml:1:1", "missing required key 'recipe.model'"));
  CHECK(has(doc.problems, "recipe.toml:5:11", "'recipe.cluster' must be a string, got an integer"));
  CHECK(has(doc.problems, "recipe.toml:7:6", "'parallel.dp' must be an integer, got a string"));
  CHECK(has(doc.problems, "recipe.toml:8:6", "'parallel.tp' must be at least 1, got 0"));
  CHECK(has(doc.problems, "recipe.toml:11:18",
            "'parallel.virtual_stages' is 2 but the schedule is 'gpipe'"));
  // The "did you mean" of 'modle' points at 'model'.
  for (const auto& d : doc.problems)
    if (d.message.find("modle") != std::string::npos) CHECK(d.hint == "did you mean 'model'?");
  // Reading order: line numbers never decrease.
  auto line_of = [](const std::string& w) { return std::stoi(w.substr(w.find(':') + 1)); };
  for (std::size_t i = 1; i < doc.problems.size(); ++i) {
    INFO(i);
    CHECK(line_of(doc.problems[i - 1].where) <= line_of(doc.problems[i].where));
  }
  // The empty 'recipe.cluster' default is not reported again as "must not be empty".
  CHECK(!has(doc.problems, "", "'recipe.cluster' must not be empty"));
}

TEST_CASE("recipe: load_recipe returns every problem in one bad_input error", "[recipe]") {
  auto r = load_recipe("/nonexistent/recipe.toml");
  REQUIRE(!r.ok());
  CHECK(r.error().str().find("/nonexistent/recipe.toml") != std::string::npos);
}

TEST_CASE("recipe: a model given as the recipe is named as one", "[recipe]") {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("hp_recipe_model_given_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(dir / name, std::ios::binary) << bytes;
    return dir / name;
  };
  auto m = load_recipe(write("m.onnx", "[recipe]\n"));  // the extension alone decides
  REQUIRE_FALSE(m.ok());
  CHECK(m.error().what.message == "this is an onnx model, not a recipe");
  CHECK(m.error().what.hint.find("hp plan MODEL") != std::string::npos);
  auto b = load_recipe(write("m.toml", std::string("\x08\x07\x12\0\x01", 5)));
  REQUIRE_FALSE(b.ok());
  CHECK(b.error().what.message == "this is a binary file (an onnx model?), not a recipe");
  std::filesystem::remove_all(dir);
}

TEST_CASE("recipe: validate_recipe_on_cluster checks rank counts", "[recipe]") {
  Recipe r = test::full_recipe();
  SourceMap where("r.toml");
  CHECK(validate_recipe_on_cluster(r, where, 8, "dgx-h100").empty());
  auto ds = validate_recipe_on_cluster(r, where, 16, "dgx-h100");
  INFO(dump(ds));
  // Its groups: 8 cuda ranks and a cpu scheduler, which occupies no accelerator.
  CHECK(has(ds, "r.toml",
            "the [[groups]] hold 8 device (non-cpu) ranks but cluster 'dgx-h100' has 16 ranks"));
  // On a cluster of CPU ranks the scheduler takes one too.
  CHECK(validate_recipe_on_cluster(r, where, 9, "local-cpu", true).empty());
  CHECK(has(validate_recipe_on_cluster(r, where, 8, "local-cpu", true), "r.toml",
            "the [[groups]] hold 9 ranks but cluster 'local-cpu' has 8 ranks"));
  // Without groups, dp*tp*pp is the job's ranks.
  Recipe plain = r;
  plain.groups.clear();
  ds = validate_recipe_on_cluster(plain, where, 16, "dgx-h100");
  CHECK(has(ds, "r.toml", "dp*tp*pp = 2*2*2 = 8 ranks but cluster 'dgx-h100' has 16 ranks"));
  ds = validate_recipe_on_cluster(r, where, 4, "tiny");
  CHECK(has(ds, "r.toml", "names rank 4 but cluster 'tiny' has ranks 0..3"));
}

TEST_CASE("recipe: huge degrees are refused without overflow", "[recipe]") {
  RecipeDocument doc = parse_with(
      "[parallel]\ndp = 9223372036854775807\ntp = 4611686018427387904\npp = 2\n"
      "expert_parallel = 3\n[layouts.w]\ndevice_matrix = [1048576, 1048576]\n"
      "alias_name = [\"a\", \"b\"]\ntensor_map = [\"a\"]\nrank_list = [0]\n");
  INFO(dump(doc.problems));
  CHECK(has(doc.problems, "recipe.toml:7:6", "'parallel.dp' must be at most 1048576"));
  CHECK(has(doc.problems, "recipe.toml:8:6", "'parallel.tp' must be at most 1048576"));
  CHECK(has(doc.problems, "recipe.toml:12:", "the mesh has more than 1048576 devices"));
}

TEST_CASE("recipe: random bytes and truncated files never crash the parser", "[recipe]") {
  std::uint32_t state = 12345;
  auto next = [&] { return state = state * 1664525u + 1013904223u; };
  for (int round = 0; round < 200; ++round) {
    std::string text(static_cast<std::size_t>(next() % 300), '\0');
    for (auto& c : text) c = static_cast<char>(next() >> 24);
    RecipeDocument doc = parse_recipe(text, "random.toml");
    CHECK(!doc.problems.empty());
  }
  std::string full = format_recipe(test::full_recipe());
  for (std::size_t cut = 0; cut < full.size(); cut += 7) {
    RecipeDocument doc = parse_recipe(full.substr(0, cut), "cut.toml");
    (void)doc;  // any outcome is fine as long as it is a value, not a crash
  }
}

TEST_CASE("recipe: per-layer recompute overrides must name the stage's layers once", "[recipe]") {
  RecipeDocument doc = parse_with(R"([parallel]
dp = 1
tp = 1
pp = 1
[[stages]]
index = 0
layers = "0-3"
recompute = "selective"
recompute_layers = { full = "2-4", none = [2], sometimes = [1] }
)");
  INFO(dump(doc.problems));
  CHECK(has(doc.problems, "recipe.toml:14:48",
            "unknown key 'sometimes' in [stages[0].recompute_layers]"));
  CHECK(has(doc.problems, "recipe.toml:14:20",
            "'stages[0].recompute_layers.full' names layer 4, which is not in stage 0"));
  CHECK(has(doc.problems, "recipe.toml:14:20",
            "layer 2 of stage 0 is both 'none' and 'full' in 'recompute_layers'"));
}

TEST_CASE("recipe: [workload] mistakes are located and the batch checked against the degrees",
          "[recipe]") {
  const std::string par = "[parallel]\ndp = 2\ntp = 1\npp = 1\nmicro_batch_size = 2\n";
  SECTION("a consistent workload reads back") {
    RecipeDocument doc = parse_with(par +
                                    "[workload]\nmode = \"infer\"\ndtype = \"fp32\"\n"
                                    "optimizer = \"sgd\"\nglobal_batch = 4\nseq = 16\n"
                                    "command = \"hp plan m.onnx\"\n");
    INFO(dump(doc.problems));
    REQUIRE(doc.problems.empty());
    REQUIRE(doc.recipe.workload);
    CHECK(*doc.recipe.workload == Workload{"infer", "fp32", "sgd", 4, 16, "hp plan m.onnx"});
  }
  SECTION("bad names, a negative seq and a batch the degrees do not make") {
    RecipeDocument doc = parse_with(par +
                                    "[workload]\nmode = \"training\"\ndtype = \"bf17\"\n"
                                    "optimizer = \"lamb\"\nglobal_batch = 6\nseq = -1\n");
    INFO(dump(doc.problems));
    CHECK(has(doc.problems, "recipe.toml:12:", "must be train or infer, got 'training'"));
    CHECK(has(doc.problems, "recipe.toml:13:", "bf17"));
    CHECK(has(doc.problems, "recipe.toml:14:", "lamb"));
    CHECK(has(doc.problems, "recipe.toml:15:", "'workload.global_batch' is 6 but dp x"));
    CHECK(has(doc.problems, "recipe.toml:16:", "'workload.seq' must be >= 0"));
  }
  SECTION("wrong types and unknown keys") {
    RecipeDocument doc = parse_with(par + "[workload]\nglobal_batch = \"four\"\ndtyp = \"bf16\"\n");
    INFO(dump(doc.problems));
    CHECK(has(doc.problems, "recipe.toml:12:", "'workload.global_batch' must be an integer"));
    CHECK(has(doc.problems, "recipe.toml:13:", "unknown key 'dtyp' in [workload]"));
  }
}

TEST_CASE("recipe: [train] reads back, and its mistakes are located", "[recipe]") {
  const std::string par = "[parallel]\ndp = 1\ntp = 1\npp = 1\n";  // lines 6-9; [train] is 10
  SECTION("an empty [train] table has the documented defaults") {
    RecipeDocument doc = parse_with(par + "[train]\n");
    INFO(dump(doc.problems));
    REQUIRE(doc.problems.empty());
    REQUIRE(doc.recipe.train);
    CHECK(*doc.recipe.train == Train{});
    CHECK(doc.recipe.train->steps == 100);
    CHECK(doc.recipe.train->betas == std::vector<double>{0.9, 0.999});
  }
  SECTION("every key given reads back as written") {
    RecipeDocument doc = parse_with(par +
                                    "[train]\nloss = \"mse\"\nlogits = \"y\"\nlabels = \"t\"\n"
                                    "optimizer = \"sgd\"\nlr = 0.5\nbetas = [0, 0.5]\n"
                                    "eps = 1e-6\nweight_decay = 0\nmomentum = 0.9\n"
                                    "clip_norm = 1\nlr_schedule = \"cosine\"\nwarmup_steps = 3\n"
                                    "min_lr = 0.01\nsteps = 7\nseed = 42\n"
                                    "frozen = [\"rope.*\", \"mask?\"]\n");
    INFO(dump(doc.problems));
    REQUIRE(doc.problems.empty());
    REQUIRE(doc.recipe.train);
    const Train& t = *doc.recipe.train;
    CHECK(t.loss == "mse");
    CHECK(t.logits == "y");
    CHECK(t.labels == "t");
    CHECK(t.optimizer == "sgd");
    CHECK(t.lr == 0.5);
    CHECK(t.betas == std::vector<double>{0.0, 0.5});  // integers are numbers too
    CHECK(t.eps == 1e-6);
    CHECK(t.weight_decay == 0.0);
    CHECK(t.momentum == 0.9);
    CHECK(t.clip_norm == 1.0);
    CHECK(t.lr_schedule == "cosine");
    CHECK(t.warmup_steps == 3);
    CHECK(t.min_lr == 0.01);
    CHECK(t.steps == 7);
    CHECK(t.seed == 42);
    CHECK(t.frozen == std::vector<std::string>{"rope.*", "mask?"});
    // And it round-trips.
    RecipeDocument back = parse_recipe(format_recipe(doc.recipe), "back.toml");
    INFO(dump(back.problems));
    REQUIRE(back.problems.empty());
    CHECK(back.recipe == doc.recipe);
  }
  SECTION("unknown names and out-of-range numbers, each on its line") {
    RecipeDocument doc = parse_with(par +
                                    "[train]\nloss = \"crossentropy\"\noptimizer = \"adam\"\n"
                                    "lr = 0\nbetas = [0.9, 1.0]\neps = -1e-8\nweight_decay = -0.1\n"
                                    "momentum = 1\nclip_norm = -1\nlr_schedule = \"linear\"\n"
                                    "warmup_steps = -2\nmin_lr = -1\nsteps = 0\nseed = -3\n"
                                    "frozen = [\"\"]\n");
    INFO(dump(doc.problems));
    CHECK(has(doc.problems, "recipe.toml:11:",
              "'train.loss' must be one of cross_entropy, mse, got 'crossentropy'"));
    CHECK(has(doc.problems,
              "recipe.toml:12:", "'train.optimizer' must be one of adamw, sgd, got 'adam'"));
    CHECK(has(doc.problems, "recipe.toml:13:", "'train.lr' must be a finite number > 0, got 0"));
    CHECK(has(doc.problems, "recipe.toml:14:", "'train.betas' must be in [0, 1), got 1"));
    CHECK(has(doc.problems, "recipe.toml:15:", "'train.eps' must be a finite number > 0"));
    CHECK(
        has(doc.problems, "recipe.toml:16:", "'train.weight_decay' must be a finite number >= 0"));
    CHECK(has(doc.problems, "recipe.toml:17:", "'train.momentum' must be in [0, 1), got 1"));
    CHECK(has(doc.problems, "recipe.toml:18:", "'train.clip_norm' must be a finite number >= 0"));
    CHECK(has(doc.problems, "recipe.toml:19:", "'train.lr_schedule' must be one of constant"));
    CHECK(has(doc.problems, "recipe.toml:20:", "'train.warmup_steps' must be at least 0, got -2"));
    CHECK(has(doc.problems, "recipe.toml:21:", "'train.min_lr' must be a finite number >= 0"));
    CHECK(has(doc.problems, "recipe.toml:22:", "'train.steps' must be at least 1, got 0"));
    CHECK(has(doc.problems, "recipe.toml:23:", "'train.seed' must be at least 0, got -3"));
    CHECK(has(doc.problems, "recipe.toml:24:", "'train.frozen[0]' is an empty pattern"));
    // The near miss gets a hint.
    auto loss = std::find_if(doc.problems.begin(), doc.problems.end(), [](const auto& d) {
      return d.where.find(":11:") != std::string::npos;
    });
    REQUIRE(loss != doc.problems.end());
    CHECK(loss->hint == "did you mean 'cross_entropy'?");
  }
  SECTION("wrong types, unknown keys, a wrong number of betas") {
    RecipeDocument doc = parse_with(par +
                                    "[train]\nsteps = \"ten\"\nlr = \"fast\"\nlearning_rate = 1\n"
                                    "betas = [0.9, \"x\"]\nfrozen = \"rope\"\nseed = 1.5\n");
    INFO(dump(doc.problems));
    CHECK(has(doc.problems, "recipe.toml:11:", "'train.steps' must be an integer, got a string"));
    CHECK(has(doc.problems, "recipe.toml:12:", "'train.lr' must be a number, got a string"));
    CHECK(has(doc.problems, "recipe.toml:13:", "unknown key 'learning_rate' in [train]"));
    CHECK(has(doc.problems, "recipe.toml:14:", "'train.betas[1]' must be a number, got a string"));
    CHECK(has(doc.problems, "recipe.toml:15:", "'train.frozen' must be an array, got a string"));
    CHECK(has(doc.problems, "recipe.toml:16:", "'train.seed' must be an integer, got a float"));
    RecipeDocument three = parse_with(par + "[train]\nbetas = [0.9, 0.99, 0.999]\n");
    CHECK(has(three.problems, "recipe.toml:11:", "'train.betas' must hold 2 numbers, got 3"));
    RecipeDocument nan = parse_with(par + "[train]\nlr = nan\nclip_norm = inf\n");
    CHECK(has(nan.problems, "recipe.toml:11:", "'train.lr' must be a finite number > 0"));
    CHECK(has(nan.problems, "recipe.toml:12:", "'train.clip_norm' must be a finite number >= 0"));
    RecipeDocument table = parse_recipe("train = 3\n" + (kHead + par), "recipe.toml");
    CHECK(has(table.problems, "recipe.toml:1:", "'train' must be a table, got an integer"));
  }
  SECTION("min_lr above lr, and [train] on an inference plan") {
    RecipeDocument doc = parse_with(par +
                                    "[workload]\nmode = \"infer\"\n"
                                    "[train]\nlr = 0.001\nmin_lr = 0.01\n");
    INFO(dump(doc.problems));
    CHECK(has(doc.problems, "recipe.toml:14:", "'train.min_lr' is 0.01 but 'train.lr' is only"));
    CHECK(has(doc.problems,
              "recipe.toml:12:", "the recipe has a [train] table but was planned for inference"));
  }
}

TEST_CASE("recipe: ranges ending at INT64_MAX stop there", "[recipe]") {
  // Found by the recipe fuzz driver: the loop's "x <= b" never failed for b = INT64_MAX.
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  auto one = parse_ranges("9223372036854775807");
  REQUIRE(one);
  CHECK(*one == std::vector<std::int64_t>{kMax});
  auto two = parse_ranges("9223372036854775806-9223372036854775807");
  REQUIRE(two);
  CHECK(*two == std::vector<std::int64_t>{kMax - 1, kMax});
  RecipeDocument doc = parse_with(
      "[parallel]\ndp = 1\ntp = 1\npp = 1\n[[groups]]\nname = \"g\"\n"
      "ranks = \"9223372036854775807\"\nmodule = \"m.onnx\"\n");
  CHECK_FALSE(doc.problems.empty());
}

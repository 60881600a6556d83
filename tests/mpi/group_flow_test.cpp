// The static checks of tensor flows between MPMD groups (group_flow.h), without MPI: the bundled
// omni-modal recipe passes; a second producer, an input nothing produces, an output nothing reads,
// a cycle, a two-rank scheduler, a module lacking a listed input, a dims mismatch and a batch
// mismatch each fail with bad_input at the recipe line of the offending group. Also the row split
// itself.
#include <catch2/catch.hpp>

#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "hp/job/group_flow.h"
#include "hp/job/job.h"
#include "hp/recipe/recipe.h"

namespace fs = std::filesystem;
using namespace hp::job;

namespace {

const fs::path kOmni = fs::path(HP_SOURCE_DIR) / "recipes" / "omni-modal";

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("hp_group_flow_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

// One [[groups]] entry; `module` is a file under recipes/omni-modal/ or "scheduler".
struct G {
  std::string name, ranks, module, inputs, outputs;
};

std::string recipe_text(const std::vector<G>& groups) {
  std::string s = "[recipe]\nversion = 1\nname = \"t\"\nmodel = \"" +
                  (kOmni / "omni.onnx").string() +
                  "\"\ncluster = \"local-cpu\"\n\n[parallel]\ndp = 1\ntp = 1\npp = 1\n";
  for (const auto& g : groups) {
    const std::string module = g.module == "scheduler" || fs::path(g.module).is_absolute()
                                   ? g.module
                                   : (kOmni / g.module).string();
    s += "\n[[groups]]\nname = \"" + g.name + "\"\nranks = \"" + g.ranks + "\"\nmodule = \"" +
         module + "\"\ninputs = [" + g.inputs + "]\noutputs = [" + g.outputs + "]\n";
  }
  return s;
}

// The omni-modal groups of recipes/omni-modal.toml.
std::vector<G> omni() {
  return {
      {"text", "0-1", "text.onnx", "\"tokens\"", "\"text_emb\""},
      {"image", "2-3", "image.onnx", "\"image\"", "\"image_emb\""},
      {"audio", "4", "audio.onnx", "\"audio\"", "\"audio_emb\""},
      {"fusion", "5", "fusion.onnx", "\"text_emb\", \"image_emb\", \"audio_emb\"", "\"logits\""},
      {"scheduler", "6", "scheduler", "\"logits\"", "\"tokens\", \"image\", \"audio\""}};
}

// check_group_flows on the recipe's Job (or the recipe's own problems when no Job can be made).
hp::Status check_group_flows(const fs::path& recipe) {
  auto job = load_job(recipe);
  if (!job) return std::move(job).error();
  return hp::job::check_group_flows(*job);
}

// check_group_flows on the recipe; the error's messages and locations joined, or "" when it passes.
std::string check(const TempDir& d, const std::vector<G>& groups) {
  const fs::path file = d.path / "flows.toml";
  std::ofstream(file) << recipe_text(groups);
  hp::Status s = check_group_flows(file);
  if (s.ok()) return "";
  std::string all;
  for (const auto& p : s.error().all()) all += p.where + ": " + p.message + "\n";
  return all;
}

// The line of groups[i]'s `key` in recipe_text (1-based), for location checks.
int line_of(const std::vector<G>& groups, std::size_t i, const std::string& key) {
  std::istringstream in(recipe_text(groups));
  std::string line;
  int n = 0;
  std::size_t seen = 0;
  bool in_group = false;
  while (std::getline(in, line)) {
    ++n;
    if (line == "[[groups]]") in_group = seen++ == i;
    if (in_group && line.rfind(key + " =", 0) == 0) return n;
  }
  return -1;
}

}  // namespace

TEST_CASE("group flows: the bundled omni-modal recipe checks", "[group_flow]") {
  hp::Status s = check_group_flows(fs::path(HP_SOURCE_DIR) / "recipes" / "omni-modal.toml");
  INFO((s.ok() ? std::string() : s.error().what.message));
  CHECK(s.ok());
  TempDir d;
  CHECK(check(d, omni()).empty());
}

TEST_CASE("group flows: the flows of the omni-modal groups", "[group_flow]") {
  auto doc = hp::recipe::parse_recipe(recipe_text(omni()), "t.toml");
  REQUIRE(doc.problems.empty());
  auto fg = build_flows(doc.recipe, doc.where);
  REQUIRE(fg.ok());
  REQUIRE(fg->scheduler == std::size_t{4});
  REQUIRE(fg->flows.size() == 7);
  const Flow& text = fg->flows[static_cast<std::size_t>(fg->find("text_emb"))];
  CHECK(text.producer == 0);
  CHECK(text.consumers == std::vector<std::size_t>{3});
  const Flow& tokens = fg->flows[static_cast<std::size_t>(fg->find("tokens"))];
  CHECK(tokens.producer == 4);
  CHECK(tokens.consumers == std::vector<std::size_t>{0});
  CHECK(fg->find("nosuch") == -1);
}

TEST_CASE("group flows: rows of a data-parallel group", "[group_flow]") {
  CHECK(rows_of(4, 2, 0).first == 0);
  CHECK(rows_of(4, 2, 1).first == 2);
  CHECK(rows_of(4, 2, 1).count == 2);
  // Uneven: 5 requests over 2 ranks are 2 + 3, covering every row once.
  CHECK(rows_of(5, 2, 0).count == 2);
  CHECK(rows_of(5, 2, 1).first == 2);
  CHECK(rows_of(5, 2, 1).count == 3);
  CHECK(flow_header_tag(0) != flow_data_tag(0));
  CHECK(flow_data_tag(0) != flow_header_tag(1));
}

TEST_CASE("group flows: a recipe without flows is left alone", "[group_flow]") {
  // Two replicas listing the same output is the plain (TP) group form, not a second producer.
  TempDir d;
  CHECK(check(d, {{"g0", "0", "fusion.onnx", "", "\"logits\""},
                  {"g1", "1", "fusion.onnx", "", "\"logits\""}})
            .empty());
}

TEST_CASE("group flows: a tensor with two producer groups", "[group_flow]") {
  TempDir d;
  auto g = omni();
  g[1].outputs = "\"image_emb\", \"text_emb\"";
  const std::string err = check(d, g);
  CHECK(err.find("tensor 'text_emb' is produced by groups 'text' and 'image'") !=
        std::string::npos);
  CHECK(err.find("flows.toml:" + std::to_string(line_of(g, 1, "outputs"))) != std::string::npos);
}

TEST_CASE("group flows: an input no group produces, an output no group reads", "[group_flow]") {
  TempDir d;
  auto g = omni();
  g[4].outputs = "\"tokens\", \"image\"";  // the scheduler forgets the audio requests
  std::string err = check(d, g);
  CHECK(err.find("group 'audio' reads 'audio' but no group lists it in its outputs") !=
        std::string::npos);
  CHECK(err.find("flows.toml:" + std::to_string(line_of(g, 2, "inputs"))) != std::string::npos);
  g = omni();
  g[4].inputs = "";  // nobody collects the logits
  err = check(d, g);
  CHECK(err.find("group 'fusion' produces 'logits' but no group reads it") != std::string::npos);
}

TEST_CASE("group flows: a cycle between groups", "[group_flow]") {
  TempDir d;
  auto g = omni();
  g[0].inputs = "\"tokens\", \"logits\"";  // text waits for fusion, which waits for text
  const std::string err = check(d, g);
  CHECK(err.find("the groups' flows form a cycle: 'text' -> 'fusion' -> 'text'") !=
        std::string::npos);
}

TEST_CASE("group flows: a scheduler has one rank", "[group_flow]") {
  TempDir d;
  auto g = omni();
  g[4].ranks = "6-7";
  CHECK(check(d, g).find("scheduler group 'scheduler' has 2 ranks but must have 1") !=
        std::string::npos);
}

TEST_CASE("group flows: a module lacking an input its flow names", "[group_flow]") {
  TempDir d;
  auto g = omni();
  g[3].module = "audio.onnx";  // the fusion group runs a module without text_emb
  const std::string err = check(d, g);
  CHECK(err.find("group 'fusion' lists input 'text_emb' but its module") != std::string::npos);
  CHECK(err.find("has no graph input of that name (it has: audio)") != std::string::npos);
  CHECK(err.find("flows.toml:" + std::to_string(line_of(g, 3, "inputs"))) != std::string::npos);
}

TEST_CASE("group flows: producer and consumer disagree on a dim or on the batch", "[group_flow]") {
  TempDir d;
  // A text module whose embedding is 16 wide: tokens i64 [2,16] cast to f32 (text_emb f32 [2,16]).
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* gr = m.mutable_graph();
  gr->set_name("narrow");
  auto io = [](onnx::ValueInfoProto* v, const std::string& name, int type) {
    v->set_name(name);
    auto* tt = v->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(type);
    tt->mutable_shape()->add_dim()->set_dim_value(2);
    tt->mutable_shape()->add_dim()->set_dim_value(16);
  };
  io(gr->add_input(), "tokens", onnx::TensorProto::INT64);
  io(gr->add_output(), "text_emb", onnx::TensorProto::FLOAT);
  auto* n = gr->add_node();
  n->set_op_type("Cast");
  n->add_input("tokens");
  n->add_output("text_emb");
  auto* to = n->add_attribute();
  to->set_name("to");
  to->set_type(onnx::AttributeProto::INT);
  to->set_i(onnx::TensorProto::FLOAT);
  std::ofstream(d.path / "narrow.onnx", std::ios::binary) << m.SerializeAsString();

  auto g = omni();
  g[0].module = (d.path / "narrow.onnx").string();
  std::string err = check(d, g);
  CHECK(err.find("'text_emb' flows from group 'text' as f32 [2,16] per rank but group 'fusion' "
                 "reads it as f32 [4,32]") != std::string::npos);
  // One text rank serves 2 rows, but fusion expects all 4 requests.
  g = omni();
  g[0].ranks = "0";
  for (std::size_t i = 1; i < g.size(); ++i)
    g[i].ranks = i == 1 ? "1-2" : i == 2 ? "3" : i == 3 ? "4" : "5";
  err = check(d, g);
  CHECK(err.find("'text_emb' of group 'fusion' (1 ranks x 4 rows) is a batch of 4 requests but "
                 "'text_emb' of group "
                 "'text' (1 ranks x 2 rows) is 2") != std::string::npos);
}

// Expert parallelism (libs/train/src/expert_parallel.cpp, expert_sync.cpp): the expert layers of a
// small mixture-of-experts graph built here (four experts of Gemm -> Relu, stacked by Unsqueeze +
// Concat as torch.stack exports them, weighted by a softmax router), one member's partition (its
// experts only, the tokens all-gathered, the stacked outputs exchanged back), the refusals, and
// training on two in-process ranks against one rank, with a batch whose rows hold different
// numbers of ignored (-100) labels, so each rank's gradient must be weighted by its share of the
// labels before the experts' gradients of both ranks' tokens mix. Experts added into a sum
// (expert_accumulate.h) are found in two committed user exports and split over the group.
#include <catch2/catch.hpp>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "hp/comm/comm.h"
#include "hp/core/hp_domain.h"
#include "hp/model/model.h"
#include "hp/train/expert_parallel.h"
#include "hp/train/pipeline.h"
#include "hp/train/trainer.h"
#include "train_graph_builder.h"

namespace fs = std::filesystem;
using namespace hp;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path d =
      fs::temp_directory_path() / ("hp_train_ep_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void set_batch(onnx::ValueInfoProto* v) {
  v->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(0)->set_dim_param("batch");
}

/// ids [batch, 3] -> embedding -> tokens [batch*3, 4] -> `experts` experts (Gemm, Relu) stacked
/// on axis 1 -> weighted by softmax(tokens Wr) -> [batch, 3, 4] -> head -> logits [batch, 3, 13].
/// `top2`: the gate is the two largest probabilities scattered into zeros, as torch's
/// zeros_like(probs).scatter(1, topi, topw) exports it: each token uses two experts.
test::Builder moe(int experts = 4, bool top2 = false) {
  test::Builder b;
  b.input("ids", {2, 3}, onnx::TensorProto::INT64);
  b.output("logits", {2, 3, 13});
  set_batch(b.g().mutable_input(0));
  set_batch(b.g().mutable_output(0));
  b.weight("emb", {13, 4});
  b.weight("router", {4, experts});
  b.weight("head", {4, 13});
  b.ints("flat", {-1, 4});
  b.ints("unflat", {-1, 3, 4});
  b.ints("axis1", {1});
  b.ints("last", {-1});
  b.node("Gather", {"emb", "ids"}, {"x"});
  b.node("Reshape", {"x", "flat"}, {"tokens"});
  std::vector<std::string> stacked;
  for (int e = 0; e < experts; ++e) {
    const std::string k = std::to_string(e);
    b.weight("W" + k, {4, 4});
    b.weight("b" + k, {4}, 0.1);
    test::attr_i(b.node("Gemm", {"tokens", "W" + k, "b" + k}, {"g" + k}), "transB", 1);
    b.node("Relu", {"g" + k}, {"r" + k});
    b.node("Unsqueeze", {"r" + k, "axis1"}, {"u" + k});
    stacked.push_back("u" + k);
  }
  test::attr_i(b.node("Concat", stacked, {"outs"}), "axis", 1);
  b.node("MatMul", {"tokens", "router"}, {"scores"});
  test::attr_i(b.node("Softmax", {"scores"}, {"probs"}), "axis", -1);
  if (top2) {
    b.ints("two", {2});
    test::attr_i(b.node("TopK", {"probs", "two"}, {"topw", "topi"}), "axis", -1);
    b.node("Shape", {"probs"}, {"pshape"});
    b.node("ConstantOfShape", {"pshape"}, {"zeros"});
    test::attr_i(b.node("ScatterElements", {"zeros", "topi", "topw"}, {"sparse"}), "axis", 1);
    b.node("Unsqueeze", {"sparse", "last"}, {"gate"});
  } else {
    b.node("Unsqueeze", {"probs", "last"}, {"gate"});
  }
  b.node("Mul", {"outs", "gate"}, {"weighted"});
  test::attr_i(b.node("ReduceSum", {"weighted", "axis1"}, {"mixed"}), "keepdims", 0);
  b.node("Reshape", {"mixed", "unflat"}, {"y"});
  b.node("MatMul", {"y", "head"}, {"logits"});
  return b;
}

fs::path write(const test::Builder& b, const fs::path& dir) {
  const fs::path p = dir / "model.onnx";
  std::ofstream(p, std::ios::binary) << b.m.SerializeAsString();
  return p;
}

train::TrainOptions options(const fs::path& dir, bool top2 = false, int rows = 2) {
  train::TrainOptions o;
  o.model = write(moe(4, top2), dir);
  exec::HostTensor ids, labels;
  ids.name = "ids", labels.name = "labels";
  ids.dtype = labels.dtype = HP_I64;
  ids.dims = labels.dims = {rows, 3};
  ids.data.resize(static_cast<std::size_t>(rows) * 24), labels.data.resize(ids.data.size());
  for (int k = 0; k < 3 * rows; ++k) {
    ids.as<std::int64_t>()[k] = (k * 7 + 3) % 13;
    // Row 0 keeps 3 labels, row 1 keeps 1: the ranks weigh 3/4 and 1/4 (rows 2 and 3: 2, 3).
    labels.as<std::int64_t>()[k] = (k == 3 || k == 5 || k == 7) ? -100 : (k * 5 + 1) % 13;
  }
  REQUIRE(exec::write_tensor_dir(dir / "inputs", {ids, labels}, "input"));
  o.grad.logits = "logits";
  o.inputs_dir = dir / "inputs";
  o.optimizer.lr = 1e-2;
  o.optimizer.clip_norm = 0.5;  // clipping needs the whole model's norm
  o.steps = 3;
  o.threads = 1;
  return o;
}

std::map<std::string, std::vector<float>> weights(const fs::path& model) {
  onnx::ModelProto m;
  std::ifstream f(model, std::ios::binary);
  REQUIRE(m.ParseFromIstream(&f));
  std::map<std::string, std::vector<float>> out;
  for (const auto& t : m.graph().initializer()) {
    if (t.data_type() != onnx::TensorProto::FLOAT) continue;
    std::vector<float> v(t.float_data().begin(), t.float_data().end());
    if (v.empty()) {
      v.resize(t.raw_data().size() / 4);
      std::memcpy(v.data(), t.raw_data().data(), t.raw_data().size());
    }
    out[t.name()] = v;
  }
  return out;
}

model::Model loaded(const test::Builder& b) {
  model::Model m;
  m.path = "moe.onnx";
  m.proto = std::make_shared<onnx::ModelProto>(b.m);
  return m;
}

}  // namespace

TEST_CASE("expert layers are found as torch.stack exports them", "[train][ep]") {
  const auto layers = train::find_expert_layers(moe().m.graph());
  REQUIRE(layers.size() == 1);
  const auto& l = layers[0];
  CHECK(l.tokens == "tokens");
  CHECK(l.stacked == "outs");
  CHECK(l.axis == 1);
  REQUIRE(l.weights.size() == 4);
  CHECK(l.weights[2] == std::vector<std::string>{"W2", "b2"});
  CHECK(l.nodes[0].size() == 2);  // Gemm, Relu

  // Not experts: branches sharing a weight, or a Concat along the token axis.
  test::Builder shared = moe();
  for (auto& n : *shared.g().mutable_node())
    if (n.op_type() == "Gemm" && n.input(1) == "W1") n.set_input(1, "W0");
  CHECK(train::find_expert_layers(shared.m.graph()).empty());
  test::Builder axis0 = moe();
  for (auto& n : *axis0.g().mutable_node())
    if (n.op_type() == "Concat") n.mutable_attribute(0)->set_i(0);
  CHECK(train::find_expert_layers(axis0.m.graph()).empty());
}

TEST_CASE("a member's partition holds its experts and exchanges the tokens", "[train][ep]") {
  auto part = train::partition_experts(loaded(moe()), {4, 7}, 1);
  INFO((part ? std::string() : part.error().str()));
  REQUIRE(part);
  CHECK(part->layers == 1);
  CHECK(part->experts_of ==
        std::vector<std::vector<std::string>>{{"W0", "b0", "W1", "b1"}, {"W2", "b2", "W3", "b3"}});
  onnx::ModelProto m;
  REQUIRE(m.ParseFromString(part->onnx));
  std::set<std::string> inits;
  for (const auto& t : m.graph().initializer()) inits.insert(t.name());
  CHECK(inits.count("W3") == 1);
  CHECK(inits.count("W0") == 0);
  CHECK(inits.count("router") == 1);
  int gathers = 0, exchanges = 0, gemms = 0;
  for (const auto& n : m.graph().node()) {
    if (n.domain() == hp::domain::kDomain) {
      gathers += n.op_type() == "AllGather";
      exchanges += n.op_type() == "AllToAll";
      CHECK(n.attribute(0).ints_size() == 2);  // group [4, 7]
      CHECK(n.attribute(0).ints(1) == 7);
    }
    if (n.op_type() == "Gemm") {
      ++gemms;
      CHECK(n.input(0) == "tokens.ep_gathered");
    }
    if (n.op_type() == "Concat") CHECK(n.input_size() == 2);
  }
  CHECK((gathers == 1 && exchanges == 1 && gemms == 2));
  // The experts' values differ across the group; the gathered tokens do not.
  const auto& v = part->varying;
  CHECK(std::find(v.begin(), v.end(), "W2") != v.end());
  CHECK(std::find(v.begin(), v.end(), "tokens.ep_gathered") == v.end());
}

TEST_CASE("a top-k gate routes each token to its experts' member only", "[train][ep]") {
  auto part = train::partition_experts(loaded(moe(4, true)), {4, 7}, 1);
  INFO((part ? std::string() : part.error().str()));
  REQUIRE(part);
  CHECK(part->routed == 1);
  onnx::ModelProto m;
  REQUIRE(m.ParseFromString(part->onnx));
  int dispatch = 0, combine = 0, others = 0, at = 0, dispatched_at = -1, topk_at = -1;
  for (const auto& n : m.graph().node()) {
    if (n.op_type() == "TopK") topk_at = at;
    if (n.op_type() == "Dispatch") {
      ++dispatch;
      dispatched_at = at;
      CHECK(n.input(0) == "tokens");
      CHECK(n.input(1) == "topi");
      CHECK(n.output_size() == 2);  // experts 2 and 3
    } else if (n.op_type() == "Combine") {
      ++combine;
      CHECK(n.input_size() == 3);
      CHECK(n.output(0) == "outs");
    } else if (n.domain() == hp::domain::kDomain) {
      ++others;
    }
    if (n.op_type() == "Gemm") {
      CHECK(n.input(0).rfind("outs.ep_rows", 0) == 0);
      CHECK(at > dispatched_at);  // the export computes the experts before the router
    }
    CHECK(n.op_type() != "Concat");
    ++at;
  }
  CHECK((dispatch == 1 && combine == 1 && others == 0));
  CHECK(dispatched_at > topk_at);
  const auto& v = part->varying;
  CHECK(std::find(v.begin(), v.end(), "outs.ep_rows1") != v.end());

  // Asked not to route: the all-gather dispatch.
  auto gathered = train::partition_experts(loaded(moe(4, true)), {4, 7}, 1, false);
  REQUIRE(gathered);
  CHECK(gathered->routed == 0);
  CHECK(gathered->onnx.find("AllGather") != std::string::npos);
  // An expert that mixes its tokens (a mean over them) cannot run on a subset: gathered.
  test::Builder mixing = moe(4, true);
  mixing.ints("axis0", {0});
  for (auto& n : *mixing.g().mutable_node())
    if (n.op_type() == "Relu" && n.output(0) == "r0") n.set_output(0, "r0pre");
  test::attr_i(mixing.node("ReduceMean", {"r0pre", "axis0"}, {"r0mean"}), "keepdims", 1);
  mixing.node("Sub", {"r0pre", "r0mean"}, {"r0"});
  auto mixed = train::partition_experts(loaded(mixing), {4, 7}, 0);
  REQUIRE(mixed);
  CHECK(mixed->layers == 1);
  CHECK(mixed->routed == 0);
  // A gate that is not zero outside the chosen experts reads every pair: gathered.
  test::Builder dense_gate = moe(4, true);
  for (auto& n : *dense_gate.g().mutable_node())
    if (n.op_type() == "ScatterElements") n.set_input(0, "probs");
  auto dense = train::partition_experts(loaded(dense_gate), {4, 7}, 0);
  REQUIRE(dense);
  CHECK(dense->routed == 0);
  // Nor one scattered into ones (a value in double_data): the pairs not chosen count.
  test::Builder ones = moe(4, true);
  for (auto& n : *ones.g().mutable_node())
    if (n.op_type() == "ConstantOfShape") {
      auto* a = n.add_attribute();
      a->set_name("value");
      a->set_type(onnx::AttributeProto::TENSOR);
      a->mutable_t()->set_data_type(onnx::TensorProto::DOUBLE);
      a->mutable_t()->add_dims(1);
      a->mutable_t()->add_double_data(1.0);
    }
  auto by_ones = train::partition_experts(loaded(ones), {4, 7}, 0);
  REQUIRE(by_ones);
  CHECK(by_ones->routed == 0);
  // An expert adding a value per token ([6, 4]: a row for each of the 6 tokens) cannot run on a
  // subset of the rows.
  test::Builder per_token = moe(4, true);
  per_token.weight("P", {6, 4});
  for (auto& n : *per_token.g().mutable_node())
    if (n.op_type() == "Relu" && n.output(0) == "r2") n.set_output(0, "r2pre");
  per_token.node("Add", {"r2pre", "P"}, {"r2"});
  auto tokenwise = train::partition_experts(loaded(per_token), {4, 7}, 0);
  REQUIRE(tokenwise);
  CHECK(tokenwise->layers == 1);
  CHECK(tokenwise->routed == 0);
}

TEST_CASE("expert parallelism refuses models it cannot split", "[train][ep]") {
  auto three = train::partition_experts(loaded(moe(3)), {0, 1}, 0);
  REQUIRE(!three);
  CHECK(three.error().code == Errc::bad_input);
  CHECK(three.error().message().find("3 experts, which do not split over expert_parallel = 2") !=
        std::string::npos);
  test::Builder dense;
  dense.input("x", {2, 4});
  dense.output("y", {2, 4});
  dense.weight("W", {4, 4});
  dense.node("MatMul", {"x", "W"}, {"y"});
  auto none = train::partition_experts(loaded(dense), {0, 1}, 0);
  REQUIRE(!none);
  CHECK(none.error().message().find("has none") != std::string::npos);
}

TEST_CASE("two expert-parallel ranks train what one rank trains", "[train][ep]") {
  // ZeRO-2 as well: the shared weights' state and gradients sharded over the two ranks.
  const int zero = GENERATE(0, 2);
  const bool top2 = GENERATE(false, true);  // a dense gate (gathered), a top-2 one (routed)
  INFO("optimizer_shard " << zero << ", top2 " << top2);
  const fs::path d = fresh_dir("train");
  train::TrainOptions one = options(d, top2);
  one.metrics = d / "one.jsonl";
  one.save_model = d / "one.onnx";
  auto r = train::train(one);
  INFO((r ? std::string() : r.error().str()));
  REQUIRE(r);

  train::TrainOptions ep = one;
  ep.metrics = d / "ep.jsonl";
  ep.save_model = d / "ep.onnx";
  ep.checkpoint_dir = d / "ckpt";
  auto st = comm::run_in_process(2, [&](int rank, comm::Transport& t) -> Status {
    train::TrainOptions mine = ep;
    mine.ep.transport = &t;
    mine.ep.group = {0, 1};
    mine.ep.data = {0, 1};
    mine.ep.replicas = {rank};
    mine.ep.zero = zero;
    HP_ASSIGN_OR_RETURN(auto rep, train::train(mine));
    (void)rep;
    return {};
  });
  INFO((st ? std::string() : st.error().str()));
  REQUIRE(st);
  const auto a = test::metric_losses(one.metrics), b = test::metric_losses(ep.metrics);
  REQUIRE(a.size() == 3);
  REQUIRE(b.size() == 3);
  for (std::size_t k = 0; k < 3; ++k) CHECK(b[k] == Approx(a[k]).epsilon(1e-6));
  const auto wa = weights(one.save_model), wb = weights(ep.save_model);
  REQUIRE(wa.size() == wb.size());  // every expert gathered into the saved model
  for (const auto& [name, va] : wa) {
    REQUIRE(wb.count(name));
    const auto& vb = wb.at(name);
    REQUIRE(va.size() == vb.size());
    for (std::size_t e = 0; e < va.size(); ++e) {
      INFO(name << "[" << e << "]");
      CHECK(vb[e] == Approx(va[e]).margin(2e-6));
    }
  }
  // The checkpoint is the one-rank format: one rank resumes it.
  train::TrainOptions resumed = one;
  resumed.resume_dir = ep.checkpoint_dir;
  resumed.steps = 1;
  resumed.metrics = d / "resumed.jsonl";
  auto rr = train::train(resumed);
  INFO((rr ? std::string() : rr.error().str()));
  REQUIRE(rr);
  CHECK(test::metric_losses(resumed.metrics).size() == 1);
  fs::remove_all(d);
}

TEST_CASE("ZeRO-3 under expert parallelism holds the experts in shards too", "[train][ep]") {
  // Four ranks in two expert-parallel groups: each expert on two ranks (ranks r and r + 2), which
  // hold it in shards, as every rank holds the shared weights'; 256-byte buckets, so each is
  // gathered in several parts, from two gathering threads per rank.
  const bool per_step = GENERATE(false, true);  // zero3_gather = "per-step": kept to the step's end
  INFO((per_step ? "per-step gathers" : "per-use gathers"));
  const fs::path d = fresh_dir("zero3");
  train::TrainOptions one = options(d, true, 4);
  one.metrics = d / "one.jsonl";
  one.save_model = d / "one.onnx";
  REQUIRE(train::train(one));
  train::TrainOptions ep = one;
  ep.metrics = d / "ep.jsonl";
  ep.save_model = d / "ep.onnx";
  auto st = comm::run_in_process(4, [&](int rank, comm::Transport& t) -> Status {
    train::TrainOptions mine = ep;
    mine.ep.transport = &t;
    mine.ep.group = rank < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
    mine.ep.data = {0, 1, 2, 3};
    mine.ep.replicas = {rank % 2, rank % 2 + 2};
    mine.ep.zero = 3;
    mine.ep.bucket_bytes = 256;
    mine.ep.gather_per_step = per_step;
    HP_ASSIGN_OR_RETURN(auto rep, train::train(mine));
    if (rank == 0 && per_step != (rep.summary.find("ZeRO-3 per-step gathers") != std::string::npos))
      return Error(Errc::internal, "the per-step line is wrong: " + rep.summary);
    for (const char* line : {"ZeRO-3: the shared parameters held", "ZeRO-3: the experts held"})
      if (rank == 0 && rep.summary.find(line) == std::string::npos)
        return Error(Errc::internal, std::string("no '") + line + "' in " + rep.summary);
    return {};
  });
  INFO((st ? std::string() : st.error().str()));
  REQUIRE(st);
  const auto a = test::metric_losses(one.metrics), b = test::metric_losses(ep.metrics);
  REQUIRE(b.size() == a.size());
  for (std::size_t k = 0; k < a.size(); ++k) CHECK(b[k] == Approx(a[k]).epsilon(1e-6));
  const auto wa = weights(one.save_model), wb = weights(ep.save_model);
  REQUIRE(wa.size() == wb.size());
  for (const auto& [name, va] : wa) {
    REQUIRE(wb.count(name));
    for (std::size_t e = 0; e < va.size(); ++e) {
      INFO(name << "[" << e << "]");
      CHECK(wb.at(name)[e] == Approx(va[e]).margin(2e-6));
    }
  }
  fs::remove_all(d);
}

TEST_CASE("expert-parallel pipeline stages train what one rank trains", "[train][ep][pipeline]") {
  // Ranks 0, 1 hold stage 0 (the embedding and the experts, cut at "y") and ranks 2, 3 stage 1 (the
  // head: no expert, but the loss, whose gradient each member weights by its share of the labels).
  // Pipeline r % 2 takes rows 2(r % 2) .. of the batch, one micro-batch a row, and the stage's two
  // replicas are one expert group. At ZeRO-3 (256-byte buckets) with the backward split in B and W,
  // the shared weights and the experts are gathered for every use.
  const int zero = GENERATE(0, 2, 3);
  const bool top2 = GENERATE(false, true);  // gathered and routed dispatch
  INFO("optimizer_shard " << zero << ", top2 " << top2);
  const fs::path d = fresh_dir("pipeline");
  train::TrainOptions one = options(d, top2, 4);
  one.metrics = d / "one.jsonl";
  one.save_model = d / "one.onnx";
  REQUIRE(train::train(one));
  using Kind = train::PipelineAction::Kind;
  const bool split = zero == 3;
  auto run = [&](const train::TrainOptions& base) {
    return comm::run_in_process(4, [&](int rank, comm::Transport& t) -> Status {
      train::TrainOptions mine = base;
      const int stage = rank / 2, replica = rank % 2;
      mine.pp.transport = &t;
      mine.pp.ranks = {replica, 2 + replica};
      mine.pp.stage = stage;
      mine.pp.micro_batches = 2;
      mine.pp.split_weight = split;
      mine.pp.cuts = {{"y"}};
      for (int k = 0; k < 2; ++k) mine.pp.actions.push_back({Kind::forward, k});
      for (int k = 0; k < 2; ++k) {
        mine.pp.actions.push_back({Kind::backward, k});
        if (split) mine.pp.actions.push_back({Kind::weight, k});
      }
      mine.dp.transport = &t;
      mine.dp.group = {2 * stage, 2 * stage + 1};
      mine.ep.transport = &t;
      mine.ep.group = mine.ep.data = mine.dp.group;
      mine.ep.replicas = {rank};
      mine.ep.zero = zero;
      mine.ep.bucket_bytes = 256;
      mine.ep.gather_per_step = zero == 3 && top2;  // both ways at ZeRO-3
      HP_ASSIGN_OR_RETURN(auto rep, train::train(mine));
      if (rank == 0 && rep.summary.find("expert layers: ") == std::string::npos)
        return Error(Errc::internal, "no expert layers line in " + rep.summary);
      if (rank == 0 && zero == 3 &&
          rep.summary.find("ZeRO-3: the first stage's shared") == std::string::npos)
        return Error(Errc::internal, "no ZeRO-3 line in " + rep.summary);
      return {};
    });
  };
  train::TrainOptions ep = one;
  ep.metrics = d / "ep.jsonl";
  ep.save_model = d / "ep.onnx";
  const Status st = run(ep);
  INFO((st ? std::string() : st.error().str()));
  REQUIRE(st);
  const auto a = test::metric_losses(one.metrics), b = test::metric_losses(ep.metrics);
  REQUIRE(b.size() == a.size());
  for (std::size_t k = 0; k < a.size(); ++k) CHECK(b[k] == Approx(a[k]).epsilon(1e-6));
  const auto wa = weights(one.save_model), wb = weights(ep.save_model);
  REQUIRE(wa.size() == wb.size());  // every expert gathered into the saved model
  for (const auto& [name, va] : wa) {
    REQUIRE(wb.count(name));
    for (std::size_t e = 0; e < va.size(); ++e) {
      INFO(name << "[" << e << "]");
      CHECK(wb.at(name)[e] == Approx(va[e]).margin(2e-6));
    }
  }
  // Two steps checkpointed (each rank its stage's pieces, its experts' state whole), the third at
  // one rank: the same weights.
  ep.steps = 2;
  ep.save_model.clear();
  ep.metrics.clear();
  ep.checkpoint_dir = d / "ckpt";
  REQUIRE(run(ep));
  train::TrainOptions resumed = one;
  resumed.steps = 1;
  resumed.resume_dir = d / "ckpt";
  resumed.metrics.clear();
  resumed.save_model = d / "resumed.onnx";
  REQUIRE(train::train(resumed));
  const auto wr = weights(resumed.save_model);
  for (const auto& [name, va] : wa)
    for (std::size_t e = 0; e < va.size(); ++e) {
      INFO("resumed " << name << "[" << e << "]");
      CHECK(wr.at(name)[e] == Approx(va[e]).margin(2e-6));
    }
  fs::remove_all(d);
}

TEST_CASE("experts added into a sum are found and split over the group", "[train][ep]") {
  // The committed user exports (tests/data/models/gen_user_exports.py): user-moe adds each
  // expert's output times its gate into a zeros_like of the tokens, user-moe-scatter runs each
  // expert on its rows (torch.where) and index_add_s them back, as Mixtral's block does. Each has
  // two such layers of four experts.
  const std::string name = GENERATE("user-moe", "user-moe-scatter");
  INFO(name);
  model::LoadOptions lo;
  lo.mode = model::LoadMode::require_data;
  auto m = model::load_model(fs::path(HP_SOURCE_DIR) / "tests/data/models" / (name + ".onnx"), lo);
  REQUIRE(m);
  auto part = train::partition_experts(*m, {0, 1}, 1);
  INFO((part ? std::string() : part.error().str()));
  REQUIRE(part);
  CHECK(part->layers == 2);
  CHECK(part->summed == 2);
  CHECK(part->routed == 0);
  REQUIRE(part->experts_of.size() == 2);
  CHECK(part->experts_of[0].size() == part->experts_of[1].size());
  CHECK(part->experts_of[1].size() == 2 * 2 * 4);  // two layers' two experts of two Linears
  onnx::ModelProto mp;
  REQUIRE(mp.ParseFromString(part->onnx));
  std::set<std::string> inits;
  for (const auto& t : mp.graph().initializer()) inits.insert(t.name());
  for (const auto& w : part->experts_of[0]) CHECK_FALSE(inits.count(w));  // member 0's are gone
  for (const auto& w : part->experts_of[1]) CHECK(inits.count(w));
  int gathers = 0, scatters = 0, skipped = 0;
  for (const auto& n : mp.graph().node()) {
    gathers += n.domain() == "hp" && n.op_type() == "AllGather";
    scatters += n.domain() == "hp" && n.op_type() == "ReduceScatter";
    skipped += n.op_type() == "Identity" && n.name().find(".ep_skip") != std::string::npos;
  }
  CHECK(scatters == 2);
  CHECK(gathers >= 2);  // the tokens and the router's output, per layer (shared ones once)
  CHECK(skipped == 4);  // member 0's two experts of each layer leave the sum
  // Under "gather", "routed" alike: these layers have no stack to route.
  auto gathered = train::partition_experts(*m, {0, 1}, 0, false);
  REQUIRE(gathered);
  CHECK(gathered->summed == 2);
  // The first layer's sum after its first expert also read outside the layer: on every member's
  // rows with this member's experts only it would be wrong there, so that layer stays whole and
  // the other is still split. (A routing value read outside is fine: the region then starts
  // after it, and it is gathered.)
  {
    auto proto = std::make_shared<onnx::ModelProto>(*m->proto);
    std::set<std::string> zeros;
    std::string partial;
    for (const auto& n : proto->graph().node()) {
      if (n.op_type() == "ConstantOfShape") zeros.insert(n.output(0));
      if (n.op_type() == "Add" && partial.empty() &&
          (zeros.count(n.input(0)) || zeros.count(n.input(1))))
        partial = n.output(0);
    }
    REQUIRE_FALSE(partial.empty());
    proto->mutable_graph()->add_output()->set_name(partial);
    model::Model leaky = *m;
    leaky.proto = std::move(proto);
    auto one = train::partition_experts(leaky, {0, 1}, 1);
    REQUIRE(one);
    CHECK(one->summed == 1);
  }
  // With the rank's dims the shapes are inferred at them and at twice the batch: the layers are
  // still found; a softmax over the rows (the first layer's router made to normalise over tokens,
  // as expert-choice routing does) keeps that layer whole.
  if (name == "user-moe-scatter") {
    const model::DimBindings dims{{"batch", 2}, {"seq", 10}};
    auto with_dims = train::partition_experts(*m, {0, 1}, 1, true, dims);
    REQUIRE(with_dims);
    CHECK(with_dims->summed == 2);
    auto proto = std::make_shared<onnx::ModelProto>(*m->proto);
    std::set<std::string> routed;  // what a TopK reads: the router's softmax (not attention's)
    for (const auto& n : proto->graph().node())
      if (n.op_type() == "TopK") routed.insert(n.input(0));
    bool changed = false;
    for (auto& n : *proto->mutable_graph()->mutable_node()) {
      if (n.op_type() != "Softmax" || changed || !routed.count(n.output(0))) continue;
      n.clear_attribute();
      auto* a = n.add_attribute();
      a->set_name("axis");
      a->set_type(onnx::AttributeProto::INT);
      a->set_i(0);
      changed = true;
    }
    REQUIRE(changed);
    model::Model over_rows = *m;
    over_rows.proto = std::move(proto);
    auto one = train::partition_experts(over_rows, {0, 1}, 1, true, dims);
    REQUIRE(one);
    CHECK(one->summed == 1);
  }
  // Four members of four experts split; three do not.
  CHECK(train::partition_experts(*m, {0, 1, 2, 3}, 3));
  auto bad = train::partition_experts(*m, {0, 1, 2}, 0);
  REQUIRE_FALSE(bad);
  CHECK(bad.error().message().find("do not split over expert_parallel = 3") != std::string::npos);
}

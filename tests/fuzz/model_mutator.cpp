// Mutations that keep a model mostly well-formed, so each one tests one broken assumption: a byte
// flip almost always dies in the protobuf parser, while changing a single dim, element type or op
// type reaches shape inference and the cost model with everything else intact.
#include "model_mutator.h"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>

#include "hp/model/summary.h"

namespace hp::fuzz {
namespace fs = std::filesystem;

namespace {

using Rng = std::mt19937_64;

std::size_t pick(Rng& rng, std::size_t n) {
  return n == 0 ? 0 : std::uniform_int_distribution<std::size_t>(0, n - 1)(rng);
}

// Dims a mutation writes: the edges of every range hp checks, and ordinary small sizes.
std::int64_t wild_dim(Rng& rng) {
  static const std::int64_t kDims[] = {0,
                                       1,
                                       2,
                                       3,
                                       7,
                                       -1,
                                       -2,
                                       4096,
                                       4097,
                                       std::int64_t{1} << 31,
                                       (std::int64_t{1} << 31) - 1,
                                       std::int64_t{1} << 40,
                                       (std::int64_t{1} << 40) + 1,
                                       std::int64_t{1} << 62,
                                       std::numeric_limits<std::int64_t>::max(),
                                       std::numeric_limits<std::int64_t>::min(),
                                       1000000000000000};
  if (rng() % 4 == 0) return static_cast<std::int64_t>(rng() % 64);
  return kDims[pick(rng, std::size(kDims))];
}

const char* const kOps[] = {"Scan",
                            "Loop",
                            "If",
                            "Reshape",
                            "Concat",
                            "MatMul",
                            "Einsum",
                            "Gather",
                            "Expand",
                            "Tile",
                            "Split",
                            "Slice",
                            "Pad",
                            "Resize",
                            "TopK",
                            "Range",
                            "Softmax",
                            "Transpose",
                            "Squeeze",
                            "Conv",
                            "Unknown",
                            "",
                            "ConstantOfShape",
                            "SequenceConstruct",
                            "Shape",
                            "Where",
                            "Cast",
                            "LayerNormalization"};

onnx::ValueInfoProto* any_value_info(onnx::GraphProto& g, Rng& rng) {
  std::size_t n = static_cast<std::size_t>(g.input_size() + g.output_size() + g.value_info_size());
  if (n == 0) return nullptr;
  std::size_t i = pick(rng, n);
  if (i < static_cast<std::size_t>(g.input_size())) return g.mutable_input(static_cast<int>(i));
  i -= static_cast<std::size_t>(g.input_size());
  if (i < static_cast<std::size_t>(g.output_size())) return g.mutable_output(static_cast<int>(i));
  return g.mutable_value_info(static_cast<int>(i - static_cast<std::size_t>(g.output_size())));
}

void mutate_proto(onnx::ModelProto& m, Rng& rng) {
  onnx::GraphProto& g = *m.mutable_graph();
  auto node = [&]() -> onnx::NodeProto* {
    return g.node_size() ? g.mutable_node(static_cast<int>(pick(rng, g.node_size()))) : nullptr;
  };
  auto init = [&]() -> onnx::TensorProto* {
    return g.initializer_size()
               ? g.mutable_initializer(static_cast<int>(pick(rng, g.initializer_size())))
               : nullptr;
  };
  switch (rng() % 14) {
    case 0:  // a declared dim of an input, output or value_info
      if (auto* v = any_value_info(g, rng); v && v->type().has_tensor_type()) {
        auto* shape = v->mutable_type()->mutable_tensor_type()->mutable_shape();
        if (shape->dim_size() == 0 || rng() % 4 == 0) {
          shape->add_dim()->set_dim_value(wild_dim(rng));
        } else {
          auto* d = shape->mutable_dim(static_cast<int>(pick(rng, shape->dim_size())));
          if (rng() % 3 == 0)
            d->set_dim_param(rng() % 2 ? "batch" : "seq");
          else
            d->set_dim_value(wild_dim(rng));
        }
      }
      break;
    case 1:  // the rank of an input: drop or add dims
      if (auto* v = any_value_info(g, rng); v && v->type().has_tensor_type()) {
        auto* shape = v->mutable_type()->mutable_tensor_type()->mutable_shape();
        if (shape->dim_size() > 0 && rng() % 2)
          shape->mutable_dim()->RemoveLast();
        else
          shape->add_dim()->set_dim_value(1 + static_cast<std::int64_t>(rng() % 5));
      }
      break;
    case 2:  // an element type
      if (auto* v = any_value_info(g, rng); v && rng() % 2)
        v->mutable_type()->mutable_tensor_type()->set_elem_type(
            static_cast<std::int32_t>(rng() % 25) - 1);
      else if (auto* t = init())
        t->set_data_type(static_cast<std::int32_t>(rng() % 25) - 1);
      break;
    case 3:  // an op type
      if (auto* n = node()) n->set_op_type(kOps[pick(rng, std::size(kOps))]);
      break;
    case 4:  // a node input: dropped, emptied or rewired
      if (auto* n = node(); n && n->input_size() > 0) {
        int i = static_cast<int>(pick(rng, n->input_size()));
        if (rng() % 3 == 0)
          n->mutable_input()->RemoveLast();
        else if (rng() % 2)
          n->set_input(i, "");
        else if (g.input_size() > 0)
          n->set_input(i, g.input(static_cast<int>(pick(rng, g.input_size()))).name());
      }
      break;
    case 5:  // a node dropped
      if (g.node_size() > 0) {
        int i = static_cast<int>(pick(rng, g.node_size()));
        g.mutable_node()->SwapElements(i, g.node_size() - 1);
        g.mutable_node()->RemoveLast();
      }
      break;
    case 6:  // an initializer's dims
      if (auto* t = init()) {
        if (t->dims_size() == 0 || rng() % 3 == 0)
          t->add_dims(wild_dim(rng));
        else
          t->set_dims(static_cast<int>(pick(rng, t->dims_size())), wild_dim(rng));
      }
      break;
    case 7:  // an integer attribute (axis, perm, ...) or a Constant's tensor
      if (auto* n = node(); n && n->attribute_size() > 0) {
        auto* a = n->mutable_attribute(static_cast<int>(pick(rng, n->attribute_size())));
        if (a->has_t() && a->t().dims_size() > 0)
          a->mutable_t()->set_dims(0, wild_dim(rng));
        else if (a->ints_size() > 0)
          a->set_ints(static_cast<int>(pick(rng, a->ints_size())), wild_dim(rng));
        else
          a->set_i(wild_dim(rng));
      }
      break;
    case 8:  // a small integer initializer's values (shape constants)
      if (auto* t = init(); t && t->data_type() == onnx::TensorProto::INT64) {
        std::int64_t v = wild_dim(rng);
        if (t->int64_data_size() > 0)
          t->set_int64_data(static_cast<int>(pick(rng, t->int64_data_size())), v);
        else if (t->raw_data().size() >= 8) {
          std::string raw = t->raw_data();
          std::size_t at = pick(rng, raw.size() / 8) * 8;
          raw.replace(at, 8, reinterpret_cast<const char*>(&v), 8);
          t->set_raw_data(raw);
        }
      }
      break;
    case 9:  // external data that points somewhere odd
      if (auto* t = init()) {
        static const char* const kLoc[] = {"/etc/passwd", "../../etc/passwd", "w.bin", "", "."};
        static const char* const kNum[] = {"0", "12abc", "-1", "9223372036854775807", "", "4"};
        t->clear_raw_data();
        t->set_data_location(onnx::TensorProto::EXTERNAL);
        t->clear_external_data();
        auto* kv = t->add_external_data();
        kv->set_key("location");
        kv->set_value(kLoc[pick(rng, std::size(kLoc))]);
        kv = t->add_external_data();
        kv->set_key(rng() % 2 ? "offset" : "length");
        kv->set_value(kNum[pick(rng, std::size(kNum))]);
      }
      break;
    case 10:  // the opset
      if (m.opset_import_size() > 0)
        m.mutable_opset_import(0)->set_version(static_cast<std::int64_t>(rng() % 25) - 1);
      break;
    case 11:  // two nodes swapped (breaks topological order)
      if (g.node_size() > 1)
        g.mutable_node()->SwapElements(static_cast<int>(pick(rng, g.node_size())),
                                       static_cast<int>(pick(rng, g.node_size())));
      break;
    case 12:  // a graph input's name
      if (g.input_size() > 0)
        g.mutable_input(static_cast<int>(pick(rng, g.input_size())))
            ->set_name(rng() % 2 ? "" : "x");
      break;
    default:  // an output renamed or dropped
      if (g.output_size() > 0) {
        if (rng() % 2)
          g.mutable_output()->RemoveLast();
        else
          g.mutable_output(0)->set_name("nowhere");
      }
      break;
  }
}

void mutate_bytes(std::string& s, Rng& rng) {
  if (s.empty()) return;
  switch (rng() % 3) {
    case 0:
      for (int k = 0, n = 1 + static_cast<int>(rng() % 8); k < n; ++k)
        s[pick(rng, s.size())] = static_cast<char>(rng());
      break;
    case 1: s.resize(pick(rng, s.size())); break;
    default:
      s.insert(pick(rng, s.size()), std::string(1 + rng() % 16, static_cast<char>(rng())));
      break;
  }
}

}  // namespace

std::vector<std::string> seed_models(const fs::path& source_dir) {
  std::vector<fs::path> paths = {source_dir / "recipes/models/tiny-gpt2.onnx"};
  for (const auto& e : fs::directory_iterator(source_dir / "tests/data/models"))
    if (e.path().extension() == ".onnx" && fs::file_size(e.path()) < (8 << 20))
      paths.push_back(e.path());
  std::sort(paths.begin() + 1, paths.end());
  std::vector<std::string> seeds;
  for (const auto& p : paths) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    seeds.push_back(ss.str());
  }
  return seeds;
}

std::string mutate_model(const std::string& seed, Rng& rng) {
  onnx::ModelProto m;
  if (!m.ParseFromString(seed)) return seed;
  const int n = 1 + static_cast<int>(rng() % 3);
  for (int k = 0; k < n; ++k) mutate_proto(m, rng);
  std::string out = m.SerializeAsString();
  if (rng() % 8 == 0) mutate_bytes(out, rng);
  return out;
}

int run_model_case(const std::string& bytes, const fs::path& scratch, Rng& rng) {
  {
    std::ofstream out(scratch, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  model::SummaryOptions o;
  o.model = scratch;
  o.dims = {{"batch", 2}, {"seq", 8}};
  if (rng() % 8 == 0) o.dims["seq"] = wild_dim(rng) & ((std::int64_t{1} << 41) - 1);
  auto s = model::summarize_model(o);
  if (!s) return 0;
  // Rendering reads every number the summary holds, as `hp plan --summary` prints them.
  (void)model::format_summary_text(*s);
  (void)model::format_summary_json(*s);
  return 1;
}

}  // namespace hp::fuzz

// Finding tied weights that the exporter duplicated.
//
// A language model whose output head shares the token embedding (GPT-2, many others) has one
// parameter matrix E [vocab, hidden], used by the embedding Gather and, transposed, by the head
// MatMul. PyTorch's exporter constant-folds Transpose(E) by default, so the file holds E *and* a
// separate initializer E^T [hidden, vocab]: summing initializers would count the matrix twice. We
// look for that pattern: a 2-D float initializer X [a, b] and another Y [b, a], each the only one
// of its shape, whose data are transposes of each other. The one first used later in the graph (the
// head's) is marked as the copy. Only inline data is compared; external data is never read, so a
// skeleton with absent weights cannot tell and counts both (the summary says nothing then).
#include <cstring>
#include <map>

#include "onnx_util.h"

namespace hp::model {
namespace {

// Raw bytes of an inline float tensor (raw_data, or float_data re-encoded); empty when external.
std::string inline_bytes(const onnx::TensorProto& t) {
  if (t.data_location() == onnx::TensorProto::EXTERNAL) return {};
  if (!t.raw_data().empty()) return t.raw_data();
  if (t.data_type() == onnx::TensorProto::FLOAT && t.float_data_size() > 0)
    return std::string(reinterpret_cast<const char*>(t.float_data().data()),
                       static_cast<std::size_t>(t.float_data_size()) * sizeof(float));
  if (t.data_type() == onnx::TensorProto::DOUBLE && t.double_data_size() > 0)
    return std::string(reinterpret_cast<const char*>(t.double_data().data()),
                       static_cast<std::size_t>(t.double_data_size()) * sizeof(double));
  return {};
}

bool is_transpose(const std::string& x, const std::string& y, std::int64_t rows, std::int64_t cols,
                  int es) {
  // x is [rows, cols], y is [cols, rows]: x[r][c] == y[c][r].
  if (static_cast<std::int64_t>(x.size()) != rows * cols * es || x.size() != y.size()) return false;
  const auto e = static_cast<std::size_t>(es);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      if (std::memcmp(x.data() + static_cast<std::size_t>(r * cols + c) * e,
                      y.data() + static_cast<std::size_t>(c * rows + r) * e, e) != 0)
        return false;
  return true;
}

int first_use(const Graph& g, int t) {
  int first = static_cast<int>(g.nodes.size());
  for (int c : g.tensor(t).consumers) first = std::min(first, c);
  return first;
}

}  // namespace

void mark_tied_initializers(const onnx::GraphProto& pg, Graph& g) {
  std::map<std::pair<std::int64_t, std::int64_t>, std::vector<const onnx::TensorProto*>> by_shape;
  for (const auto& t : pg.initializer())
    if (t.dims_size() == 2 && t.dims(0) != t.dims(1) && is_float_type(t.data_type()))
      by_shape[{t.dims(0), t.dims(1)}].push_back(&t);
  for (const auto& [shape, list] : by_shape) {
    if (shape.first > shape.second || list.size() != 1) continue;  // visit each pair once
    auto other = by_shape.find({shape.second, shape.first});
    if (other == by_shape.end() || other->second.size() != 1) continue;
    const onnx::TensorProto& x = *list[0];
    const onnx::TensorProto& y = *other->second[0];
    if (x.data_type() != y.data_type()) continue;
    std::string xb = inline_bytes(x), yb = inline_bytes(y);
    if (xb.empty() || !is_transpose(xb, yb, shape.first, shape.second, elem_size(x.data_type())))
      continue;
    int xi = g.find_tensor(x.name()), yi = g.find_tensor(y.name());
    if (xi < 0 || yi < 0) continue;
    bool y_is_copy = first_use(g, yi) >= first_use(g, xi);
    int copy = y_is_copy ? yi : xi;
    g.tensors[static_cast<std::size_t>(copy)].copy_of = y_is_copy ? xi : yi;
    g.copies.push_back(copy);
  }
}

}  // namespace hp::model

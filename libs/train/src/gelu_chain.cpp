// The exported exact-GELU chain, found so autodiff differentiates it as one op (rewrite.h).
#include <cmath>

#include "rewrite.h"

namespace hp::train::detail {

/// PyTorch exports the exact GELU as Div(x, sqrt 2) -> Erf -> Add(., 1) -> Mul(x, .) -> Mul(.,
/// 0.5). Differentiated node by node that is a dozen elementwise passes reading four saved
/// intermediates; as one hp.train.GeluGrad(dY, x) it is one pass reading x, and the intermediates
/// die in the forward (where the executor fuses the chain into one Gelu, exec_fuse.cpp).
std::map<int, std::string> find_gelu_chains(const GraphWriter& w, int forward_nodes,
                                            const std::vector<std::set<std::string>>& reads) {
  std::map<int, std::string> gelu_tail;
  const auto& g = *w.graph;
  std::map<std::string, int> producer, readers;
  for (int k = 0; k < forward_nodes; ++k) {
    for (const auto& o : g.node(k).output()) producer[o] = k;
    for (const auto& i : reads[static_cast<std::size_t>(k)]) ++readers[i];
  }
  for (const auto& o : g.output()) ++readers[o.name()];
  auto sole_reader = [&](const std::string& t) -> int {
    if (readers[t] != 1) return -1;
    for (int k = 0; k < forward_nodes; ++k)
      if (reads[static_cast<std::size_t>(k)].count(t)) return k;
    return -1;
  };
  auto near = [&](const std::string& t, double v) {
    auto c = w.const_scalar(t);
    return c && std::abs(*c - v) <= 1e-6 * std::abs(v);
  };
  /// For a binary `op` node with constant `v` on one side (either side when it commutes): the
  /// other input.
  auto other = [&](const onnx::NodeProto& n, const char* op, double v, bool commutes) {
    if (n.op_type() != op || n.input_size() != 2) return std::string();
    if (near(n.input(1), v)) return n.input(0);
    if (commutes && near(n.input(0), v)) return n.input(1);
    return std::string();
  };
  for (int k = 0; k < forward_nodes; ++k) {
    const auto& erf = g.node(k);
    if (erf.op_type() != "Erf" || erf.input_size() != 1) continue;
    auto p = producer.find(erf.input(0));
    if (p == producer.end() || readers[erf.input(0)] != 1) continue;
    const auto& div = g.node(p->second);
    std::string x = other(div, "Div", std::sqrt(2.0), false);
    if (x.empty()) x = other(div, "Mul", std::sqrt(0.5), true);
    if (x.empty()) continue;
    int a = sole_reader(erf.output(0));
    if (a < 0 || other(g.node(a), "Add", 1.0, true) != erf.output(0)) continue;
    const std::string& sum = g.node(a).output(0);
    int m = sole_reader(sum);
    if (m < 0) continue;
    const auto& mul = g.node(m);
    if (mul.op_type() != "Mul" || mul.input_size() != 2 ||
        !((mul.input(0) == x && mul.input(1) == sum) || (mul.input(1) == x && mul.input(0) == sum)))
      continue;
    int h = sole_reader(mul.output(0));
    if (h < 0 || other(g.node(h), "Mul", 0.5, true) != mul.output(0)) continue;
    gelu_tail[h] = x;
  }
  return gelu_tail;
}

}  // namespace hp::train::detail

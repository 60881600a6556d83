// Gradient rule of the recurrent layers (LSTM, GRU, RNN; docs/training.md): one
// hp.train.RecurrentGrad node reads the gradients reaching Y, Y_h and Y_c and the forward's own
// inputs, and writes the gradients of X, W, R, B and the initial states (and LSTM's peepholes).
// The cpu kernel (plugins/cpu/cpu_ops_grad_rnn.cpp) recomputes the forward and backpropagates
// through time. What it cannot differentiate is refused here, before anything runs: clip (PyTorch
// never exports it), LSTM's input_forget, and activations other than sigmoid, tanh and relu.
#include <algorithm>
#include <cctype>

#include "grad_ctx.h"

namespace hp::train::detail {

namespace {

Status recurrent(GradCtx& c) {
  if (c.has("clip")) return c.fail("a recurrent layer with clip has no gradient rule");
  if (c.attr_i("input_forget", 0) != 0)
    return c.fail("an LSTM with input_forget has no gradient rule");
  const auto& node = c.node();
  for (const auto& a : node.attribute())
    if (a.name() == "activations")
      for (std::string n : a.strings()) {
        std::transform(n.begin(), n.end(), n.begin(),
                       [](unsigned char ch) { return std::tolower(ch); });
        if (n != "sigmoid" && n != "tanh" && n != "relu")
          return c.fail("activation '" + n +
                        "' has no gradient rule in a recurrent layer (sigmoid, tanh, relu do)");
      }
  const bool lstm = c.op_type() == "LSTM";
  std::vector<std::string> ins = {c.dout(0), c.dout(1), lstm ? c.dout(2) : std::string()};
  for (int i = 0; i < (lstm ? 8 : 6); ++i) ins.push_back(c.in(i));
  while (!ins.empty() && ins.back().empty()) ins.pop_back();  // omitted trailing inputs
  // Input positions of the gradients: X, W, R, B, initial_h, then LSTM's initial_c and P.
  std::vector<int> of = {0, 1, 2, 3, 5};
  if (lstm) of.insert(of.end(), {6, 7});
  std::vector<bool> present;
  for (int i : of) present.push_back(c.wants(i));
  std::vector<Attr> attrs = c.all_attrs();
  attrs.push_back({"cell", c.op_type()});
  auto g = c.op_opt("RecurrentGrad", ins, present, attrs, kTrainDomain);
  for (std::size_t k = 0; k < of.size(); ++k) c.grad(of[k], g[k]);
  return {};
}

}  // namespace

void register_recurrent_rules(RuleTable& t) {
  for (const char* op : {"LSTM", "GRU", "RNN"}) t[op] = recurrent;
}

}  // namespace hp::train::detail

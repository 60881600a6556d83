// Einsum: subscript sizes, output shape and multiply-accumulate count from the equation and the
// input shapes. "..." stands for broadcast leading dims; without "->" the output is "..." followed
// by the subscripts used exactly once, in alphabetical order (numpy's implicit mode).
#include "einsum.h"

#include <algorithm>

namespace hp::model {

double EinsumDims::macs() const {
  double m = 1;
  for (const auto& [c, s] : letters) m *= static_cast<double>(s);
  for (auto d : ellipsis) m *= static_cast<double>(d);
  return m;
}

std::optional<EinsumDims> analyse_einsum(const std::string& equation,
                                         const std::vector<std::vector<std::int64_t>>& inputs) {
  std::string eq;
  for (char c : equation)
    if (c != ' ') eq += c;
  auto arrow = eq.find("->");
  std::string lhs = eq.substr(0, arrow);
  EinsumDims r;
  std::map<char, int> uses;
  std::size_t start = 0, operand = 0;
  while (start <= lhs.size()) {
    std::size_t end = std::min(lhs.find(',', start), lhs.size());
    std::string term = lhs.substr(start, end - start);
    if (operand >= inputs.size()) return std::nullopt;
    const auto& shape = inputs[operand++];
    std::size_t ell = term.find("...");
    std::size_t letters = term.size() - (ell == std::string::npos ? 0 : 3);
    if (letters > shape.size() || (ell == std::string::npos && letters != shape.size()))
      return std::nullopt;
    std::size_t ell_rank = shape.size() - letters, pos = 0;
    for (std::size_t i = 0; i < term.size(); ++i) {
      if (term.compare(i, 3, "...") == 0) {
        // Right-aligned broadcast of this operand's "..." dims into the common ones.
        if (r.ellipsis.size() < ell_rank)
          r.ellipsis.insert(r.ellipsis.begin(), ell_rank - r.ellipsis.size(), 1);
        for (std::size_t k = 0; k < ell_rank; ++k) {
          auto& d = r.ellipsis[r.ellipsis.size() - ell_rank + k];
          d = std::max(d, shape[pos + k]);
        }
        pos += ell_rank;
        i += 2;
        continue;
      }
      auto& size = r.letters[term[i]];
      size = std::max(size, shape[pos++]);
      ++uses[term[i]];
    }
    start = end + 1;
  }
  if (operand != inputs.size()) return std::nullopt;
  std::string rhs;
  if (arrow != std::string::npos) {
    rhs = eq.substr(arrow + 2);
  } else {
    rhs = "...";
    for (const auto& [c, n] : uses)
      if (n == 1) rhs += c;
  }
  for (std::size_t i = 0; i < rhs.size(); ++i) {
    if (rhs.compare(i, 3, "...") == 0) {
      r.output.insert(r.output.end(), r.ellipsis.begin(), r.ellipsis.end());
      i += 2;
      continue;
    }
    auto it = r.letters.find(rhs[i]);
    if (it == r.letters.end()) return std::nullopt;
    r.output.push_back(it->second);
  }
  return r;
}

}  // namespace hp::model

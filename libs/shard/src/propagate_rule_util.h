// Private: small helpers shared by the per-op sharding rules (propagate_rules.cpp) and the
// contraction rules (propagate_rules_contract.cpp).
#pragma once

#include <algorithm>
#include <set>

#include "propagate_rules.h"

namespace hp::shard::detail {

inline const onnx::AttributeProto* find_attr(const onnx::NodeProto& n, const char* name) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

inline std::int64_t attr_int(const onnx::NodeProto& n, const char* name, std::int64_t dflt) {
  const auto* a = find_attr(n, name);
  return a ? a->i() : dflt;
}

inline std::vector<std::int64_t> attr_ints(const onnx::NodeProto& n, const char* name) {
  const auto* a = find_attr(n, name);
  if (!a) return {};
  return {a->ints().begin(), a->ints().end()};
}

inline int norm_axis(std::int64_t axis, std::size_t rank) {
  return static_cast<int>(axis < 0 ? axis + static_cast<std::int64_t>(rank) : axis);
}

inline std::int64_t axes_size(const Mesh& m, const Entry& e) {
  std::int64_t n = 1;
  for (int a : e) n *= m.dims[static_cast<std::size_t>(a)];
  return n;
}

inline bool divides(const Mesh& m, const Entry& e, std::int64_t size) {
  std::int64_t n = axes_size(m, e);
  return n > 0 && size % n == 0;
}

inline Sharding make(std::vector<Entry> dims, std::vector<PartialAxis> partial = {}) {
  return Sharding{std::move(dims), std::move(partial)};
}

inline std::vector<PartialAxis> sum_over(const Entry& axes) {
  std::vector<PartialAxis> p;
  for (int a : axes) p.push_back({a, ReduceOp::sum});
  return p;
}

// Clears entries whose axes an earlier dim (in `order`) already uses, so no axis splits two dims.
inline void make_unique(std::vector<Entry>& dims, const std::vector<int>& order,
                        std::set<int> used = {}) {
  for (int d : order) {
    auto& e = dims[static_cast<std::size_t>(d)];
    bool clash = std::any_of(e.begin(), e.end(), [&](int a) { return used.count(a) > 0; });
    if (clash) e.clear();
    used.insert(e.begin(), e.end());
  }
}

inline std::vector<int> iota_order(std::size_t n) {
  std::vector<int> o(n);
  for (std::size_t i = 0; i < n; ++i) o[i] = static_cast<int>(i);
  return o;
}

inline RuleResult base(const RuleContext& c) {
  RuleResult r;
  r.req.resize(c.in.size());
  r.why.resize(c.in.size());
  for (std::size_t k = 0; k < c.in.size(); ++k) r.req[k] = c.in[k].cur;  // no requirement
  r.req_blocked.assign(c.in.size(), -1);
  r.out_blocked.assign(c.out_shapes.size(), -1);
  r.out.resize(c.out_shapes.size());
  for (std::size_t j = 0; j < c.out_shapes.size(); ++j)
    r.out[j] = Sharding::replicated(c.out_shapes[j].size());
  return r;
}

// Replicated inputs and outputs: correct for any op.
inline RuleResult replicate_all(const RuleContext& c) {
  RuleResult r = base(c);
  for (std::size_t k = 0; k < c.in.size(); ++k)
    r.req[k] = Sharding::replicated(c.in[k].shape.size());
  return r;
}

// Contraction rules (propagate_rules_contract.cpp): a split contracted dim leaves a partial sum.
RuleResult matmul(const RuleContext& c, bool gemm);
RuleResult einsum(const RuleContext& c);
RuleResult gather(const RuleContext& c);
RuleResult conv(const RuleContext& c);

}  // namespace hp::shard::detail

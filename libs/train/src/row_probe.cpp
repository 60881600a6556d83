// row_checks (expert_accumulate.h): what the graph's shapes say about a summed expert layer's rows.
#include <memory>
#include <optional>
#include <utility>

#include "expert_accumulate.h"
#include "hp/model/graph.h"

namespace hp::train::detail {

namespace {

// What the graph's shapes say about the rows: inferred at the rank's dims and at twice its batch
// (the first dim of every graph input), a tensor's dims that change are the rows'. Nothing is
// known where no input's first dim is a bound symbol (a static batch).
class Probe {
 public:
  Probe(const model::Model& m, const Index& ix, const model::DimBindings& dims) : ix_(ix) {
    model::DimBindings twice = dims;
    bool doubled = false;
    for (const auto& in : m.proto->graph().input()) {
      const auto& shape = in.type().tensor_type().shape();
      if (shape.dim_size() == 0 || shape.dim(0).dim_param().empty()) continue;
      if (auto it = twice.find(shape.dim(0).dim_param()); it != twice.end() && it->second > 0) {
        it->second = 2 * dims.at(it->first);
        doubled = true;
      }
    }
    if (!doubled) return;
    auto a = model::build_graph(m, dims), b = model::build_graph(m, twice);
    if (a && b) graphs_.emplace(std::move(*a), std::move(*b));
  }
  bool known() const { return graphs_.has_value(); }

  // Whether a shape value does not depend on the rows: every Shape it comes from is read at
  // entries (one Gather's constant index; all of them otherwise) whose dims do not change. A Size,
  // or a Shape with start/end, is taken as depending on them.
  bool shape_free(const std::string& t) const {
    for (int k : ix_.ancestors(t)) {
      const auto& n = ix_.g.node(k);
      if (n.op_type() == "Size") return false;
      if (n.op_type() != "Shape") continue;
      if (n.attribute_size() > 0) return false;
      std::optional<std::int64_t> at;
      if (auto r = ix_.readers.find(n.output(0)); r != ix_.readers.end() && r->second.size() == 1) {
        const auto& reader = ix_.g.node(r->second[0]);
        auto i = reader.input_size() > 1 ? ix_.ints(reader.input(1)) : std::nullopt;
        if (reader.op_type() == "Gather" && i && i->size() == 1) at = (*i)[0];
      }
      if (!same_dims(n.input(0), at)) return false;
    }
    return true;
  }
  // Whether axis 0 of `t` is the rows: it doubles, the other dims stay.
  bool rows_first(const std::string& t) const {
    const auto* d = dims(t);
    if (!d || d->first.empty() || !d->first[0].known() || !d->second[0].known() ||
        d->second[0].value != 2 * d->first[0].value)
      return false;
    for (std::size_t i = 1; i < d->first.size(); ++i)
      if (!d->first[i].known() || d->first[i].value != d->second[i].value) return false;
    return true;
  }
  // The one axis of `t` that doubles (the others stay), and its rank.
  std::optional<std::pair<std::int64_t, std::int64_t>> rows_axis(const std::string& t) const {
    const auto* d = dims(t);
    if (!d) return std::nullopt;
    std::optional<std::int64_t> row;
    for (std::size_t i = 0; i < d->first.size(); ++i) {
      if (!d->first[i].known() || !d->second[i].known()) return std::nullopt;
      if (d->first[i].value == d->second[i].value) continue;
      if (row || d->second[i].value != 2 * d->first[i].value) return std::nullopt;
      row = static_cast<std::int64_t>(i);
    }
    if (!row) return std::nullopt;
    return std::pair{*row, static_cast<std::int64_t>(d->first.size())};
  }

 private:
  using Dims = std::vector<model::Dim>;
  // `t`'s dims in both graphs, when it has a shape of one rank in both.
  const std::pair<Dims, Dims>* dims(const std::string& t) const {
    const int ia = graphs_->first.find_tensor(t), ib = graphs_->second.find_tensor(t);
    if (ia < 0 || ib < 0) return nullptr;
    cache_ = {graphs_->first.tensor(ia).dims, graphs_->second.tensor(ib).dims};
    return cache_.first.size() == cache_.second.size() ? &cache_ : nullptr;
  }
  bool same_dims(const std::string& tensor, std::optional<std::int64_t> at) const {
    const auto* d = dims(tensor);
    if (!d || d->first.empty()) return false;
    auto same = [&](std::size_t i) {
      return d->first[i].known() && d->first[i].value == d->second[i].value;
    };
    if (!at) {
      for (std::size_t i = 0; i < d->first.size(); ++i)
        if (!same(i)) return false;
      return true;
    }
    const auto rank = static_cast<std::int64_t>(d->first.size());
    const std::int64_t i = *at < 0 ? *at + rank : *at;
    return i >= 0 && i < rank && same(static_cast<std::size_t>(i));
  }
  const Index& ix_;
  std::optional<std::pair<model::Graph, model::Graph>> graphs_;
  mutable std::pair<Dims, Dims> cache_;
};

}  // namespace

RowChecks row_checks(const model::Model& m, const Index& ix, const model::DimBindings& dims) {
  auto p = std::make_shared<const Probe>(m, ix, dims);
  if (!p->known()) return {};
  return {[p](const std::string& t) { return p->shape_free(t); },
          [p](const std::string& t) -> std::optional<bool> { return p->rows_first(t); },
          [p](const std::string& t) { return p->rows_axis(t); }};
}

}  // namespace hp::train::detail

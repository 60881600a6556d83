// Private to partition*.cpp: the Builder that emits one rank's partition (partition.cpp: the node
// walk, boundaries and outputs; partition_rewrite.cpp: redistributions as collectives, the
// vocabulary-parallel Gather, local Split sizes and the weights' slices), and small proto helpers.
#pragma once

#include <onnx/onnx_pb.h>

#include <fmt/core.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "hp/core/hp_domain.h"
#include "hp/shard/partition.h"

namespace hp::shard::detail {

namespace dom = hp::domain;

inline std::vector<std::int64_t> shape_of(const model::Tensor& t) { return global_shape(t); }
/// Every dim known before the model runs. A tensor that is not (the rows a data-dependent routing
/// loop picks) is whole on every rank (propagate.cpp), so its Shape and the Reshape/Expand targets
/// computed from it are left to run as exported.
inline bool static_shape(const model::Tensor& t) {
  return t.has_shape &&
         std::all_of(t.dims.begin(), t.dims.end(), [](const model::Dim& d) { return d.known(); });
}

inline std::int64_t prod(const std::vector<std::int64_t>& v) {
  std::int64_t n = 1;
  for (auto d : v) n *= d;
  return n;
}

inline void add_int_attr(onnx::NodeProto* n, std::string_view name, std::int64_t v) {
  auto* a = n->add_attribute();
  a->set_name(std::string(name));
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}

inline void add_ints_attr(onnx::NodeProto* n, std::string_view name,
                          const std::vector<std::int64_t>& v) {
  auto* a = n->add_attribute();
  a->set_name(std::string(name));
  a->set_type(onnx::AttributeProto::INTS);
  for (auto x : v) a->add_ints(x);
}

inline void add_str_attr(onnx::NodeProto* n, std::string_view name, const std::string& v) {
  auto* a = n->add_attribute();
  a->set_name(std::string(name));
  a->set_type(onnx::AttributeProto::STRING);
  a->set_s(v);
}

inline void set_value_info(onnx::ValueInfoProto* v, const std::string& name, std::int32_t elem,
                           const std::vector<std::int64_t>& dims) {
  v->set_name(name);
  auto* tt = v->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(elem);
  auto* sh = tt->mutable_shape();
  for (auto d : dims) sh->add_dim()->set_dim_value(d);
}

inline onnx::TensorProto int64_tensor(const std::string& name, const std::vector<std::int64_t>& v) {
  onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(onnx::TensorProto::INT64);
  t.add_dims(static_cast<std::int64_t>(v.size()));
  for (auto x : v) t.add_int64_data(x);
  return t;
}

// Emits one rank's program.
class Builder {
 public:
  Builder(const PartitionPlan& plan, int stage, std::int64_t position)
      : plan_(plan),
        g_(*plan.graph),
        prop_(*plan.prop),
        pg_(plan.model->proto->graph()),
        stage_(plan.stages[static_cast<std::size_t>(stage)]),
        s_(stage),
        pos_(position) {}

  Expected<RankPartition> build();

 private:
  // The passes of build(), in order.
  void add_inputs_and_recvs();  ///< graph inputs this stage reads, hp.Recv of earlier stages'
                                ///< activations
  void plan_renames();  ///< graph outputs whose layout changes get a ".hp_pre" name where produced
  void add_shape_constant(int i);  ///< Shape/Size as a constant of the global shape
  Status add_node(int i);  ///< one node: inputs redistributed, outputs renamed, local targets
  /// The outer values a node's subgraphs read (`n`: the node as written): weights added whole,
  /// anything split or from another stage refused (Errc::not_implemented), renamed values renamed
  /// inside.
  Status add_captured(onnx::NodeProto& n);
  Status add_outputs();  ///< graph outputs produced here, in the layout asked of them
  void add_sends();      ///< hp.Send of activations later stages read
  void find_varying();   ///< RankPartition::varying
  std::string renamed(const std::string& s) const {
    auto it = rename_.find(s);
    return it == rename_.end() ? s : it->second;
  }

  std::int64_t rank_of(const StageNodes& st, std::int64_t position) const {
    return st.ranks[static_cast<std::size_t>(position)];
  }
  std::vector<std::int64_t> local(int t, const Sharding& s) const {
    return local_shape(prop_.mesh, s, shape_of(g_.tensor(t)), pos_);
  }
  std::vector<std::int64_t> group_of(const RedistStep& st) const {
    for (const auto& grp : st.groups)
      if (std::find(grp.begin(), grp.end(), pos_) != grp.end()) {
        std::vector<std::int64_t> out;
        for (auto p : grp) out.push_back(rank_of(stage_, p));
        return out;
      }
    return {};
  }
  std::string fresh(const std::string& base) { return fmt::format("{}.hp{}", base, counter_++); }
  Expected<std::string> redistribute(int tensor, const std::string& name, const Redistribution& r);
  Status add_initializer(int t);
  Status vocab_parallel_gather(int i, onnx::NodeProto n);
  Status local_split_sizes(int i, onnx::NodeProto& n);
  std::string scalar(const std::string& base, std::int32_t type, std::int64_t v) {
    std::string name = fresh(base);
    onnx::TensorProto* t = out_->add_initializer();
    t->set_name(name);
    t->set_data_type(type);
    if (type == onnx::TensorProto::INT32)
      t->add_int32_data(static_cast<std::int32_t>(v));
    else
      t->add_int64_data(v);
    return name;
  }
  onnx::NodeProto* op(const std::string& type, std::vector<std::string> in,
                      const std::string& out) {
    onnx::NodeProto* n = out_->add_node();
    n->set_op_type(type);
    n->set_name(fresh(out));
    for (auto& x : in) n->add_input(x);
    n->add_output(out);
    return n;
  }

  const PartitionPlan& plan_;
  const model::Graph& g_;
  const Propagation& prop_;
  const onnx::GraphProto& pg_;
  const StageNodes& stage_;
  int s_;
  std::int64_t pos_;
  onnx::GraphProto* out_ = nullptr;
  RankPartition result_;
  int counter_ = 0;
  std::set<int> inits_;
  std::set<int> used_;      ///< tensors the stage's nodes read
  std::set<int> in_stage_;  ///< the stage's nodes
  std::map<std::string, std::string> rename_;
  std::map<int, const Redistribution*> out_redist_;
  std::map<std::pair<int, int>, std::string>
      redist_done_;  ///< (tensor, redistribution) -> its name
  std::map<int, std::vector<std::size_t>> redist_by_node_;
  /// Redistribution outputs and whether their layout is split or partial over tp.
  std::map<std::string, bool> redist_varying_;
};

}  // namespace hp::shard::detail

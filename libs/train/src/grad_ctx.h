// The vocabulary of gradient rules (rules_*.cpp): what a rule sees of the forward node it
// differentiates, and how it writes backward nodes into the gradient model (autodiff.cpp).
//
// A rule reads the node's inputs and outputs (by name: recomputed blocks rename them), the gradient
// arriving at each output (empty when none reaches it: a zero the rule may skip), and sets the
// gradient of each input that wants one. It emits nodes through op(); every name it gets back is
// fresh. Shapes needed at run time come from shape_of() (a Shape node, written once per tensor).
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "hp/core/expected.h"
#include "hp/model/graph.h"

namespace hp::train::detail {

inline constexpr const char* kTrainDomain = "hp.train";

/// One attribute of an emitted node.
struct Attr {
  std::string name;
  std::variant<std::int64_t, double, std::string, std::vector<std::int64_t>, std::vector<double>,
               std::vector<std::string>>
      value;
};

/// The state shared by every rule of one transformation (autodiff.cpp owns it).
struct GraphWriter {
  onnx::GraphProto* graph = nullptr;
  const model::Graph* fwd = nullptr;            ///< the forward graph's types and (symbolic) shapes
  const onnx::GraphProto* fwd_proto = nullptr;  ///< the forward graph as loaded
  std::int64_t opset = 0;                       ///< the model's ai.onnx opset
  int counter = 0;
  std::map<std::string, std::string> shapes;  ///< tensor -> its Shape node's output
  std::map<std::string, std::string> consts;  ///< constant key -> initializer name
  std::map<std::string, std::int32_t> types;  ///< elem types of tensors written by rules
  /// A recomputed clone's forward original: it has the original's type and shape.
  std::map<std::string, std::string> origin;
  const std::string& original(const std::string& t) const {
    auto it = origin.find(t);
    return it == origin.end() ? t : it->second;
  }

  std::map<std::string, const onnx::NodeProto*> made;  ///< output -> the emitted node making it
  /// Tensor parallelism (GradSpec::tp): the Identity outputs that enter a parallel region, whose
  /// gradient is all-reduced over the group given; and this rank's global rank.
  std::map<std::string, std::vector<std::int64_t>> reduce_grad;
  std::int64_t tp_rank = -1;

  std::string fresh(const std::string& hint);
  /// The node this transformation emitted that writes `t`, or null (forward tensors, constants).
  const onnx::NodeProto* emitted_producer(const std::string& t) const {
    auto it = made.find(t);
    return it == made.end() ? nullptr : it->second;
  }
  /// Appends a node; returns its outputs (n of them, fresh names unless `outs` is given).
  std::vector<std::string> emit(const std::string& op, const std::vector<std::string>& inputs,
                                int n, const std::vector<Attr>& attrs = {},
                                const std::string& domain = "", std::vector<std::string> outs = {});
  std::string i64s(const std::vector<std::int64_t>& v);  ///< 1-D int64 initializer
  std::string scalar(double v, std::int32_t elem_type);  ///< rank-0 initializer
  std::string shape_of(const std::string& t);
  /// Gives graph input or output `v` the type `elem_type` and the forward tensor `like`'s dims
  /// (without the last when `drop_last`): known dims as values, named symbols as dim_params, so the
  /// executor checks the new input against the data inputs.
  void declare_like(onnx::ValueInfoProto& v, std::int32_t elem_type, const std::string& like,
                    bool drop_last = false) const;
  std::int32_t elem_type(const std::string& t) const;  ///< 0 when unknown
  /// Dims when every one is known (the forward's static shapes), else nullopt.
  std::optional<std::vector<std::int64_t>> static_shape(const std::string& t) const;
  int rank(const std::string& t) const;  ///< -1 when unknown
  /// Values of an integer tensor that is an initializer or a Constant node's output of the forward
  /// (reduction axes, split sizes), else nullopt.
  std::optional<std::vector<std::int64_t>> const_ints(const std::string& t) const;
  /// The value of a one-element float tensor that is an initializer or a Constant node's output
  /// (a Pow's exponent), else nullopt.
  std::optional<double> const_scalar(const std::string& t) const;
};

class GradCtx {
 public:
  GradCtx(GraphWriter& w, const onnx::NodeProto& node, std::vector<std::string> ins,
          std::vector<std::string> outs, std::vector<std::string> douts, std::vector<bool> wants)
      : w_(w),
        node_(node),
        ins_(std::move(ins)),
        outs_(std::move(outs)),
        douts_(std::move(douts)),
        wants_(std::move(wants)),
        grads_(ins_.size()) {}

  const onnx::NodeProto& node() const { return node_; }
  const std::string& op_type() const { return node_.op_type(); }
  int n_in() const { return static_cast<int>(ins_.size()); }
  int n_out() const { return static_cast<int>(outs_.size()); }
  /// Forward input i ("" when omitted or past the end) and output j.
  const std::string& in(int i) const;
  const std::string& out(int j) const;
  /// Gradient arriving at output j; "" when none.
  const std::string& dout(int j) const;
  bool wants(int i) const { return i < n_in() && wants_[static_cast<std::size_t>(i)]; }
  bool any_wanted() const;
  /// Sets input i's gradient (ignored when it wants none).
  void grad(int i, const std::string& g);
  const std::vector<std::string>& grads() const { return grads_; }

  // Emitting nodes (GraphWriter::emit with one output).
  std::string op(const std::string& type, const std::vector<std::string>& inputs,
                 const std::vector<Attr>& attrs = {}, const std::string& domain = "");
  std::vector<std::string> op_n(const std::string& type, const std::vector<std::string>& inputs,
                                int n, const std::vector<Attr>& attrs = {},
                                const std::string& domain = "");
  /// A node whose outputs are only partly wanted: absent ones get an empty name (ONNX's omitted
  /// optional output).
  std::vector<std::string> op_opt(const std::string& type, const std::vector<std::string>& inputs,
                                  const std::vector<bool>& present,
                                  const std::vector<Attr>& attrs = {},
                                  const std::string& domain = "");
  std::optional<std::vector<std::int64_t>> const_ints(const std::string& t) const {
    return w_.const_ints(t);
  }
  const onnx::NodeProto* emitted_producer(const std::string& t) const {
    return w_.emitted_producer(t);
  }
  std::optional<double> const_scalar(const std::string& t) const { return w_.const_scalar(t); }
  std::string hp(const std::string& type, const std::vector<std::string>& inputs,
                 const std::vector<Attr>& attrs = {}) {
    return op(type, inputs, attrs, kTrainDomain);
  }
  std::string i64s(const std::vector<std::int64_t>& v) { return w_.i64s(v); }
  /// A scalar of the element type of tensor `like`.
  std::string scalar(double v, const std::string& like);
  std::string shape_of(const std::string& t) { return w_.shape_of(t); }
  /// g reduced to the shape of `like` (a broadcast input): SumTo unless the shapes are statically
  /// equal.
  std::string sum_to(const std::string& g, const std::string& like, const std::string& full);
  int rank(const std::string& t) const { return w_.rank(t); }
  std::int32_t elem_type(const std::string& t) const { return w_.elem_type(t); }
  std::optional<std::vector<std::int64_t>> static_shape(const std::string& t) const {
    return w_.static_shape(t);
  }
  std::int64_t opset() const { return w_.opset; }
  /// The group over which the gradient of forward tensor `t` is all-reduced (tensor
  /// parallelism's region entries), or null.
  const std::vector<std::int64_t>* reduce_group(const std::string& t) const {
    auto it = w_.reduce_grad.find(w_.original(t));
    return it == w_.reduce_grad.end() ? nullptr : &it->second;
  }
  std::int64_t tp_rank() const { return w_.tp_rank; }

  // The forward node's attributes.
  bool has(const std::string& name) const;
  std::int64_t attr_i(const std::string& name, std::int64_t dflt) const;
  double attr_f(const std::string& name, double dflt) const;
  std::string attr_s(const std::string& name, const std::string& dflt) const;
  std::vector<std::int64_t> attr_ints(const std::string& name) const;
  /// Every attribute of the forward node, to copy onto a gradient op (ConvGrad, pools).
  std::vector<Attr> all_attrs() const;

  /// An error about this node ("node 'x' (Op): <message>").
  Error fail(const std::string& message) const;

 private:
  GraphWriter& w_;
  const onnx::NodeProto& node_;
  std::vector<std::string> ins_, outs_, douts_;
  std::vector<bool> wants_;
  std::vector<std::string> grads_;
};

using Rule = std::function<Status(GradCtx&)>;
using RuleTable = std::map<std::string, Rule>;

void register_elementwise_rules(RuleTable& t);
void register_shape_rules(RuleTable& t);
void register_linalg_rules(RuleTable& t);
void register_nn_rules(RuleTable& t);
void register_reduce_rules(RuleTable& t);
void register_activation_rules(RuleTable& t);
void register_recurrent_rules(RuleTable& t);
/// The "hp"-domain collectives of a tensor-parallel partition (rules_comm.cpp).
void register_comm_rules(RuleTable& t);
/// Emits hp.AllReduce(sum) of `g` over the global ranks `group`; returns its output.
std::string all_reduce(GradCtx& c, const std::string& g, const std::vector<std::int64_t>& group);

/// ReduceSum or ReduceMean (or another Reduce*) of `x` over `axes` (every axis when empty), in the
/// form the model's opset takes: the axes are an input of ReduceSum from opset 13 and of the others
/// from opset 18, an attribute before (rules_reduce.cpp).
std::string reduce_over(GradCtx& c, const std::string& type, const std::string& x,
                        const std::vector<std::int64_t>& axes, bool keepdims);
/// Input elements per output element of a reduction or pooling `x -> y`, in x's float type.
std::string fan_in(GradCtx& c, const std::string& x, const std::string& y);

/// Op type (ai.onnx) -> rule, built once.
const RuleTable& rules();

/// Ops whose outputs carry no gradient although they are float (Floor, Sign, random ops...):
/// gradient paths stop at them.
bool cuts_gradient(const std::string& op_type);

}  // namespace hp::train::detail

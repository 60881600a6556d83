// Expert layers written as an accumulation (expert_parallel.h, docs/training.md "Expert
// parallelism"): Hugging Face's Mixtral-style loop, which runs each expert on the rows routed to it
// (torch.where on the one-hot routing, then index_add_ into a zeros_like of the tokens).
//
// In the export each expert's contribution is added to a running sum that starts at zeros
// (ConstantOfShape): sum_1 = zeros + c_1, sum_2 = sum_1 + c_2, ... Each c_i is computed by nodes
// only it needs (the expert's: its weights, its NonZero, its row gathers and its scatter), from
// tensors shared by the layer: the tokens and the router's outputs. The region of the layer is the
// sum and everything whose values only the sum needs, back to (not including) the tokens and the
// nodes that read a shared trainable weight (the router's projection): the routing itself
// (softmax, top-k, one-hot) is in it. Under expert parallelism a member all-gathers what the region
// reads (its frontier), runs the region on every member's rows with only its own experts added,
// and one reduce-scatter sums the members' partial sums and hands each member its rows back.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "expert_index.h"
#include "hp/model/graph.h"
#include "hp/model/model.h"

namespace hp::train::detail {

struct AccumulatedLayer {
  std::string start;  ///< the zeros the sum starts from
  /// Where the zeros' shape is this layer's rows, which the region must scale to every member's:
  /// the shape tensor a ConstantOfShape start reads from outside the region (torch.zeros((n, d)))
  /// or the dims of a constant start (zeros_like folded by the exporter). Both empty when the
  /// start is computed inside the region (zeros_like of the gathered tokens).
  std::string start_shape;
  std::vector<std::int64_t> start_dims;
  std::vector<int> adds;                          ///< per expert: the Add of its contribution
  std::vector<std::string> prev;                  ///< per expert: the sum that Add extends
  std::vector<std::vector<int>> nodes;            ///< per expert: the nodes only it needs
  std::vector<std::vector<std::string>> weights;  ///< per expert: the initializers only it reads
  std::set<int> region;                           ///< every node run on the gathered rows
  std::vector<std::string> frontier;              ///< what the region reads from outside it
  std::string sum;                                ///< the last Add's output: the layer's result
};

/// The accumulated expert layers of a graph: E >= 2 chained Adds from zeros (a ConstantOfShape or
/// a constant), each
/// adding a contribution whose own nodes read float initializers nobody else reads, in a region
/// of row-wise ops only (those a token's row can go through without meeting another's, bar the
/// index ops that move whole rows).
/// What the graph's shapes say about the rows (expert_parallel.cpp infers them at the rank's dims
/// and at twice its batch). Absent functions: nothing is known.
struct RowChecks {
  /// Whether a shape value does not depend on the rows (the hidden size read off `x.shape`).
  std::function<bool(const std::string&)> shape_free;
  /// Whether a tensor's axis 0 is the rows: it doubles with the batch, its other dims do not.
  /// std::nullopt where the shapes cannot tell (a static batch).
  std::function<std::optional<bool>(const std::string&)> rows_first;
  /// The rows' axis of a tensor and its rank, where the shapes tell (the one dim that doubles).
  std::function<std::optional<std::pair<std::int64_t, std::int64_t>>(const std::string&)> rows_axis;
};

/// RowChecks from the graph's shapes inferred at the rank's `dims` and at twice its batch (the
/// first dim of every graph input); empty where no such dim is bound (a static batch) or the
/// shapes cannot be inferred (row_probe.cpp). `ix` must outlive them.
RowChecks row_checks(const model::Model& m, const Index& ix, const model::DimBindings& dims);

/// A shape value the region reads from outside (`c` of `b, t, c = x.shape`, for a reshape to
/// (-1, c)) is taken as it is where `rows.shape_free` says it does not depend on the rows; a
/// zeros' shape from outside is scaled instead (AccumulatedLayer::start_shape). A frontier tensor
/// whose axis 0 `rows.rows_first` says is not the rows (a one-hot mask [E, K, N] built outside,
/// say) means the layer is not taken: gathering it would mix up the members' routing. So does a
/// softmax, top-k or reduction in the region along the rows' axis (expert-choice routing picks
/// tokens per expert: over every member's rows it would pick others).
std::vector<AccumulatedLayer> find_accumulated_layers(const Index& ix, const RowChecks& rows = {});

}  // namespace hp::train::detail

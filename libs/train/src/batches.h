// Where a training step's batch comes from (trainer.cpp): one fixed batch read from an ONNX
// test-data directory, or windows of a token stream (data.h).
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hp/exec/executor.h"
#include "hp/model/graph.h"
#include "hp/train/data.h"
#include "hp/train/trainer.h"

namespace hp::train::detail {

/// The tensors of --inputs (empty without it). Errc::bad_input for an empty directory.
Expected<std::vector<exec::HostTensor>> read_input_dir(const TrainOptions& o);
/// Binds the dim_params of graph input `name` of `g` to `dims` (what the data has).
void bind_input_dims(const onnx::GraphProto& g, const std::string& name,
                     const std::vector<std::int64_t>& dims, model::DimBindings& out);
/// The symbolic dims of `forward`'s inputs at the shapes of `given` (tensors of an input
/// directory, matched to the graph inputs by name, else by position).
model::DimBindings dims_of_tensors(const model::Model& forward,
                                   const std::vector<exec::HostTensor>& given);
/// The symbolic dims at the data's shapes: `batch` (the --inputs tensors, read once by the caller)
/// or batch x seq for a token stream's input.
model::DimBindings data_dims(const TrainOptions& o, const model::Model& forward,
                             const std::vector<exec::HostTensor>& batch);

/// Rank `part` of `parts`'s rows of a global batch: every tensor whose first dim is `rows` (the
/// labels' batch) is cut along it into `parts` equal blocks; the others (position tables, masks
/// without a batch dim) are kept whole. Errc::bad_input when `rows` does not split evenly.
Expected<std::vector<exec::HostTensor>> slice_rows(std::vector<exec::HostTensor> batch,
                                                   std::int64_t rows, int part, int parts);
/// Label positions the loss averages over: labels != -100 for cross_entropy, every element for mse.
std::int64_t label_count(const exec::HostTensor& labels, LossKind loss);

/// The graph input expert parallelism adds for the loss's gradient scale (GradSpec::loss_scale):
/// fed by the trainer each step, not part of the data.
inline constexpr const char* kLossScaleInput = "hp.loss_scale";

class BatchSource {
 public:
  /// Checks the data options against the gradient model's inputs (the labels are its last).
  /// `batch`: the --inputs tensors as read_input_dir returned them (empty for a token stream).
  static Expected<BatchSource> open(const TrainOptions& o, const exec::Executor& ex,
                                    const std::string& labels, std::vector<exec::HostTensor> batch);
  /// The batch of 0-based position `position` in the run, in graph input order.
  Expected<std::vector<exec::HostTensor>> batch(std::int64_t position) const;
  /// Label positions per batch (the tokens a step trains on).
  std::int64_t tokens() const { return tokens_; }

 private:
  std::vector<exec::HostTensor> fixed_;
  std::optional<TokenStream> stream_;
  std::int64_t batch_ = 0, seq_ = 0, vocab_ = 0, tokens_ = 0;
  std::uint64_t seed_ = 0;
  std::string input_, labels_;
};

}  // namespace hp::train::detail

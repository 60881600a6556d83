// Where a training step's batch comes from (trainer.cpp): one fixed batch read from an ONNX
// test-data directory, or windows of a token stream (data.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hp/exec/executor.h"
#include "hp/model/graph.h"
#include "hp/train/data.h"
#include "hp/train/trainer.h"

namespace hp::train::detail {

/// The symbolic dims of the forward model's inputs at the data's shapes: from the tensors of
/// --inputs (matched by name, else by position), or batch x seq for a token stream's input.
Expected<model::DimBindings> data_dims(const TrainOptions& o, const model::Model& forward);

class BatchSource {
 public:
  /// Checks the data options against the gradient model's inputs (the labels are its last).
  static Expected<BatchSource> open(const TrainOptions& o, const exec::Executor& ex,
                                    const std::string& labels);
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

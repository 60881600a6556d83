// A multi-rank training run's side of sharded checkpoints (sharded_checkpoint.h): which pieces
// this rank writes, and which it reads back at the layout it runs now. Used by trainer.cpp (data,
// tensor and expert parallelism) and pipeline_run.cpp.
#pragma once

#include <filesystem>
#include <vector>

#include "hp/comm/comm.h"
#include "hp/core/expected.h"
#include "hp/exec/tensor.h"
#include "hp/train/data_parallel.h"
#include "hp/train/expert_parallel.h"
#include "hp/train/optimizer.h"
#include "hp/train/sharded_checkpoint.h"
#include "hp/train/tensor_parallel.h"

namespace hp::train::detail {

struct ShardedLayout {
  comm::Transport* transport = nullptr;     ///< every rank of the job; null: one rank
  const TensorParallelSync* tps = nullptr;  ///< null: no tensor parallelism
  const DataParallelSync* sync = nullptr;   ///< null: no data parallelism
  const ExpertParallelSync* eps = nullptr;  ///< null: no expert parallelism
  int dp_index = 0;  ///< position in the data-parallel group: 0 writes the replicated tensors
  int tp_index = 0;  ///< position in the tensor-parallel group: 0 writes the unsplit ones
  bool lead = true;  ///< creates, commits (or abandons) the directory
};

/// Collective over every rank of the job: each writes the pieces only it holds (its slices of
/// split weights; under ZeRO its shards of the optimizer state; its experts; the first
/// data-parallel replica the replicated tensors, the first tensor-parallel member the unsplit
/// ones, the lead the buffers), then the lead swaps the directory in. A failure on any rank leaves
/// the previous checkpoint in place on all of them.
Status save_sharded(const ShardedLayout& l, const ShardedState& header,
                    const std::vector<exec::HostTensor>& params, const OptimizerState& state,
                    const std::vector<exec::HostTensor>& buffers, const std::filesystem::path& dir,
                    bool force);

struct ShardedResume {
  ShardedState header;
  std::vector<exec::HostTensor> params;  ///< this rank's, shaped as given
  OptimizerState state;                  ///< this rank's pieces (data_parallel.h) or slices
  std::vector<exec::HostTensor> buffers;
};

/// This rank's parameters (like `params`: its slices), optimizer state and buffers, read from
/// the pieces of a sharded checkpoint written at any layout by a run of optimizer `kind`
/// (Errc::bad_input when another optimizer wrote it: its state would be read as the wrong moments).
Expected<ShardedResume> load_sharded(const ShardedLayout& l, const std::filesystem::path& dir,
                                     const std::vector<exec::HostTensor>& params,
                                     const std::vector<exec::HostTensor>& buffers,
                                     OptimizerKind kind);

}  // namespace hp::train::detail

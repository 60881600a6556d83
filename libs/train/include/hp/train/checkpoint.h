// Training checkpoints and the trained model file.
//
// A checkpoint directory holds everything a resumed run needs to continue bit for bit: the weights
// (as a loadable model.onnx), the optimizer state, the step and the data position
// (docs/training.md, "Optimizers, checkpoints"). It is written into a temporary sibling and renamed
// over the old one, so a crash while writing leaves the previous checkpoint intact.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/exec/tensor.h"
#include "hp/model/model.h"
#include "hp/train/optimizer.h"

namespace hp::train {

/// Writes `forward` with the initializers named like `params` replaced by their values, atomically
/// (temporary file, then rename). Models whose weights exceed `external_threshold` bytes keep them
/// in `<path>.data` beside it (ONNX external data), as protobuf cannot hold 2 GiB. Initializers the
/// forward model kept in its own external files are copied in, so the result stands alone.
/// Errc::bad_input when a parameter is not an initializer of `forward`, is given twice, or differs
/// from it in dtype, dims or byte size (nothing is written then).
Status save_model(const model::Model& forward, const std::vector<exec::HostTensor>& params,
                  const std::filesystem::path& path,
                  std::uint64_t external_threshold = std::uint64_t{1} << 30);

struct Checkpoint {
  std::int64_t step = 0;           ///< updates done
  std::int64_t data_position = 0;  ///< batches drawn from the data so far
  std::uint64_t seed = 0;
  std::string optimizer;                 ///< "adamw" | "sgd": a resume must use the same
  std::vector<exec::HostTensor> params;  ///< named after the initializers
  OptimizerState state;                  ///< its tensors in params' order
  /// Buffers the forward updates (BatchNormalization's running statistics), named after their
  /// initializers: model.onnx holds them beside the parameters, state.json lists them.
  std::vector<exec::HostTensor> buffers;
};

/// Whether `dir` may receive checkpoints: absent, empty or an earlier checkpoint (hp's own output,
/// hp/core/fs.h check_output_dir), and neither one of `inputs` nor holding one. `force` lets it
/// replace a directory that is not hp's (--force). Checked before training starts, so a run does
/// not learn at its first checkpoint, hours in, that it may not write it. Errc::bad_input naming
/// the first foreign file otherwise.
Status check_checkpoint_dir(const std::filesystem::path& dir, bool force,
                            const std::vector<std::filesystem::path>& inputs = {});
/// Writes `c` into `dir` (replacing a previous checkpoint there atomically); `forward` gives the
/// graph model.onnx is written with; `force` as for check_checkpoint_dir.
Status save_checkpoint(const model::Model& forward, const Checkpoint& c,
                       const std::filesystem::path& dir, bool force = false);
/// Reads a checkpoint (or, when `dir` is missing, the `.<dir>.old` copy a crash in the middle of
/// save_checkpoint's swap leaves). Errc::bad_input naming the file when it is missing, truncated or
/// malformed, or disagrees with state.json.
Expected<Checkpoint> load_checkpoint(const std::filesystem::path& dir);
/// load_checkpoint for a run training with `kind`: a checkpoint another optimizer wrote is
/// Errc::bad_input (its state would be read as the wrong moments).
Expected<Checkpoint> load_checkpoint(const std::filesystem::path& dir, OptimizerKind kind);

}  // namespace hp::train

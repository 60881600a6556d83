// Sharded checkpoints: every rank writes the pieces of the tensors it holds, described by where
// their elements sit in the whole tensor, and a resumed run at any other layout reads, for each
// of its own pieces, only what intersects them (docs/training.md, "Sharded checkpoints").
//
// A piece's place is a list of runs of the whole tensor's row-major elements, which describes a
// tensor-parallel block (one run per row of the block), a ZeRO flat shard of it (a sub-list of
// those runs) and a whole tensor (one run) alike, so the reader needs no knowledge of the
// writer's degrees: it intersects run lists. Layout of a checkpoint directory:
//   state.json        format, step, optimizer step, data position, seed, optimizer, rank count
//   rank-<r>.json     rank r's pieces: tensor, kind, whole shape, runs, byte offset, size, checksum
//   rank-<r>.bin      their float32 elements, one piece after another
// The ranks write into one temporary sibling directory which the lead swaps into place only after
// every rank has written (hp/train/checkpoint.h's guarantee: a crash leaves the last checkpoint).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "hp/core/expected.h"
#include "hp/exec/tensor.h"
#include "hp/train/checkpoint.h"

namespace hp::train {

/// Elements [begin, begin + count) of a tensor, in its row-major order.
struct Extent {
  std::int64_t begin = 0, count = 0;
  bool operator==(const Extent& o) const { return begin == o.begin && count == o.count; }
};

/// Elements [first, first + count) of the sequence the runs list, in order, as runs (a flat shard
/// of a block); adjacent runs are merged.
std::vector<Extent> sub_runs(const std::vector<Extent>& runs, std::int64_t first,
                             std::int64_t count);

/// One rank's piece of one tensor: `data`'s elements, in order, are the tensor's at `runs`.
struct Shard {
  std::string tensor;               ///< the initializer's name
  std::string kind;                 ///< "param", "exp_avg", "exp_avg_sq" or "buffer"
  std::vector<std::int64_t> shape;  ///< the whole tensor's
  std::vector<Extent> runs;
  const exec::HostTensor* data = nullptr;  ///< float32, as many elements as the runs hold
};

inline constexpr const char* kShardedFormat = "hp-sharded-checkpoint";

struct ShardedState {
  std::int64_t step = 0;            ///< updates done
  std::int64_t optimizer_step = 0;  ///< OptimizerState::step
  std::int64_t data_position = 0;
  std::uint64_t seed = 0;
  std::string optimizer;  ///< "adamw" | "sgd"
  int ranks = 0;          ///< rank files in the directory
};

/// The temporary sibling every rank writes a new checkpoint of `dir` into.
std::filesystem::path sharded_temp_dir(const std::filesystem::path& dir);
/// The lead, before any rank writes: checks `dir` may be replaced (check_checkpoint_dir), then
/// creates an empty temporary directory.
Status begin_sharded(const std::filesystem::path& dir, bool force);
/// Writes rank `rank`'s files into the temporary directory of `dir`.
Status write_shards(const std::filesystem::path& dir, int rank, const std::vector<Shard>& shards);
/// The lead, after every rank wrote: state.json and the output marker, then the swap into place
/// (the previous checkpoint aside, the new one in, the old one removed).
Status commit_sharded(const std::filesystem::path& dir, const ShardedState& s);
/// The lead, after a rank failed: removes the temporary directory.
void abandon_sharded(const std::filesystem::path& dir);

/// Whether `dir` holds a sharded checkpoint (its state.json names the format).
bool is_sharded_checkpoint(const std::filesystem::path& dir);

/// A sharded checkpoint opened for reading: state.json and every rank's list of pieces.
class ShardedCheckpoint {
 public:
  /// Errc::bad_input naming the file when state.json or a rank's list is missing or malformed.
  static Expected<ShardedCheckpoint> open(const std::filesystem::path& dir);
  const ShardedState& state() const { return state_; }
  bool has(const std::string& tensor, const std::string& kind) const;
  /// The whole tensor's elements at `runs`, in order, as a float32 tensor named `tensor` shaped
  /// `dims`, read from the pieces that intersect them. Errc::bad_input naming the tensor when the
  /// pieces do not cover every element (a rank's file missing, a slice never written), a piece's
  /// size or checksum is wrong, or the checkpoint's whole shape is not `shape`.
  Expected<exec::HostTensor> read(const std::string& tensor, const std::string& kind,
                                  const std::vector<std::int64_t>& shape,
                                  const std::vector<Extent>& runs,
                                  std::vector<std::int64_t> dims) const;
  /// Every tensor whole, as a one-rank checkpoint holds them (parameters in the order the rank
  /// lists first name them): for runs that pick tensors by name from the whole model (pipeline
  /// stages, expert-parallel members), which read each whole tensor they hold.
  Expected<Checkpoint> whole() const;

 private:
  struct Piece {
    int rank = 0;
    std::int64_t offset = 0, bytes = 0;
    std::uint64_t checksum = 0;
    std::vector<std::int64_t> shape;
    std::vector<Extent> runs;
  };
  std::filesystem::path dir_;
  ShardedState state_;
  std::map<std::pair<std::string, std::string>, std::vector<Piece>> pieces_;
  std::vector<std::pair<std::string, std::string>> order_;  ///< (tensor, kind) as first listed
};

}  // namespace hp::train

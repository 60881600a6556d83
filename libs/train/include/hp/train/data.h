// Training data: one fixed batch from an ONNX test-data directory, or batches cut from a token
// stream (a flat file of uint16 or uint32 token ids, as nanoGPT's prepare scripts write) with
// next-token labels, in an order fixed by a seed and the batch's position in the run, so a resumed
// run draws the batches the uninterrupted run would have drawn.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "hp/core/expected.h"
#include "hp/exec/tensor.h"

namespace hp::train {

/// A token stream file mapped read-only.
class TokenStream {
 public:
  /// Opens `path` holding `token_bytes` (2 or 4) little-endian ids. Errc::bad_input when it is
  /// missing, empty, not a whole number of tokens, or too short for one sequence of `seq` + 1.
  static Expected<TokenStream> open(const std::filesystem::path& path, int token_bytes,
                                    std::int64_t seq);
  std::int64_t tokens() const;
  /// Token id at position i, 0 <= i < tokens() (not checked: batches read millions of tokens).
  std::int64_t at(std::int64_t i) const;

  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;
};

/// Batch number `position` (0-based over the run) of `batch` x `seq` windows: inputs [batch, seq]
/// and labels [batch, seq] (the inputs shifted by one token), both int64, named `input_name` and
/// `labels_name`. Window starts are drawn uniformly from a splitmix64 generator seeded by (seed,
/// position) (data.cpp), so the batch depends on nothing else: the same on every platform and in a
/// resumed run. Errc::bad_input when a token id is not below `vocab` (vocab 0: not checked), for a
/// non-positive batch or seq, a negative position, or a stream shorter than seq + 1.
Expected<std::vector<exec::HostTensor>> token_batch(const TokenStream& s, std::int64_t batch,
                                                    std::int64_t seq, std::uint64_t seed,
                                                    std::int64_t position, std::int64_t vocab,
                                                    const std::string& input_name,
                                                    const std::string& labels_name);

}  // namespace hp::train

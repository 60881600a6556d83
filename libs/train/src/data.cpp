// Token streams and the batches cut from them (data.h).
//
// The file is mapped read-only: a nanoGPT-sized corpus (OpenWebText's train.bin is 17 GB) must not
// be read into memory, and each batch touches only batch * (seq + 1) tokens of it.
//
// Window starts come from splitmix64 (Steele, Lea and Flood's SplittableRandom finalizer), which is
// fully specified and identical on every platform, unlike std::uniform_int_distribution. Batch
// `position` of a run seeded `seed` starts from state = mix(seed ^ mix(position)); each draw adds
// the golden-ratio increment and mixes. A draw is mapped to [0, n) by rejection (no modulo bias),
// n = tokens - seq being the number of windows whose label (one token further) is in the file. So
// batch k of a resumed run is batch k of the uninterrupted run, without replaying batches 0..k-1.
#include <fcntl.h>
#include <fmt/core.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "hp/plugin/hp_plugin.h"
#include "hp/train/data.h"

namespace hp::train {

namespace fs = std::filesystem;

struct TokenStream::Impl {
  const unsigned char* base = nullptr;
  std::size_t bytes = 0;
  int token_bytes = 2;
  std::int64_t tokens = 0;
  ~Impl() {
    if (base) ::munmap(const_cast<unsigned char*>(base), bytes);
  }
};

Expected<TokenStream> TokenStream::open(const fs::path& path, int token_bytes, std::int64_t seq) {
  const std::string where = path.string();
  if (token_bytes != 2 && token_bytes != 4)
    return Error(Errc::bad_input,
                 fmt::format("token size {} bytes is not supported (2 or 4)", token_bytes), where);
  if (seq <= 0)
    return Error(Errc::bad_input, fmt::format("sequence length {} is not positive", seq), where);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return Error(Errc::bad_input,
                 fmt::format("cannot open the token file: {}", std::strerror(errno)), where);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Error(Errc::bad_input, "the token file is not a regular file", where);
  }
  const auto bytes = static_cast<std::size_t>(st.st_size);
  auto fail = [&](std::string msg) {
    ::close(fd);
    return Error(Errc::bad_input, std::move(msg), where);
  };
  if (bytes == 0) return fail("the token file is empty");
  if (bytes % static_cast<std::size_t>(token_bytes) != 0)
    return fail(fmt::format("the token file has {} bytes, not a whole number of {}-byte tokens",
                            bytes, token_bytes));
  const auto tokens = static_cast<std::int64_t>(bytes / static_cast<std::size_t>(token_bytes));
  if (tokens < seq + 1)
    return fail(fmt::format(
        "the token file has {} tokens, too few for one sequence of {} and its next-token labels",
        tokens, seq));
  void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);  // the mapping keeps the file
  if (p == MAP_FAILED)
    return Error(Errc::runtime, fmt::format("cannot map the token file: {}", std::strerror(errno)),
                 where);
  auto impl = std::make_shared<Impl>();
  impl->base = static_cast<const unsigned char*>(p);
  impl->bytes = bytes;
  impl->token_bytes = token_bytes;
  impl->tokens = tokens;
  TokenStream s;
  s.impl_ = std::move(impl);
  return s;
}

std::int64_t TokenStream::tokens() const { return impl_ ? impl_->tokens : 0; }

std::int64_t TokenStream::at(std::int64_t i) const {
  const unsigned char* b = impl_->base + i * impl_->token_bytes;
  // Little-endian on disk whatever the host: assemble the bytes rather than reinterpret them.
  if (impl_->token_bytes == 2) return static_cast<std::int64_t>(b[0] | (b[1] << 8));
  return static_cast<std::int64_t>(std::uint32_t{b[0]} | (std::uint32_t{b[1]} << 8) |
                                   (std::uint32_t{b[2]} << 16) | (std::uint32_t{b[3]} << 24));
}

namespace {

std::uint64_t mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

struct SplitMix64 {
  std::uint64_t state;
  std::uint64_t next() { return mix(state += 0x9E3779B97F4A7C15ULL); }
  /// Uniform in [0, n), n > 0: draws below 2^64 mod n are rejected so every value is equally
  /// likely.
  std::uint64_t below(std::uint64_t n) {
    const std::uint64_t reject = (0 - n) % n;  // 2^64 mod n
    for (;;) {
      std::uint64_t x = next();
      if (x >= reject) return x % n;
    }
  }
};

exec::HostTensor i64_tensor(const std::string& name, std::int64_t batch, std::int64_t seq) {
  exec::HostTensor t;
  t.name = name;
  t.dtype = HP_I64;
  t.dims = {batch, seq};
  t.data.assign(static_cast<std::size_t>(batch * seq) * sizeof(std::int64_t), 0);
  return t;
}

}  // namespace

Expected<std::vector<exec::HostTensor>> token_batch(const TokenStream& s, std::int64_t batch,
                                                    std::int64_t seq, std::uint64_t seed,
                                                    std::int64_t position, std::int64_t vocab,
                                                    const std::string& input_name,
                                                    const std::string& labels_name) {
  if (batch <= 0 || seq <= 0)
    return Error(Errc::bad_input,
                 fmt::format("batch {} x sequence {}: both must be positive", batch, seq));
  if (position < 0)
    return Error(Errc::bad_input, fmt::format("batch position {} is negative", position));
  if (s.tokens() < seq + 1)
    return Error(Errc::bad_input,
                 fmt::format("the token stream has {} tokens, too few for a sequence of {}",
                             s.tokens(), seq));
  SplitMix64 rng{mix(seed ^ mix(static_cast<std::uint64_t>(position)))};
  const auto windows = static_cast<std::uint64_t>(s.tokens() - seq);
  exec::HostTensor x = i64_tensor(input_name, batch, seq);
  exec::HostTensor y = i64_tensor(labels_name, batch, seq);
  std::int64_t* xp = x.as<std::int64_t>();
  std::int64_t* yp = y.as<std::int64_t>();
  for (std::int64_t b = 0; b < batch; ++b) {
    const auto start = static_cast<std::int64_t>(rng.below(windows));
    for (std::int64_t j = 0; j <= seq; ++j) {
      const std::int64_t id = s.at(start + j);
      if (vocab > 0 && id >= vocab)
        return Error(Errc::bad_input,
                     fmt::format("token {} at position {} is not below the vocabulary size {}", id,
                                 start + j, vocab));
      if (j < seq) xp[b * seq + j] = id;
      if (j > 0) yp[b * seq + j - 1] = id;
    }
  }
  std::vector<exec::HostTensor> out;
  out.push_back(std::move(x));
  out.push_back(std::move(y));
  return out;
}

}  // namespace hp::train

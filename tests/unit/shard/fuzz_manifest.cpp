// Mutation driver for the shard manifest reader and what trusts it at run time: seeded mutations
// of a real `hp shard` manifest.toml (coordinates, degrees, counts, names, truncations; see
// tests/support/fuzz_mutate.h). A manifest that parses is then used the way `verify --simulate`
// uses it: every rank's input slices (job::rank_inputs) and the outputs reassembled from the
// ranks' pieces (job::assemble_outputs), on tensors of the manifest's shapes. Each case must end
// in an error value or a result, never a crash or an exception. Exit 0 with "cases N, crashes 0".
// Usage: hp_fuzz_manifest [--seconds S] [--seed N] [--crash-file F] manifest.toml...
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "../../support/fuzz_mutate.h"
#include "hp/exec/executor.h"
#include "hp/job/sharded.h"
#include "hp/shard/manifest.h"

namespace {

using hp::exec::HostTensor;

// A global tensor of the layout's shape (times the micro-batches when batched), or nullopt when it
// would be larger than the driver should allocate.
std::optional<HostTensor> global_of(const hp::shard::ManifestLayout& l, std::int64_t mb) {
  HostTensor t;
  t.name = l.tensor;
  t.dtype = HP_F32;
  t.dims = l.shape;
  if (l.batched && mb > 1 && !t.dims.empty()) t.dims[0] *= mb;
  std::int64_t n = 1;
  for (auto d : t.dims) {
    if (d < 0 || (d > 0 && n > (1 << 16) / d)) return std::nullopt;
    n *= d;
  }
  t.data.assign(static_cast<std::size_t>(n) * 4, 1);
  return t;
}

void exercise(const hp::shard::Manifest& m) {
  std::vector<hp::exec::GraphIO> wanted;
  std::vector<HostTensor> globals;
  for (const auto& l : m.inputs) {
    auto g = global_of(l, m.micro_batches);
    if (!g) return;
    wanted.push_back({l.tensor});
    globals.push_back(std::move(*g));
  }
  const int ranks = hp::job::rank_count(m);
  for (int r = 0; r < ranks; ++r) {
    (void)hp::job::stage_of(m, r);
    (void)hp::job::rank_inputs(m, r, wanted, globals);
  }
  // The outputs: each rank's piece cut by the same slicing (the manifest's outputs read as inputs),
  // then put back together.
  if (m.micro_batches != 1) return;
  hp::shard::Manifest as_inputs = m;
  as_inputs.inputs = m.outputs;
  std::vector<hp::exec::GraphIO> outs;
  std::vector<HostTensor> whole;
  for (const auto& l : m.outputs) {
    auto g = global_of(l, 1);
    if (!g) return;
    outs.push_back({l.tensor});
    whole.push_back(std::move(*g));
  }
  std::vector<std::vector<HostTensor>> per_rank(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r)
    if (auto pieces = hp::job::rank_inputs(as_inputs, r, outs, whole); pieces && !pieces->empty())
      per_rank[static_cast<std::size_t>(r)] = std::move(pieces->front());
  (void)hp::job::assemble_outputs(m, per_rank);
}

}  // namespace

int main(int argc, char** argv) {
  auto args = hp::fuzz::parse_args(argc, argv);
  hp::fuzz::install_crash_handler(args.crash_file);
  std::vector<std::string> seeds;
  if (!hp::fuzz::read_seeds(args.seeds, seeds)) return 2;
  if (seeds.empty()) {
    std::fprintf(stderr, "give a manifest.toml written by hp shard\n");
    return 2;
  }
  // The seeds themselves must read and run: otherwise the mutations test nothing.
  for (const auto& s : seeds) {
    auto m = hp::shard::parse_manifest(s, "seed.toml");
    if (!m) {
      std::fprintf(stderr, "the seed does not parse: %s\n", m.error().message().c_str());
      return 1;
    }
    exercise(*m);
  }
  std::mt19937_64 rng(args.seed);
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(args.seconds);
  long cases = 0, valid = 0, rejected = 0;
  while (std::chrono::steady_clock::now() < end) {
    for (int batch = 0; batch < 16; ++batch, ++cases) {
      std::string text = hp::fuzz::mutate(seeds[rng() % seeds.size()], rng);
      hp::fuzz::remember(text);
      try {
        auto m = hp::shard::parse_manifest(text, "fuzz.toml");
        if (!m) {
          ++rejected;
          continue;
        }
        ++valid;
        exercise(*m);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "an exception escaped: %s\n", e.what());
        hp::fuzz::fuzz_on_crash(SIGABRT);
      }
    }
  }
  std::printf("manifest fuzz: cases %ld (valid %ld, rejected %ld), crashes 0\n", cases, valid,
              rejected);
  return 0;
}

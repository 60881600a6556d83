// libFuzzer entry point for the ONNX loader + summary (built with HP_FUZZ_LIBFUZZER=ON under
// clang). Inputs are whole model files; LLVMFuzzerCustomMutator applies model_mutator.cpp's
// field-level mutations half of the time, so coverage guidance works on the same structured changes
// the CTest driver makes, not just on byte flips the protobuf parser rejects.
#include <unistd.h>

#include <cstring>

#include "model_mutator.h"

namespace {

std::filesystem::path scratch() {
  static const std::filesystem::path p = std::filesystem::temp_directory_path() /
                                         ("hp-libfuzzer-" + std::to_string(::getpid()) + ".onnx");
  return p;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::mt19937_64 rng(size);
  hp::fuzz::run_model_case(std::string(reinterpret_cast<const char*>(data), size), scratch(), rng);
  return 0;
}

extern "C" std::size_t LLVMFuzzerMutate(std::uint8_t* data, std::size_t size, std::size_t max);

extern "C" std::size_t LLVMFuzzerCustomMutator(std::uint8_t* data, std::size_t size,
                                               std::size_t max_size, unsigned int seed) {
  std::mt19937_64 rng(seed);
  if (rng() % 2) return LLVMFuzzerMutate(data, size, max_size);
  std::string out =
      hp::fuzz::mutate_model(std::string(reinterpret_cast<const char*>(data), size), rng);
  if (out.size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, out.data(), out.size());
  return out.size();
}

// Seeded mutations of ONNX models for the loader + summary fuzzers (tests/fuzz/README.md):
// byte-level (flip, truncate, insert) and protobuf-field-level (dims, element types, op types, node
// inputs, attributes, initializer data, external data), so that the cases reach past the protobuf
// parser into validation, shape inference, value evaluation and costing.
#pragma once

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace hp::fuzz {

/// The serialized seed models: tests/data/models/*.onnx and recipes/models/tiny-gpt2.onnx.
std::vector<std::string> seed_models(const std::filesystem::path& source_dir);

/// One mutated model: 1 to 3 mutations of `seed`, chosen by `rng`.
std::string mutate_model(const std::string& seed, std::mt19937_64& rng);

/// Loads `bytes` (written to `scratch`) and, when it loads, summarises it at `dims` bindings (batch
/// and seq, sometimes others) the way `hp plan --summary` does. Returns 0 for an error value, 1
/// for a summary; anything else (a crash, an exception escaping) is the bug the fuzzer looks for.
int run_model_case(const std::string& bytes, const std::filesystem::path& scratch,
                   std::mt19937_64& rng);

}  // namespace hp::fuzz

#!/usr/bin/env bash
# README command 2: install what is missing, build, and run the whole test suite twice: a normal
# build, then an AddressSanitizer + UndefinedBehaviorSanitizer build. Tests that need hardware carry
# the CTest labels cuda / ascend-hw and skip themselves when the device is absent. A third build,
# with ThreadSanitizer (hp and the plugins only), repeats simulated runs, whose ranks are threads of
# one process (tests/stress/simulate_repeat.py): a race report fails the run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc 2>/dev/null || echo 2)
"$root/packaging/install-deps.sh"

echo "== build (RelWithDebInfo)"
"$root/packaging/build.sh" build
echo "== tests (RelWithDebInfo)"
(cd "$root/build" && ctest --output-on-failure -j"$jobs")

# Every build keeps line tables only (-g1, CMakeLists.txt): reports need file:line, not variables.
# The ASan build is -O1, as the sanitizer's authors advise: it compiles about a quarter faster than
# -O2 and its reports' stacks keep more frames.
asan_flags=(-DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG"
            -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG")

if [[ ${HP_SKIP_SANITIZE:-0} != 1 ]]; then
  echo "== build (ASan + UBSan)"
  "$root/packaging/build.sh" build-asan -DHP_SANITIZE=ON -DHP_WITH_CUDA=OFF "${asan_flags[@]}"
  echo "== tests (ASan + UBSan)"
  # Leak checking is off: Open MPI and the dlopen'd plugins keep process-lifetime allocations by
  # design (plugins are never unloaded); use-after-free, overflows and UB are still fatal.
  (cd "$root/build-asan" && ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
     UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j"$jobs")
fi

if [[ ${HP_SKIP_TSAN:-0} != 1 ]]; then
  echo "== build (ThreadSanitizer: hp and plugins)"
  "$root/packaging/build.sh" build-tsan -DHP_TSAN=ON -DHP_BUILD_TESTS=OFF -DHP_WITH_CUDA=OFF
  echo "== simulated runs under ThreadSanitizer"
  shard="$root/tests/data/recipes/shard"
  HP_PLUGIN_PATH= TSAN_OPTIONS="suppressions=$root/tests/stress/tsan.supp" \
    python3 "$root/tests/stress/simulate_repeat.py" "$root/build-tsan/bin/hp" 20 \
      "$root/recipes/cpu-dp2-tp2.toml" "$root/recipes/cpu-tp2.toml" "$shard/gpt2-dp2-tp2-pp2.toml" \
      "$shard/llama-tp4.toml" "$shard/moe-dp2-tp2-pp2.toml" "$shard/vit-dp2-tp2.toml"
  # Training ranks as threads: each rank's compute and gradient-reduction threads beside its peers'
  # (ZeRO, HSDP, tensor and expert parallelism), against torch (needs python3-torch, else skipped).
  echo "== simulated training under ThreadSanitizer"
  HP_PLUGIN_PATH= TSAN_OPTIONS="suppressions=$root/tests/stress/tsan.supp" \
    /usr/bin/python3 "$root/tests/train/run_distributed.py" "$root/build-tsan/bin/hp" \
      "$root/build-tsan/train-tsan" --models gpt2,moe --simulate-only ||
    [[ $? == 77 ]]
  # ZeRO-3 with pipeline stages: each rank's parts fetching from its gather thread while the send
  # and reduction threads run.
  HP_PLUGIN_PATH= TSAN_OPTIONS="suppressions=$root/tests/stress/tsan.supp" \
    /usr/bin/python3 "$root/tests/train/run_pipeline.py" "$root/build-tsan/bin/hp" \
      "$root/build-tsan/pipeline-tsan" --models gpt2 --deep-models "" --ep-models "" \
      --layouts dp2xpp2-zero3-1f1b-m2,dp2xtp2xpp2-zero3-zbh1 ||
    [[ $? == 77 ]]
fi

#!/usr/bin/env bash
# README command 2: install what is missing, build, and run the whole test suite twice: a normal
# build, then an AddressSanitizer + UndefinedBehaviorSanitizer build. Tests that need hardware carry
# the CTest labels cuda / ascend-hw and skip themselves when the device is absent.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc 2>/dev/null || echo 2)
"$root/packaging/install-deps.sh"

echo "== build (RelWithDebInfo)"
"$root/packaging/build.sh" build
echo "== tests (RelWithDebInfo)"
(cd "$root/build" && ctest --output-on-failure -j"$jobs")

if [[ ${HP_SKIP_SANITIZE:-0} != 1 ]]; then
  echo "== build (ASan + UBSan)"
  "$root/packaging/build.sh" build-asan -DHP_SANITIZE=ON -DHP_WITH_CUDA=OFF
  echo "== tests (ASan + UBSan)"
  # Leak checking is off: Open MPI and the dlopen'd plugins keep process-lifetime allocations by
  # design (plugins are never unloaded); use-after-free, overflows and UB are still fatal.
  (cd "$root/build-asan" && ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
     UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j"$jobs")
fi

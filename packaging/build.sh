#!/usr/bin/env bash
# Configures and builds hp into a build directory (default: build/). Extra arguments go to cmake's
# configure step, e.g. `packaging/build.sh build-asan -DHP_SANITIZE=ON`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-build}; shift || true
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S "$root" -B "$root/$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build "$root/$dir" -j"$jobs"

#!/usr/bin/env bash
# Formats hp's C++ sources in place with clang-format and the repository's .clang-format (the CTest
# test style/clang-format checks the same set of files).
set -euo pipefail
cd "$(dirname "$0")/.."
git ls-files -z --cached --others --exclude-standard -- 'libs/*.cpp' 'libs/*.h' 'apps/*.cpp' 'apps/*.h' 'plugins/*.cpp' 'plugins/*.h' 'plugins/*.cu' \
  'tests/*.cpp' 'tests/*.h' | xargs -0 clang-format --style=file -i

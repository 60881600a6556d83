#!/usr/bin/env bash
# Fails when a C++ source of hp is not formatted as .clang-format says (100 columns, Google-based),
# naming each file and the first lines that differ. Usage: check_format.sh CLANG_FORMAT SOURCE_DIR
# Fix with packaging/format.sh.
set -euo pipefail
clang_format=$1
root=$2
cd "$root"
bad=0
while IFS= read -r -d '' f; do
  if ! diff -q "$f" <("$clang_format" --style=file "$f") >/dev/null; then
    echo "not formatted: $f"
    diff "$f" <("$clang_format" --style=file "$f") | head -6 || true
    bad=$((bad + 1))
  fi
done < <(git ls-files -z --cached --others --exclude-standard -- 'libs/*.cpp' 'libs/*.h' 'apps/*.cpp' 'apps/*.h' 'plugins/*.cpp' 'plugins/*.h' \
           'plugins/*.cu' 'tests/*.cpp' 'tests/*.h' 2>/dev/null || find libs apps plugins tests \
           \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' \) -print0)
if [ "$bad" -gt 0 ]; then
  echo "$bad file(s) not formatted; run packaging/format.sh"
  exit 1
fi
echo "all sources formatted"

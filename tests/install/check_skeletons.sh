#!/usr/bin/env bash
# The committed skeleton models are what recipes/skeletons/gen_skeletons.py writes, byte for byte, so
# the generator stays the source of truth for them (and the recipes planned on them).
# Usage: check_skeletons.sh PYTHON SOURCE_DIR
set -uo pipefail
python=$1 dir=$2/recipes/skeletons
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$python" "$dir/gen_skeletons.py" "$tmp" >/dev/null || { echo "FAIL: gen_skeletons.py failed"; exit 1; }
fail=0 n=0
for f in "$tmp"/*.onnx; do
  n=$((n + 1))
  cmp -s "$f" "$dir/$(basename "$f")" || { echo "FAIL: $(basename "$f") differs from what gen_skeletons.py writes"; fail=1; }
done
for f in "$dir"/*.onnx; do
  [[ -f $tmp/$(basename "$f") ]] || { echo "FAIL: $(basename "$f") is not made by gen_skeletons.py"; fail=1; }
done
(( n > 0 )) || { echo "FAIL: gen_skeletons.py wrote no models"; fail=1; }
(( fail )) && exit 1
echo "ok: $n skeletons match gen_skeletons.py"

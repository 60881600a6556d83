#!/usr/bin/env bash
# Runs the recipe and manifest mutation drivers (tests/unit/recipe/fuzz_recipe.cpp,
# tests/unit/shard/fuzz_manifest.cpp) for a given time and prints the cases run and the crashes.
# The manifest seed is written afresh by `hp shard` (the 8-rank GPT-2 recipe of tests/data).
#   fuzz_recipe.sh [--seconds S (default 3600, split between the drivers)] [--hp BUILD/apps/hp/hp]
#                  [--drivers BUILD/tests/unit] [--only recipe|manifest] [--keep DIR]
# Each driver runs in rounds of at most 300 s with a new seed each, so a crash costs one round and
# the rest of the time still runs; a crashing case is kept as DIR/crash-<driver>-<seed>.toml.
# Exit status: 0 when no driver crashed or failed, 1 otherwise, 2 on a usage error.
set -u
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../../.." && pwd)
seconds=3600 hp="" drivers="" only="" keep=""
while (( $# )); do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --hp) hp=$2; shift 2 ;;
    --drivers) drivers=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --keep) keep=$2; shift 2 ;;
    *) echo "usage: $0 [--seconds S] [--hp HP] [--drivers DIR] [--only recipe|manifest] [--keep DIR]" >&2; exit 2 ;;
  esac
done
[[ -n $hp ]] || hp=$src/build/apps/hp/hp
[[ -n $drivers ]] || drivers=$src/build/tests/unit
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
[[ -n $keep ]] || keep=$tmp/crashes
mkdir -p "$keep"
recipe_seed=$src/tests/data/recipes/shard/gpt2-dp2-tp2-pp2.toml
names=(recipe manifest)
[[ -n $only ]] && names=("$only")
per=$(( seconds / ${#names[@]} ))
(( per >= 1 )) || per=1
status=0
for name in "${names[@]}"; do
  case $name in
    recipe) bin=$drivers/recipe/hp_fuzz_recipe; seed_files=("$recipe_seed") ;;
    manifest)
      bin=$drivers/shard/hp_fuzz_manifest
      if ! "$hp" shard "$recipe_seed" -o "$tmp/shard" >"$tmp/shard.log" 2>&1; then
        echo "hp shard failed:"; cat "$tmp/shard.log"; exit 1
      fi
      seed_files=("$tmp/shard/manifest.toml") ;;
    *) echo "unknown driver '$name'" >&2; exit 2 ;;
  esac
  [[ -x $bin ]] || { echo "no driver $bin (build it first)" >&2; exit 2; }
  cases=0 crashes=0 failures=0 left=$per round=0
  start=$(date +%s)
  while (( left > 0 )); do
    chunk=$(( left < 300 ? left : 300 ))
    seed=$(( 1000 * round + RANDOM ))
    out=$("$bin" --seconds "$chunk" --seed "$seed" --crash-file "$keep/crash-$name-$seed.toml" \
          "${seed_files[@]}" 2>"$tmp/err")
    rc=$?
    n=$(sed -n 's/.*cases \([0-9]*\).*/\1/p' <<<"$out")
    cases=$(( cases + ${n:-0} ))
    if (( rc >= 128 )); then
      crashes=$(( crashes + 1 ))
      echo "$name: crash (signal $(( rc - 128 ))), case kept in $keep/crash-$name-$seed.toml"
    elif (( rc != 0 )); then
      failures=$(( failures + 1 )); echo "$name: failed (exit $rc):"; head -5 "$tmp/err"
    fi
    round=$(( round + 1 ))
    left=$(( per - ($(date +%s) - start) ))
  done
  echo "$name: $cases cases in $(( $(date +%s) - start )) s, crashes $crashes, failures $failures"
  (( crashes + failures == 0 )) || status=1
done
exit $status

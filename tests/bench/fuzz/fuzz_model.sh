#!/usr/bin/env bash
# Long fuzzing of the ONNX loader + `hp plan --summary` (docs/hardening.md, "Bad files").
#
#   tests/bench/fuzz/fuzz_model.sh [BUILD_DIR] [SECONDS]        (default: build, 3600)
#   FUZZ_ENGINE=libfuzzer tests/bench/fuzz/fuzz_model.sh BUILD_DIR SECONDS
#
# The default engine is the mutation driver CTest runs for 20 s (build/bin/test_model_fuzz_test),
# here run in chunks of FUZZ_CHUNK seconds (default 60) with a new seed each, so that a crash ends
# one chunk, is counted and kept (its input is the chunk's scratch model, copied to
# FUZZ_OUT/crash-SEED.onnx), and the run goes on. libfuzzer runs hp_fuzz_model_libfuzzer, built by
# configuring BUILD_DIR with clang and -DHP_FUZZ_LIBFUZZER=ON (add -DHP_SANITIZE=ON for ASan), on the
# test models as its corpus.
# Prints one line per chunk and a total: cases, crashes, seconds.
set -u
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../../.." && pwd)
build=${1:-$src/build}
seconds=${2:-3600}
chunk=${FUZZ_CHUNK:-60}
out=${FUZZ_OUT:-$(mktemp -d /tmp/hp-fuzz-model.XXXXXX)}
mkdir -p "$out"
start=$(date +%s)

if [[ ${FUZZ_ENGINE:-driver} == libfuzzer ]]; then
  bin=$build/bin/hp_fuzz_model_libfuzzer
  [[ -x $bin ]] || bin=$build/tests/fuzz/hp_fuzz_model_libfuzzer
  [[ -x $bin ]] || { echo "no hp_fuzz_model_libfuzzer in $build (configure with clang and -DHP_FUZZ_LIBFUZZER=ON)"; exit 2; }
  mkdir -p "$out/corpus"
  cp "$src"/tests/data/models/*.onnx "$out/corpus/"
  # -rss_limit_mb=0: libFuzzer's RSS limit runs on a thread of its own, and in a threaded process
  # hp infers shapes in place instead of in the child process that contains libonnx's crashes
  # (libs/model/src/shape_isolated.cpp); the fuzzer must run hp's code as the CLI runs it. The malloc
  # limit still catches runaway allocations.
  "$bin" -max_total_time="$seconds" -rss_limit_mb=0 -malloc_limit_mb=4096 -timeout=30 \
    -artifact_prefix="$out/" \
    "$out/corpus" 2>&1 | tee "$out/libfuzzer.log" | grep -E '^#[0-9]+ +(pulse|DONE)|ERROR|crash-'
  rc=${PIPESTATUS[0]}
  cases=$(grep -oE '^#[0-9]+' "$out/libfuzzer.log" | tail -1 | tr -d '#')
  # libFuzzer stops at the first crash of its own process (a non-zero exit). The inference child
  # is a fork of it with libFuzzer's handlers, so each libonnx crash hp contains there also leaves a
  # crash- file while the run goes on: those are counted apart, as what the isolation caught.
  contained=$(ls "$out" | grep -cE '^crash-')
  (( rc == 0 )) && hp_crashes=0 || hp_crashes=1
  echo "total: engine libfuzzer, ${cases:-0} cases, $hp_crashes crashes of hp's process (exit $rc)," \
    "$contained libonnx crashes contained in the inference child, $(( $(date +%s) - start )) s," \
    "artifacts in $out"
  exit $(( rc != 0 ))
fi

bin=$build/bin/test_model_fuzz_test
[[ -x $bin ]] || bin=$build/tests/fuzz/test_model_fuzz_test
[[ -x $bin ]] || { echo "no test_model_fuzz_test in $build (build it first)"; exit 2; }
total=0 crashes=0 seed=${FUZZ_SEED:-1000}
while (( $(date +%s) - start < seconds )); do
  left=$(( seconds - ($(date +%s) - start) ))
  run=$(( left < chunk ? left : chunk ))
  (( run > 0 )) || break
  log=$(HP_FUZZ_SECONDS=$run HP_FUZZ_SEED=$seed HP_FUZZ_DIR=$out timeout $(( run + 120 )) "$bin" 2>&1)
  rc=$?
  n=$(sed -nE 's/^fuzz model: seed [0-9]+, ([0-9]+) cases.*/\1/p' <<<"$log")
  if [[ $rc != 0 || -z $n ]]; then
    crashes=$(( crashes + 1 ))
    cp "$out/hp-fuzz-model-$seed.onnx" "$out/crash-$seed.onnx" 2>/dev/null
    echo "seed $seed: CRASH (exit $rc), input kept as $out/crash-$seed.onnx"
    tail -5 <<<"$log"
  else
    total=$(( total + n ))
    echo "seed $seed: $n cases in $run s"
  fi
  seed=$(( seed + 1 ))
done
echo "total: engine driver, $total cases, $crashes crashes, $(( $(date +%s) - start )) s, artifacts in $out"
exit $(( crashes > 0 ))

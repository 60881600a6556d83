#!/bin/bash
# Executor benchmark: hp (bench_executor) against ONNX Runtime's CPU provider (ort_bench.js) on the same
# models and inputs (a GPT-style decoder, a small ResNet-style CNN), at 1 and 2 threads, in one run.
# Prints a table per model with the ratio hp / ORT.
#
#   tests/bench/executor/run.sh [BUILD_DIR] [-- generator options]   (with HP_BENCH_MODELS=gpt or cnn)
#
# Env: HP_BENCH_DIR (model + input cache; default ${XDG_CACHE_HOME:-~/.cache}/hp-bench/executor),
#      HP_BENCH_ORT_DIR (where onnxruntime-node is installed; default $HP_BENCH_DIR/ort),
#      HP_BENCH_MODELS ("gpt cnn"), HP_BENCH_THREADS ("1 2"), HP_BENCH_WARMUP (3), HP_BENCH_ITERS (10), HP_BENCH_OPS=1 (hp's time per op type),
#      HP_BENCH_BF16=1 (also hp with --dtype bf16: MatMul/Conv in bfloat16, a separate column),
#      HP_BENCH_DIRECT=1 (also hp with HP_CPU_WINOGRAD=0: every convolution on oneDNN's direct kernel);
#      HP_CPU_ATTENTION=0 in the environment runs hp with exported attention unfused (no hp.nn.Attention).
# Needs /usr/bin/python3 with torch and onnx (Debian python3-torch, python3-onnx) to generate the models
# and node + npm for ONNX Runtime (`npm install --ignore-scripts onnxruntime-node`, a benchmark peer only).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
build=${1:-$root/build}
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
bench_dir=${HP_BENCH_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hp-bench/executor}
ort_dir=${HP_BENCH_ORT_DIR:-$bench_dir/ort}
threads=${HP_BENCH_THREADS:-1 2}
warmup=${HP_BENCH_WARMUP:-3}
iters=${HP_BENCH_ITERS:-10}
models=${HP_BENCH_MODELS:-gpt cnn}

exe=$build/tests/bench/executor/bench_executor
if [ ! -x "$exe" ]; then
  echo "run.sh: $exe not built (cmake --build $build --target bench_executor)" >&2
  exit 2
fi
mkdir -p "$bench_dir"
if [ ! -d "$ort_dir/node_modules/onnxruntime-node" ]; then
  echo "installing onnxruntime-node into $ort_dir ..." >&2
  mkdir -p "$ort_dir"
  (cd "$ort_dir" && npm install --ignore-scripts --no-audit --no-fund onnxruntime-node >&2)
fi

# bench NAME GENERATOR INPUT_RAW [generator options]: generates the model into the cache when the
# generator or its options changed (the GPT-style one is about 100 MB, never committed), then times
# hp and ONNX Runtime on it at each thread count and prints the table.
bench() {
  local name=$1 gen=$2 raw=$3
  shift 3
  local key model_dir
  key=$( (cat "$here/$gen"; echo "$*") | sha256sum | cut -c1-16)
  model_dir=$bench_dir/$name-$key
  if [ ! -f "$model_dir/$name-bench.onnx" ]; then
    echo "generating the $name benchmark model into $model_dir ..." >&2
    rm -rf "$model_dir.tmp"
    /usr/bin/python3 "$here/$gen" "$model_dir.tmp" "$@" >&2
    mv "$model_dir.tmp" "$model_dir"
  fi
  local model=$model_dir/$name-bench.onnx io=$model_dir/$name-bench.io dims t line
  dims=$(/usr/bin/python3 -c "import onnx; t = onnx.load_tensor('$io/input_0.pb'); print(*t.dims)")
  declare -A hp ort bf direct
  for t in $threads; do
    ops=()
    [ "${HP_BENCH_OPS:-0}" = 1 ] && ops=(--ops)
    line=$("$exe" "$model" "$io" --threads "$t" --warmup "$warmup" --iters "$iters" --expected "$io" "${ops[@]}")
    echo "$line" >&2
    hp[$t]=$(echo "$line" | sed -n 's/^hp .*median_ms=\([0-9.]*\).*/\1/p')
    line=$(NODE_PATH=$ort_dir/node_modules node "$here/ort_bench.js" "$model" "$io/$raw" "$t" "$warmup" "$iters" $dims)
    echo "$line" >&2
    ort[$t]=$(echo "$line" | sed -n 's/^ort .*median_ms=\([0-9.]*\).*/\1/p')
    if [ "${HP_BENCH_DIRECT:-0}" = 1 ]; then
      line=$(HP_CPU_WINOGRAD=0 "$exe" "$model" "$io" --threads "$t" --warmup "$warmup" --iters "$iters" --expected "$io")
      echo "direct convolutions: $line" >&2
      direct[$t]=$(echo "$line" | sed -n 's/^hp .*median_ms=\([0-9.]*\).*/\1/p')
    fi
    if [ "${HP_BENCH_BF16:-0}" = 1 ]; then
      line=$("$exe" "$model" "$io" --threads "$t" --warmup "$warmup" --iters "$iters" --expected "$io" --dtype bf16)
      echo "$line" >&2
      bf[$t]=$(echo "$line" | sed -n 's/^hp .*median_ms=\([0-9.]*\).*/\1/p')
    fi
  done
  echo
  echo "$name model ($(basename "$model_dir"), input ${dims// /x}), median of $iters runs after $warmup warm-up"
  printf '%-8s %12s %12s %10s' threads hp_ms ort_ms hp/ort
  [ "${HP_BENCH_BF16:-0}" = 1 ] && printf ' %12s %14s' hp_bf16_ms hp_bf16/ort
  [ "${HP_BENCH_DIRECT:-0}" = 1 ] && printf ' %14s %16s' hp_direct_ms hp_direct/ort
  echo
  for t in $threads; do
    printf '%-8s %12s %12s %10s' "$t" "${hp[$t]}" "${ort[$t]}" "$(awk -v a="${hp[$t]}" -v b="${ort[$t]}" 'BEGIN { printf "%.2f", a / b }')"
    [ "${HP_BENCH_BF16:-0}" = 1 ] && printf ' %12s %14s' "${bf[$t]}" "$(awk -v a="${bf[$t]}" -v b="${ort[$t]}" 'BEGIN { printf "%.2f", a / b }')"
    [ "${HP_BENCH_DIRECT:-0}" = 1 ] && printf ' %14s %16s' "${direct[$t]}" "$(awk -v a="${direct[$t]}" -v b="${ort[$t]}" 'BEGIN { printf "%.2f", a / b }')"
    echo
  done
}

for m in $models; do
  case $m in
    gpt) bench gpt gen_bench_model.py input_ids.i64 "$@" ;;
    cnn) bench cnn gen_bench_cnn.py input.f32 "$@" ;;
    *) echo "run.sh: unknown model '$m' in HP_BENCH_MODELS (gpt, cnn)" >&2; exit 2 ;;
  esac
done

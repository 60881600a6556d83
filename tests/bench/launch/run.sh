#!/bin/bash
# Launch benchmark (not a test): real `hp launch` jobs over Open MPI on this machine, in one run.
#   1. TP speedup: a GEMM-heavy MLP stack (gen_mlp.py, exported by PyTorch) on 1 rank x 1 thread,
#      1 rank x 2 threads and TP=2 (2 ranks x 1 thread); prints the median step of each and the
#      speedups of TP=2 over 1 rank at the same thread count per rank and at the same total cores.
#   2. Pipeline bubble: the bundled tiny GPT-2 on PP=2 with 1, 2, 4, 8 micro-batches (1F1B and GPipe):
#      the bubble measured by the ranks (Recv waits excluded) next to the schedule's (p-1)/(m+p-1).
#
#   tests/bench/launch/run.sh [BUILD_DIR]
# Env: HP_BENCH_DIR (model cache; default ${XDG_CACHE_HOME:-~/.cache}/hp-bench/launch), HP_BENCH_STEPS (7).
# Needs /usr/bin/python3 with torch and onnx for the model (generated, not committed).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
build=${1:-$root/build}
hp=$build/bin/hp
steps=${HP_BENCH_STEPS:-7}
bench_dir=${HP_BENCH_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hp-bench/launch}
[ -x "$hp" ] || { echo "run.sh: $hp not built" >&2; exit 2; }
if [[ $(id -u) == 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMPI_MCA_plm=${OMPI_MCA_plm:-isolated} OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}

key=$(sha256sum "$here/gen_mlp.py" | cut -c1-16)
model_dir=$bench_dir/mlp-$key
if [ ! -f "$model_dir/mlp.onnx" ]; then
  echo "generating the benchmark model into $model_dir ..." >&2
  rm -rf "$model_dir.tmp"
  /usr/bin/python3 "$here/gen_mlp.py" "$model_dir.tmp" >&2
  mv "$model_dir.tmp" "$model_dir"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

recipe() {  # name dp tp pp micro_batches schedule model dims
  cat > "$work/$1.toml" <<TOML
[recipe]
version = 1
name = "$1"
model = "$7"
cluster = "local-cpu"
nodes = $(( $2 * $3 * $4 ))
[model]
dims = { $8 }
[parallel]
dp = $2
tp = $3
pp = $4
micro_batches = $5
schedule = "$6"
TOML
}
step_of() { sed -n 's/^step: \([0-9.]*\) s.*/\1/p' | head -1; }

echo "== TP speedup: $(basename "$model_dir")/mlp.onnx (4 blocks, hidden 1024, batch 4 x seq 128), median of $steps steps"
recipe tp1 1 1 1 1 1f1b "$model_dir/mlp.onnx" "batch = 4, seq = 128"
recipe tp2 1 2 1 1 1f1b "$model_dir/mlp.onnx" "batch = 4, seq = 128"
run() { "$hp" launch "$work/$1.toml" --inputs "$model_dir/inputs" --threads "$2" --steps "$steps" --run-dir "$work/run-$1-$2" | step_of; }
t11=$(run tp1 1); t12=$(run tp1 2); t21=$(run tp2 1)
printf '%-28s %10s\n' "configuration" "step (s)"
printf '%-28s %10s\n' "1 rank x 1 thread" "$t11" "1 rank x 2 threads" "$t12" "TP=2: 2 ranks x 1 thread" "$t21"
awk -v a="$t11" -v b="$t12" -v c="$t21" 'BEGIN {
  printf "TP=2 speedup over 1 rank x 1 thread (same threads per rank): %.2fx\n", a / c;
  printf "TP=2 speedup over 1 rank x 2 threads (same cores):          %.2fx\n", b / c }'

echo
echo "== Pipeline bubble: tiny GPT-2, PP=2, batch 8 x seq 12, median of $steps steps"
printf '%-8s %4s %10s %10s %10s\n' schedule m "step (s)" measured schedule
mkdir -p "$work/gpt-in"  # token ids in [0, 256), the model's vocabulary
/usr/bin/python3 -c "
import numpy as np
from onnx import numpy_helper
t = numpy_helper.from_array(np.random.default_rng(0).integers(0, 256, size=(8, 12)).astype(np.int64), 'input_ids')
open('$work/gpt-in/input_0.pb', 'wb').write(t.SerializeToString())"
for sched in 1f1b gpipe; do
  for m in 1 2 4 8; do
    recipe "pp-$sched-$m" 1 1 2 "$m" "$sched" "$root/recipes/models/tiny-gpt2.onnx" "batch = 8, seq = 12"
    line=$("$hp" launch "$work/pp-$sched-$m.toml" --steps "$steps" --threads 1 --run-dir "$work/run-pp-$sched-$m" \
             --inputs "$work/gpt-in" | grep '^step:')
    step=$(echo "$line" | step_of)
    meas=$(echo "$line" | sed -n 's/.*bubble measured \([0-9.]*\), schedule.s \([0-9.]*\).*/\1/p')
    theo=$(echo "$line" | sed -n 's/.*bubble measured \([0-9.]*\), schedule.s \([0-9.]*\).*/\2/p')
    printf '%-8s %4s %10s %10s %10s\n' "$sched" "$m" "$step" "$meas" "$theo"
  done
done

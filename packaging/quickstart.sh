#!/usr/bin/env bash
# README command 1: install what is missing, build, and run the main job on the embedded default:
# the bundled tiny GPT-2 (recipes/models/tiny-gpt2.onnx) planned on the local CPU cluster preset,
# then planned on 4 local CPU ranks (tp=2 x pp=2), sharded, launched over Open MPI and verified against PyTorch and
# against the unsharded model.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/packaging/install-deps.sh"
"$root/packaging/build.sh" build
hp="$root/build/bin/hp"
io="$root/tests/data/models/tiny-gpt2.io/test_data_set_0"
echo "== hp devices"
"$hp" devices
echo "== hp plan --summary (the bundled model at batch 8, seq 128)"
"$hp" plan --summary --dim batch=8 --dim seq=128
echo "== hp plan: the bundled model on 4 local CPU ranks, tensor x pipeline parallel (inference, batch 2 x seq 12), written as a recipe"
run=$(mktemp -d "${TMPDIR:-/tmp}/hp-quickstart.XXXXXX")
trap 'rm -rf "$run"' EXIT
"$hp" plan --cluster local-cpu --nodes 4 --dtype fp32 --mode infer --global-batch 2 --seq 12 --fix tp=2 --fix pp=2 \
  --fix micro_batches=2 \
  -o "$run/plan.toml"
echo "== hp shard: one partition per rank + manifest"
"$hp" shard "$run/plan.toml" -o "$run/shards"
# Open MPI refuses root unless told; containers often run as root and lack ssh and process_vm_readv.
if [[ $(id -u) == 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMPI_MCA_plm=${OMPI_MCA_plm:-isolated} OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
echo "== hp launch: 4 MPI ranks run their partitions on PyTorch's test inputs"
"$hp" launch "$run/plan.toml" --shard-dir "$run/shards" --inputs "$io" --outputs "$run/out" --run-dir "$run/run" --timeout 120
echo "== hp verify: the launched outputs against PyTorch's"
"$hp" verify "$root/recipes/models/tiny-gpt2.onnx" --inputs "$io" --expected "$run/out"
echo "== hp verify: the recipe (static checks, then the sharded job against the unsharded model)"
"$hp" verify "$run/plan.toml" --timeout 120

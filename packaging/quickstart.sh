#!/usr/bin/env bash
# README command 1: install what is missing, build, and run the main job on the embedded default:
# the bundled tiny GPT-2 (recipes/models/tiny-gpt2.onnx) planned on the local CPU cluster preset,
# then run on the CPU plugin and checked against PyTorch's outputs.
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
echo "== hp plan on the local CPU preset"
"$hp" plan --cluster local-cpu --dtype fp32 --global-batch 8 --seq 128
echo "== hp verify: run the bundled model on the CPU plugin against PyTorch's outputs"
"$hp" verify "$root/recipes/models/tiny-gpt2.onnx" --inputs "$io" --expected "$io"
echo "== hp verify recipes/quickstart.toml (static recipe checks)"
"$hp" verify "$root/recipes/quickstart.toml"

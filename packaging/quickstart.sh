#!/usr/bin/env bash
# README command 1: install what is missing, build, and run the main job on the embedded default
# (the bundled tiny GPT-2 model on the local CPU cluster preset).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/packaging/install-deps.sh"
"$root/packaging/build.sh" build
hp="$root/build/bin/hp"
echo "== hp devices"
"$hp" devices
echo "== hp plan --summary (bundled model recipes/models/tiny-gpt2.onnx, local CPU preset)"
"$hp" plan --summary --cluster local-cpu --dim batch=8 --dim seq=128
echo "== hp verify recipes/quickstart.toml (static recipe checks)"
"$hp" verify "$root/recipes/quickstart.toml"

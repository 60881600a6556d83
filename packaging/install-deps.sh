#!/usr/bin/env bash
# Installs hp's build and test dependencies from Debian 12 packages. Idempotent and non-interactive:
# packages already present are left alone, and apt runs only when something is missing.
# The CUDA toolkit is optional and never installed here (the CUDA plugin is built when it is found).
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  libcli11-dev libtomlplusplus-dev libfmt-dev nlohmann-json3-dev
  libonnx-dev libprotobuf-dev protobuf-compiler libonnx-testdata
  libopenmpi-dev openmpi-bin
  catch2
  libdnnl-dev ocl-icd-opencl-dev opencl-headers
  clang-format python3        # the source checks (style/clang-format, layers, comment citations)
  python3-torch python3-onnx  # the property test exports users' model families (tests/property)
  go-md2man man-db dpkg-dev   # man pages (Markdown -> roff) and their render test; cpack's dpkg-shlibdeps
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [[ $(id -u) != 0 ]]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"

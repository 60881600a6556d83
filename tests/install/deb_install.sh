#!/usr/bin/env bash
# The .deb, end to end: `cpack -G DEB` from this build directory, `dpkg-deb -x` into a temporary root,
# then the unpacked hp runs with every HP_* variable unset, from a directory outside both trees. It
# must find its cpu plugin in <root>/usr/lib/hp/plugins, its presets in <root>/usr/share/hp/recipes/clusters
# (a preset that exists only there is planned on) and its bundled model in <root>/usr/share/hp, and
# plan, write and verify a recipe. The package must declare the Debian dependencies of what it links.
# Usage: deb_install.sh BUILD_DIR
set -uo pipefail
build=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
while IFS= read -r var; do unset "$var"; done < <(env | sed -n 's/^\(HP_[A-Za-z0-9_]*\)=.*/\1/p')
# hp verify may start an Open MPI job for a runnable recipe; CI containers run as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail=0
err() { echo "FAIL: $*"; fail=1; }
run() {  # run NAME CMD...: runs, keeps stdout in $tmp/NAME.out, fails the test on a non-zero exit
  local name=$1; shift
  "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" || { err "$name exited $? ($*)"; cat "$tmp/$name.out" "$tmp/$name.err"; }
}

start=$(date +%s%N)
elapsed() { awk -v a="$start" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }'; }
run cpack cpack -G DEB -B "$tmp/pkg" --config "$build/CPackConfig.cmake"
deb=$(ls "$tmp"/pkg/*.deb 2>/dev/null | head -1)
[[ -n $deb ]] || { err "cpack made no .deb"; exit 1; }
echo "package: $(basename "$deb"), $(stat -c %s "$deb") bytes, built in $(elapsed) s"

depends=$(dpkg-deb -f "$deb" Depends)
echo "Depends: $depends"
for pkg in libdnnl openmpi-bin libfmt libprotobuf libstdc++6; do
  grep -q "$pkg" <<<"$depends" || err "Depends lacks $pkg"
done

root=$tmp/root
dpkg-deb -x "$deb" "$root" || { err "dpkg-deb -x failed"; exit 1; }
for f in usr/bin/hp usr/lib/hp/plugins/libhp-backend-cpu.so usr/share/hp/recipes/clusters/local-cpu.toml \
         usr/share/hp/recipes/models/tiny-gpt2.onnx usr/share/hp/recipes/quickstart.toml \
         usr/share/man/man1/hp.1.gz usr/share/man/man1/hp-plan.1.gz usr/share/man/man5/hp-recipe.5.gz; do
  [[ -e $root/$f ]] || err "package lacks /$f"
done
hp=$root/usr/bin/hp
mkdir "$tmp/work" && cd "$tmp/work" || exit 1

run devices "$hp" -v devices
grep -qE "cpu .*$root/usr/lib/hp/plugins/libhp-backend-cpu.so \[install dir\]" "$tmp/devices.out" ||
  err "hp devices did not load the cpu plugin from the install dir"$'\n'"$(cat "$tmp/devices.out")"
! grep -q "(build tree)" "$tmp/devices.out" || err "the installed hp searched the build tree for plugins"

# A preset only the package has: found only through <root>/usr/share/hp/recipes/clusters.
sed 's/^name = "local-cpu"/name = "deb-test-cpu"/' "$root/usr/share/hp/recipes/clusters/local-cpu.toml" \
  >"$root/usr/share/hp/recipes/clusters/deb-test-cpu.toml"
run plan "$hp" plan --cluster deb-test-cpu --nodes 2 --global-batch 4 --seq 16 --json -o "$tmp/work/plan.toml"
grep -q '"best"' "$tmp/plan.out" || err "hp plan --json printed no best plan"
grep -q "^cluster = \"deb-test-cpu\"" "$tmp/work/plan.toml" 2>/dev/null || err "plan.toml does not name the cluster"
grep -q "$root/usr/share/hp/recipes/models/tiny-gpt2.onnx\|share/hp/recipes/models/tiny-gpt2.onnx" \
  "$tmp/work/plan.toml" 2>/dev/null || err "plan.toml does not use the packaged bundled model"
run verify "$hp" verify "$tmp/work/plan.toml" --json
# A packaged recipe, its model and preset found by relative paths inside share/hp.
run verify_quickstart "$hp" verify "$root/usr/share/hp/recipes/quickstart.toml"
# A planning recipe: a weight-less skeleton on a real preset, both inside share/hp.
run verify_llama "$hp" verify "$root/usr/share/hp/recipes/llama3-8b-cloudmatrix384.toml"

echo "install test: $(elapsed) s in all"
(( fail )) && exit 1
echo "ok: the unpacked package plans and verifies with its own plugins, presets and model"

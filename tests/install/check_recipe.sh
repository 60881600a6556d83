#!/usr/bin/env bash
# One recipe of recipes/: it opens with a header comment saying what it shows, and `hp verify RECIPE
# --json` accepts it (exit 0, "ok": true) with its model and cluster resolved relative to the recipe.
# A recipe for this machine (cluster local-cpu) is verified in full, so hp verify also runs its sharded
# job against the unsharded model; a recipe for a cluster this machine is not (planning recipes on
# weight-less skeletons for CloudMatrix384 or DGX nodes) gets the static checks (--static).
# Usage: check_recipe.sh HP RECIPE
set -uo pipefail
hp=$1 recipe=$2
# hp verify may start an Open MPI job for a runnable recipe; CI containers run as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail=0
head -1 "$recipe" | grep -qE '^# [A-Za-z]' || { echo "FAIL: $recipe does not start with a '# ' header comment"; fail=1; }
mode=()
grep -qE '^cluster *= *"local-cpu"' "$recipe" || mode=(--static)
out=$("$hp" verify "$recipe" "${mode[@]}" --json 2>&1)
rc=$?
if [[ $rc != 0 ]] || ! grep -qE '"ok": *true' <<<"$out"; then
  echo "FAIL: hp verify $recipe ${mode[*]} --json exited $rc"; echo "$out"; fail=1
fi
(( fail )) && exit 1
echo "ok: $recipe ${mode[*]}"
grep -o '"run":{[^}]*' <<<"$out" | head -c 300; echo

#!/usr/bin/env bash
# Runs one CLI test case: tests/cli/<cmd>/<behaviour>/ holds
#   args     the hp arguments, one per line (so paths with spaces work); @SRC@ = source dir,
#            @TMP@ = a fresh temp dir for this case, @DATA@ = tests/data
#   exit     the expected exit code (default 0)
#   stdout   lines that must each appear in stdout (fixed strings), optional
#   stderr   lines that must each appear in stderr (fixed strings), optional
#   env      KEY=VALUE lines exported before running, optional (same substitutions)
#   setup    optional bash script run first with SRC, TMP, DATA and HP (the hp under test) set (to
#            make malformed files, or inputs with another hp command, etc.);
#            its exit code 77 skips the case (CTest's skip: e.g. Debian's python3-torch missing)
#   repeat   optional, empty: hp runs a second time with the same arguments, and the two runs'
#            stdout must be byte-identical (output that CI scripts diff against a committed copy)
#   check    optional bash script run after hp with SRC, TMP, DATA, HP (the binary), STDOUT (also
#            as OUT) and STDERR (files holding hp's output) set: what the lines above cannot say (a
#            file hp wrote parses, numbers agree, a line that must be absent); non-zero fails
# Every case also checks that hp did not crash (no signal exit) and that error output uses the
# "hp: error:" prefix whenever the exit code is non-zero.
set -u
hp=$1; case_dir=$2; src=$3
data=$src/tests/data
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
subst() { sed -e "s|@SRC@|$src|g" -e "s|@TMP@|$tmp|g" -e "s|@DATA@|$data|g"; }

if [[ -f $case_dir/setup ]]; then
  SRC=$src TMP=$tmp DATA=$data HP=$hp bash "$case_dir/setup"
  setup_rc=$?
  if [[ $setup_rc == 77 ]]; then echo "skipped: the setup script says so"; exit 77; fi
  [[ $setup_rc == 0 ]] || { echo "FAIL: setup script failed"; exit 1; }
fi
if [[ -f $case_dir/env ]]; then
  while IFS= read -r line; do [[ -n $line ]] && export "$(printf '%s' "$line" | subst)"; done <"$case_dir/env"
fi
args=()
if [[ -f $case_dir/args ]]; then
  while IFS= read -r line; do [[ -n $line ]] && args+=("$(printf '%s' "$line" | subst)"); done <"$case_dir/args"
fi
expected_exit=0
[[ -f $case_dir/exit ]] && expected_exit=$(tr -d '[:space:]' <"$case_dir/exit")

timeout 120 "$hp" "${args[@]}" >"$tmp/.out" 2>"$tmp/.err" </dev/null
rc=$?
fail=0
if [[ $rc != "$expected_exit" ]]; then
  echo "FAIL: exit code $rc, expected $expected_exit"; fail=1
fi
if (( rc >= 124 )); then echo "FAIL: hp crashed, hung or was killed (rc $rc)"; fail=1; fi
if [[ $rc != 0 ]] && ! grep -q '^hp: error: ' "$tmp/.err"; then
  echo "FAIL: non-zero exit without an 'hp: error:' line on stderr"; fail=1
fi
if [[ -f $case_dir/repeat ]]; then
  timeout 120 "$hp" "${args[@]}" >"$tmp/.out2" 2>/dev/null </dev/null
  if ! cmp -s "$tmp/.out" "$tmp/.out2"; then
    echo "FAIL: a second run's stdout differs from the first:"; diff "$tmp/.out" "$tmp/.out2" | head -20
    fail=1
  fi
fi
for stream in stdout stderr; do
  [[ -f $case_dir/$stream ]] || continue
  file=$tmp/.out; [[ $stream == stderr ]] && file=$tmp/.err
  while IFS= read -r want; do
    [[ -z $want ]] && continue
    want=$(printf '%s' "$want" | subst)
    if ! grep -qF -- "$want" "$file"; then echo "FAIL: $stream lacks: $want"; fail=1; fi
  done <"$case_dir/$stream"
done
if [[ -f $case_dir/check ]]; then
  if ! SRC=$src TMP=$tmp DATA=$data HP=$hp OUT=$tmp/.out STDOUT=$tmp/.out STDERR=$tmp/.err \
      bash "$case_dir/check" >"$tmp/.check" 2>&1; then
    echo "FAIL: the check script failed:"; cat "$tmp/.check"; fail=1
  fi
fi
if (( fail )); then
  echo "--- command: hp ${args[*]}"; echo "--- stdout:"; head -c 4000 "$tmp/.out"; echo "--- stderr:"; head -c 4000 "$tmp/.err"
  exit 1
fi
echo "ok: hp ${args[*]}"

#!/usr/bin/env bash
# The built man pages against the program and the formats they document:
#   1. every page renders with `man -l --warnings` at 80 columns without a warning;
#   2. every option `hp <cmd> --help` prints (and every option and command of `hp --help`) appears in
#      the rendered page hp-<cmd>(1) (hp(1));
#   3. every documented recipe and cluster key (hp_man_keys --list, i.e. schema_doc.h) appears under its
#      section in the rendered hp-recipe(5), and so does every [section] key actually written in the
#      TOML files under recipes/ (presets, example recipes), so the page also covers real files.
# Usage: check_man.sh HP HP_MAN_KEYS MAN_BUILD_DIR SOURCE_DIR
set -uo pipefail
hp=$1 man_keys=$2 man_dir=$3 src=$4
fail=0
err() { echo "FAIL: $*"; fail=1; }

# Plain text of a page, wide enough that no option is split across lines.
render() { MANWIDTH=200 LC_ALL=C.UTF-8 man -l -E ascii "$1" 2>/dev/null | col -b; }

# Options listed in a CLI11 help text: the first column of lines starting "  -" ("-o,--output TEXT");
# wrapped descriptions are indented further. (No {m,n} in the regex: Debian's awk is mawk.)
options_of() {
  awk 'match($0, /^ +-/) && RLENGTH <= 7 { n = split($1, a, ","); for (i = 1; i <= n; i++) print a[i] }'
}

has_option() {  # TEXT OPTION: the option as a whole word ("--seq" must not match inside "--sequence")
  grep -qE -- "(^|[^-[:alnum:]])$(printf '%s' "$2" | sed 's/[.[\*^$]/\\&/g')([^-[:alnum:]_]|$)" <<<"$1"
}

pages=(man1/hp.1 man1/hp-plan.1 man1/hp-shard.1 man1/hp-offload-profile.1 man1/hp-launch.1 man1/hp-verify.1
       man1/hp-devices.1 man1/hp-model-skeleton.1 man5/hp-recipe.5)
for page in "${pages[@]}"; do
  file=$man_dir/$page
  [[ -f $file ]] || { err "$page was not built ($file)"; continue; }
  warnings=$(MANWIDTH=80 man -l --warnings "$file" 2>&1 >/dev/null)
  [[ -z $warnings ]] || err "$page renders with warnings:"$'\n'"$warnings"
  [[ -f $file.gz ]] || err "$page.gz was not built"
done

# hp(1): global options and every command.
text=$(render "$man_dir/man1/hp.1")
help=$("$hp" --help)
[[ -n $(options_of <<<"$help") ]] || err "hp --help printed no options (parser stale?)"
for opt in $(options_of <<<"$help"); do has_option "$text" "$opt" || err "hp(1) lacks option $opt"; done
for cmd in plan shard offload-profile launch verify devices model-skeleton; do
  grep -qE "^ {1,8}$cmd( |$)" <<<"$text" || err "hp(1) lacks command $cmd"
  grep -qE "hp-$cmd\(1\)" <<<"$text" || err "hp(1) does not refer to hp-$cmd(1)"
  grep -qE "(^| )$cmd( |$)" <<<"$help" || err "hp --help lacks $cmd (the list above is stale)"
done

# hp-<cmd>(1): every option of hp <cmd> --help.
for cmd in plan shard offload-profile launch verify devices model-skeleton; do
  text=$(render "$man_dir/man1/hp-$cmd.1")
  opts=$("$hp" "$cmd" --help | options_of)
  [[ -n $opts ]] || err "hp $cmd --help printed no options (parser stale?)"
  for opt in $opts; do has_option "$text" "$opt" || err "hp-$cmd(1) lacks option $opt"; done
done

# hp-recipe(5): "section<TAB>key" pairs as rendered (a section heading is a line holding only
# "[...]", a key entry a line "key (type; ...)").
text=$(render "$man_dir/man5/hp-recipe.5")
rendered=$(awk '
  { line = $0; sub(/^ +/, "", line) }
  line ~ /^\[[^ ]*\]$/ { section = line; next }
  section != "" && match(line, /^[a-z_0-9]+ \(/) { print section "\t" substr(line, 1, RLENGTH - 2) }
' <<<"$text" | sort -u)
documented=$("$man_keys" --list | sort -u)
[[ -n $documented ]] || err "hp_man_keys --list printed nothing"
missing=$(comm -23 <(printf '%s\n' "$documented") <(printf '%s\n' "$rendered"))
[[ -z $missing ]] || err "hp-recipe(5) lacks documented keys:"$'\n'"$missing"

# Keys written in the TOML files shipped in recipes/: "[section]" headers ([layouts."x"] is
# [layouts.<tensor>]) and "key = " lines at the start of a line.
written=$(find "$src/recipes" -name '*.toml' -print0 | xargs -0 awk '
  FNR == 1 { section = "" }
  /^\[/ { section = $0; sub(/[ \t]*#.*$/, "", section)
          if (section ~ /^\[layouts\./) section = "[layouts.<tensor>]"; next }
  section != "" && /^[a-z_0-9]+[ \t]*=/ { key = $0; sub(/[ \t]*=.*$/, "", key); print section "\t" key }
' | sort -u)
[[ -n $written ]] || err "no keys found in $src/recipes/**/*.toml"
missing=$(comm -23 <(printf '%s\n' "$written") <(printf '%s\n' "$rendered"))
[[ -z $missing ]] || err "hp-recipe(5) lacks keys used in recipes/:"$'\n'"$missing"

(( fail )) && exit 1
echo "ok: ${#pages[@]} pages render cleanly; options of hp and its 6 commands and $(wc -l <<<"$documented") keys covered"

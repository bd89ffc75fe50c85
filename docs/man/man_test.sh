#!/usr/bin/env bash
# Every public function of the headers given as arguments has a page in man3/ (its own, or
# a ".so" link to the page that documents it with its siblings), every page (man3 and the
# man7 overview) has the sections a reader looks for, and groff renders it without a warning.
# Usage: man_test.sh HEADER...   (run by Bazel from the runfiles tree; see BUILD)
set -uo pipefail
here=$(dirname "$(readlink -f "$0")")
mandir=${MANDIR:-docs/man}
[ -d "$mandir/man3" ] || mandir=$here
fail=0 names=0
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }

for h in "$@"; do
  [ -f "$h" ] || { bad "header $h not found"; continue; }
  # Declarations outside comments: strip /* */ and // comments, then take cxr_x( names
  # (not cxr__x: internal helpers that inline functions and macros of the header call).
  for fn in $(perl -0pe 's{/\*.*?\*/}{}gs; s{//[^\n]*}{}g' "$h" | grep -oE '\bcxr_[a-z0-9][a-z0-9_]*\(' |
              tr -d '(' | sort -u); do
    names=$((names + 1))
    [ -f "$mandir/man3/$fn.3" ] || bad "$fn ($h) has no page man3/$fn.3"
  done
done

pages=0
for p in "$mandir"/man3/*.3 "$mandir"/man7/*.7; do
  [ -f "$p" ] || continue
  pages=$((pages + 1))
  sect=${p##*.}
  base=$(basename "$p" ".$sect")
  if head -1 "$p" | grep -q '^\.so '; then
    target=$(head -1 "$p" | awk '{print $2}')
    [ -f "$mandir/$target" ] || bad "$base.3 links to missing $target"
    grep -qE "\\b$base\\b" "$mandir/$target" 2>/dev/null || bad "$target does not mention $base"
    continue
  fi
  for sec in NAME SYNOPSIS DESCRIPTION; do
    grep -q "^\.SH \"\?$sec" "$p" || bad "$base.3 has no $sec section"
  done
  # The NAME section names the page's function.
  awk '/^\.SH "?NAME/{f=1; next} /^\.SH/{f=0} f' "$p" | grep -qE "\\b$base\\b" ||
    bad "$base.3: NAME does not name $base"
  if command -v groff >/dev/null; then
    warn=$(cd "$mandir" && groff -man -Tutf8 -ww -z "man$sect/$base.$sect" 2>&1)
    [ -z "$warn" ] || bad "$base.3 renders with warnings: $warn"
  fi
done
command -v groff >/dev/null || echo "WARNING: groff not installed: pages not rendered"
echo "$names functions, $pages pages, $fail problems"
[ "$fail" -eq 0 ] && [ "$names" -gt 0 ]

#!/usr/bin/env bash
# Runs every suite: the plain build, ASan+UBSan, TSan (suites not tagged notsan) and the
# bounded fuzzers. Counts one result per test target and configuration and ends with the
# line CI reads: "N passed, N failed". Exits non-zero when anything failed.
set -uo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
log=$(mktemp -d /tmp/cxrpc-test.XXXX)
passed=0 failed=0
digest="$log/digest"  # where each failed test went wrong, printed again at the very end

# digest OUTPUT SUITE: from the log of each test that failed, the lines that say why (a
# gtest failure, a sanitizer report, UCX's fatal error or signal with its backtrace) and its
# last lines. The bazel summary alone cut a crash's first frames (CI keeps only the end of
# the output), so this goes last, bounded.
digest() {
  grep -oE '/[^ ]+/testlogs/[^ ]+/test\.log' "$1" | sort -u | head -4 | while read -r t; do
    [ -f "$t" ] || continue
    echo "--- [$2] ${t##*/testlogs/}"
    grep -nE -A14 'Failure$|Caught signal|Fatal|Assertion|ERROR: [A-Za-z]+Sanitizer|WARNING: ThreadSanitizer|runtime error|==== backtrace' \
      "$t" | head -45
    echo "  (last lines)"
    tail -8 "$t"
  done | cut -c1-240 >>"$digest"
}

run() { # run NAME BAZEL-ARGS...
  local name=$1; shift
  echo "== $name: bazel test $*"
  local out="$log/$name.out" rc
  bazel test --keep_going --color=no --curses=no --noshow_progress "$@" >"$out" 2>&1; rc=$?
  local p f
  p=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$out")
  f=$(grep -cE '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|NO STATUS|FLAKY|INCOMPLETE|FAILED TO BUILD)' "$out")
  grep -E '^//[^ ]+ +' "$out" | sed "s/^/  [$name] /"
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    f=1; echo "  [$name] bazel exited $rc without a failed target: build error"
    grep -E 'ERROR|error:' "$out" | head -20
  fi
  if [ "$f" -ne 0 ]; then
    # Show why: the logs of failed tests (already printed by --test_output=errors).
    grep -vE '^(INFO|Loading|Analyzing|[0-9.]+: src/main/tools)' "$out" | tail -60
    digest "$out" "$name"
  fi
  passed=$((passed + p)); failed=$((failed + f))
}

count_fuzz() { # count_fuzz OUTPUT EXIT-STATUS: scripts/fuzz.sh's lines, whatever its status
  local p f
  p=$(grep -c '^fuzz PASSED' "$1"); f=$(grep -c '^fuzz FAILED' "$1")
  grep '^fuzz ' "$1" | sed 's/^/  /'
  # A run that failed without naming a fuzzer (it died, or stopped before the fuzzers ran)
  # still failed: counted once.
  if [ "$2" -ne 0 ] && [ "$f" -eq 0 ]; then
    f=1; echo "  [fuzz] scripts/fuzz.sh exited $2 without a 'fuzz FAILED' line:"
    tail -20 "$1" | sed 's/^/    /'
  fi
  passed=$((passed + p)); failed=$((failed + f))
}

start=$SECONDS
# The cross-rack suites skip themselves where network namespaces cannot be made (not root,
# or a bare chroot whose "/" is not a mount point): say so loudly rather than pass quietly.
netns_ok=1
if ! { ip netns add "cxrtest-$$" 2>/dev/null && ip netns exec "cxrtest-$$" true 2>/dev/null; }; then
  echo "WARNING: network namespaces unavailable here: tests/netns suites will SKIP their cases"
  netns_ok=0
fi
ip netns del "cxrtest-$$" 2>/dev/null || true
run plain //...
run asan --config=asan //...
run tsan --config=tsan --test_tag_filters=-notsan //...
if [ -x scripts/fuzz.sh ]; then
  echo "== fuzz: scripts/fuzz.sh"
  bash scripts/fuzz.sh >"$log/fuzz.out" 2>&1
  count_fuzz "$log/fuzz.out" $?
fi
# Where namespaces were unusable, the probes (here and in the suites) still left iproute2's
# bind mount of /run/netns behind; with nothing in it, take it away again (a bare chroot
# cannot be removed while it stays mounted). Where namespaces work it is left as iproute2 keeps it.
if [ "$netns_ok" -eq 0 ]; then
  for _ in 1 2 3 4 5 6 7 8; do
    mountpoint -q /run/netns 2>/dev/null && [ -z "$(ls -A /run/netns 2>/dev/null)" ] || break
    umount /run/netns 2>/dev/null || break
  done
fi
if [ -s "$digest" ]; then
  echo "== why the failed tests failed (from their logs)"
  head -150 "$digest"
fi
echo "logs in $log; $((SECONDS - start)) s"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]

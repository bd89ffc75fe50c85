#!/usr/bin/env bash
# The bounded libFuzzer runs of CI (scripts/test.sh runs this when it exists). Builds the
# fuzz targets of tests/fuzz with clang (-fsanitize=fuzzer,address,undefined) in a Bazel
# output base of their own, then runs each for CXR_FUZZ_SECONDS (default 30) seconds.
# Prints one line per fuzzer, "fuzz PASSED <name>" or "fuzz FAILED <name>"; exits non-zero
# when any failed. Crash inputs and logs stay in the printed work folder after a failure.
set -uo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
SECS=${CXR_FUZZ_SECONDS:-30}
OB=${CXR_FUZZ_OUTPUT_BASE:-${HOME:-/root}/.cache/bazel-cxrpc-fuzz}
FUZZERS=(validate_fuzz plugin_fuzz)
work=$(mktemp -d /tmp/cxrpc-fuzz.XXXX)
echo "fuzz: work folder $work, $SECS s per fuzzer"

export CXRPC_ROOT=$work/root
mkdir -p "$CXRPC_ROOT"
# ASan owns 0x6000_0000_0000-0x6500_0000_0000: move the cxrpc window as .bazelrc's asan does.
export CXRPC_WINDOW=0x650000000000-0x700000000000
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# UCX (linked through rpc/) must not patch malloc/mmap under ASan (as in .bazelrc).
export UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none

flags=(-c opt --color=no --curses=no --noshow_progress --repo_env=CC=clang
       --copt=-fsanitize=fuzzer-no-link,address,undefined --copt=-fno-sanitize-recover=all
       --copt=-fno-omit-frame-pointer --copt=-g --strip=never
       --linkopt=-fsanitize=address,undefined --per_file_copt=.*@-Wno-error)
targets=()
for f in "${FUZZERS[@]}"; do targets+=("//tests/fuzz:$f"); done
targets+=("//tests/fuzz:validate_seeds")
if ! CC=clang bazel --output_base="$OB" build "${flags[@]}" "${targets[@]}" >"$work/build.log" 2>&1; then
  grep -E 'error|ERROR' "$work/build.log" | head -20
  for f in "${FUZZERS[@]}"; do echo "fuzz FAILED $f (build)"; done
  exit 1
fi
bin=$(CC=clang bazel --output_base="$OB" info "${flags[@]}" bazel-bin 2>/dev/null)

# Seeds for the plugin: real CodeGeneratorRequests, captured by a plugin that only saves
# its input (an empty stdout is a valid, empty response).
mkdir -p "$work/seeds/plugin_fuzz" "$work/seeds/validate_fuzz"
cat >"$work/dump.sh" <<DUMP
#!/bin/sh
cat > "$work/seeds/plugin_fuzz/\$(date +%s%N).req"
DUMP
chmod +x "$work/dump.sh"
for p in tests/idl/everything.proto tests/idl/open.proto examples/docstore/docstore.proto; do
  [ -f "$p" ] && protoc -I. --plugin=protoc-gen-dump="$work/dump.sh" --dump_out="$work" "$p" 2>/dev/null
done

# Seeds for the validator: real message graphs in the fuzzer's block form.
"$bin/tests/fuzz/validate_seeds" "$work/seeds/validate_fuzz" 90 >/dev/null 2>&1 ||
  echo "fuzz: no validator seeds (validate_seeds failed); starting from nothing"

failed=0
for f in "${FUZZERS[@]}"; do
  mkdir -p "$work/corpus/$f" "$work/crash/$f"
  timeout $((SECS + 120)) "$bin/tests/fuzz/$f" -max_total_time="$SECS" -timeout=10 \
    -rss_limit_mb=2048 -use_value_profile=1 -print_final_stats=1 \
    -artifact_prefix="$work/crash/$f/" "$work/corpus/$f" "$work/seeds/$f" >"$work/$f.log" 2>&1
  rc=$?
  runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$work/$f.log" | grep -oE '[0-9]+$')
  if [ "$rc" -eq 0 ]; then
    echo "fuzz PASSED $f (${runs:-?} inputs in $SECS s)"
  else
    echo "fuzz FAILED $f (exit $rc; log $work/$f.log)"
    grep -E 'ERROR|SUMMARY|==[0-9]+==' "$work/$f.log" | head -10
    failed=1
  fi
done
# Keep the work folder (logs, crash inputs) only when something failed.
[ "$failed" -eq 0 ] && rm -rf "$work"
exit $failed

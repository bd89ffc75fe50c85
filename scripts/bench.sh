#!/usr/bin/env bash
# Runs every benchmark and prints its table (medians, tails, ratios against the raw floor
# and peers measured in the same run). Benchmarks never fail a build; they report.
set -uo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
BAZEL=(bazel run -c opt --color=no --curses=no --noshow_progress --ui_event_filters=-info,-stdout,-stderr)
bench() { echo; echo "### $*"; "${BAZEL[@]}" "$@" 2>&1 | grep -vE '^(INFO|Loading|Analyzing|Target|  bazel-bin|WARNING: )' ; }
# One line per benchmark target (each layer adds its own):
bench //bench:alloc_bench
bench //bench:seal_bench
bench //bench:rpc_bench
bench //bench:remote_bench
bench //bench:rdma_bench
bench //bench:idl_bench

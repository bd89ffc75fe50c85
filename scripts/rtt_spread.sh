#!/usr/bin/env bash
# The round trip's ratio to the raw floor, over many short runs: the VM moves the two
# processes between placements within minutes, and one run samples one placement. Builds
# rpc_bench (-c opt), copies it out of bazel-bin (a later `bazel test` would swap it for a
# fastbuild one), runs `rpc_bench --rtt` N times (under a second each) and prints, for each
# placement (told apart by the one-word floor the run saw), the number of runs, the median
# ratio of the call and of the rings alone, and how many runs met 1.5x.
#   scripts/rtt_spread.sh [N, default 30]
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
n=${1:-30}
case $n in '' | *[!0-9]*) echo "usage: $0 [runs]" >&2; exit 2 ;; esac
bazel build -c opt --color=no --curses=no --noshow_progress //bench:rpc_bench >/dev/null 2>&1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp bazel-bin/bench/rpc_bench "$tmp/rpc_bench"
for _ in $(seq "$n"); do
  # floor (us), call ratio, rings ratio: the rows rpc_bench prints
  "$tmp/rpc_bench" --rtt 2>/dev/null | awk '
    /one word bounced/ {f = $(NF - 2)}
    /no-op call, 1 client thread/ {c = $NF}
    /rings alone/ {r = $NF}
    END {if (f != "" && c != "") print f, c, r}'
done >"$tmp/runs"
awk '
  function median(a, k,   i, j, t) {
    for (i = 2; i <= k; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) {t = a[j]; a[j] = a[j - 1]; a[j - 1] = t}
    return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
  }
  {
    p = $1 < 0.085 ? "fast (floor < 0.085 us)" : $1 < 0.2 ? "usual (0.085-0.2 us)" : "far (floor >= 0.2 us)"
    k[p]++; call[p, k[p]] = $2; ring[p, k[p]] = $3; if ($2 <= 1.5) met[p]++
  }
  END {
    printf "%-26s %5s %12s %13s %10s\n", "placement", "runs", "call x floor", "rings x floor", "<= 1.5x"
    for (p in k) {
      for (i = 1; i <= k[p]; i++) {a[i] = call[p, i]; b[i] = ring[p, i]}
      printf "%-26s %5d %12.2f %13.2f %10d\n", p, k[p], median(a, k[p]), median(b, k[p]), met[p] + 0
    }
  }' "$tmp/runs"

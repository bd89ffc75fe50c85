#!/usr/bin/env bash
# The demo (./cxrpc.sh demo): builds and runs each layer's demo in turn, each with its own
# pod root under a temporary folder, and prints what happened. Layers add a section below.
# A step that fails (a kv_load that timed out once, say) is named and the demo goes on with
# the next ones, then exits 1; anything else that fails stops it, saying where.
set -eEuo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
section="setup"
# (-E: also inside functions; only this shell speaks, not the subshells that inherit it)
trap 'err=$?; [ "$BASHPID" = "$$" ] &&
      echo "demo: FAILED in \"$section\" (exit $err, line $LINENO: $BASH_COMMAND)" >&2' ERR
failed=()
# step WHAT CMD...: runs CMD; when it fails, says so and records WHAT for the summary.
step() {
  local what=$1 rc=0
  shift
  "$@" || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "demo: step failed (exit $rc): $what" >&2
    failed+=("$what")
  fi
}
# Whatever ends the demo, its servers stop and their roots and namespaces go.
cleanup() {
  local rc=$? p
  set +e  # clean up all of it, whatever fails
  trap - ERR
  for p in "${loadpid:-}" "${kvpid:-}" "${docpid:-}" "${xpid:-}"; do
    [ -n "$p" ] && kill "$p" 2>/dev/null || continue
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done  # it stops
  done
  if [ -n "${S:-}" ]; then ip netns del "$S" 2>/dev/null; fi
  if [ -n "${C:-}" ]; then ip netns del "$C" 2>/dev/null; fi
  rm -rf "${work:-}" "${kvroot:-}" "${docroot:-}"
  exit "$rc"
}
trap cleanup EXIT
# $CXRPC_BAZEL may name another bazel command (e.g. with --output_base).
read -r -a B <<<"${CXRPC_BAZEL:-bazel}"
BAZEL=("${B[@]}" build -c opt --color=no --curses=no --noshow_progress --ui_event_filters=-info,-stdout,-stderr)
work=$(mktemp -d /tmp/cxrpc-demo.XXXX)
# The bazel-bin symlink may belong to another output base: ask bazel.
BIN=$("${B[@]}" info -c opt bazel-bin 2>/dev/null)
bin() { echo "$BIN/$1"; }

# ---- the README's tour: a Greeter server and a client process, generated stubs ----
section="greet"
echo "== greet: the README tour (examples/greet): server and client processes, one pointer per call"
"${BAZEL[@]}" //examples/greet
mkdir -p "$work/greet"
step "greet: the tour's client and server" \
  env CXRPC_ROOT="$work/greet" "$(bin examples/greet/greet)" ada lovelace
echo "-- files left under the pod root: $(ls -A "$work/greet" | wc -l)"
echo

# ---- shm: two processes share one heap at the same address and exchange a tree ----
section="shared heap"
echo "== shared heap: a pointer-rich tree built by one process, walked by another"
"${BAZEL[@]}" //examples/shared_heap //tools:cxrpcctl
mkdir -p "$work/shm"
step "shared heap: build and walk the tree" \
  env CXRPC_ROOT="$work/shm" "$(bin examples/shared_heap/shared_heap)" --ctl "$(bin tools/cxrpcctl)"
echo "-- cxrpcctl heaps after the demo (the last holder removed its heap):"
CXRPC_ROOT="$work/shm" "$(bin tools/cxrpcctl)" heaps
echo "-- files left under the pod root: $(ls -A "$work/shm" | wc -l)"

# ---- rpc: the kv store, a server and clients in separate processes on tmpfs ----
echo
section="kv store"
echo "== kv store: kv_server + kv_load clients over cxrpc on emulated CXL memory (tmpfs)"
"${BAZEL[@]}" //examples/kvstore:kv_server //examples/kvstore:kv_load //tools:cxrpcctl
kvroot=$(mktemp -d /dev/shm/cxrpc-kv.XXXX)
kvlog="$work/kv_server.log"
CXRPC_ROOT="$kvroot" "$(bin examples/kvstore/kv_server)" --workers 1 --unix "$kvroot/kv.sock" >"$kvlog" 2>&1 &
kvpid=$!
for _ in $(seq 100); do grep -qs ready "$kvlog" && break; sleep 0.1; done
cat "$kvlog"
kvload() { CXRPC_ROOT="$kvroot" "$(bin examples/kvstore/kv_load)" "$@"; }
step "kv store: kv_load workload b" kvload --threads 1 --seconds 2 --workload b
step "kv store: kv_load over the Unix socket" \
  kvload --threads 1 --seconds 2 --workload b --unix "$kvroot/kv.sock" --no-preload
step "kv store: kv_load workload a, 2 threads" kvload --threads 2 --seconds 2 --workload a
echo "-- cxrpcctl channels / conns while a client is connected:"
kvload --threads 1 --seconds 2 --workload c --no-preload >/dev/null &
loadpid=$!
sleep 1
step "kv store: cxrpcctl channels" env CXRPC_ROOT="$kvroot" "$(bin tools/cxrpcctl)" channels
step "kv store: cxrpcctl conns" env CXRPC_ROOT="$kvroot" "$(bin tools/cxrpcctl)" conns kv
step "kv store: kv_load in the background (workload c)" wait "$loadpid"
loadpid=
echo "-- 1 MiB values passed by pointer:"
step "kv store: kv_load with 1 MiB values" \
  kvload --threads 1 --seconds 1 --workload c --value-size 1048576 --keys 64
kill -TERM "$kvpid"
wait "$kvpid" || true
kvpid=
tail -1 "$kvlog"
rm -rf "$kvroot"

# ---- idl: the document store, pointer-rich trees on generated code only ----
echo
section="docstore"
echo "== docstore: JSON-like trees built in the connection heap and passed by one pointer"
"${BAZEL[@]}" //examples/docstore:server //examples/docstore:client
docroot=$(mktemp -d /dev/shm/cxrpc-doc.XXXX)
doclog="$work/docstore.log"
CXRPC_ROOT="$docroot" "$(bin examples/docstore/server)" >"$doclog" 2>&1 &
docpid=$!
for _ in $(seq 100); do grep -qs serving "$doclog" && break; sleep 0.1; done
step "docstore: the client's checks" env CXRPC_ROOT="$docroot" "$(bin examples/docstore/client)"
kill -TERM "$docpid"
wait "$docpid" || true
docpid=
cat "$doclog"
rm -rf "$docroot"

# ---- rdma: a kv client in another rack (network namespace, own pod root) over UCX/TCP ----
echo
section="cross-rack"
echo "== cross-rack: kv_load in another rack calls kv_server over UCX (TCP on a veth pair)"
# Network namespaces need root and a real mount namespace (inside a bare chroot, "/" is
# not a mount point and `ip netns add` fails): probe with two before relying on them.
netns_ok() {
  [ "$(id -u)" -eq 0 ] || return 1
  local ok=0 n
  for n in "cxrdemo-$$-p1" "cxrdemo-$$-p2"; do
    ip netns add "$n" 2>/dev/null && ip netns exec "$n" true 2>/dev/null || ok=1
  done
  ip netns del "cxrdemo-$$-p1" 2>/dev/null; ip netns del "cxrdemo-$$-p2" 2>/dev/null
  return $ok
}
if ! netns_ok; then
  echo "(skipped: this machine cannot create network namespaces: needs root, outside a chroot)"
else
  S="cxrdemo-$$-s" C="cxrdemo-$$-c"
  ip netns add "$S"
  ip netns add "$C"
  ip -n "$S" link add cx0 type veth peer name cx0 netns "$C"
  ip -n "$S" addr add 10.78.0.1/24 dev cx0 && ip -n "$C" addr add 10.78.0.2/24 dev cx0
  for n in "$S" "$C"; do ip -n "$n" link set cx0 up; ip -n "$n" link set lo up; done
  # The kernel reports the new link up asynchronously; UCX skips a device that is still down.
  for n in "$S" "$C"; do
    for _ in $(seq 50); do ip -n "$n" -o link show cx0 | grep -q 'state UP' && break; sleep 0.1; done
  done
  # Another rack: its own pod root and pod number (a disjoint slice of the address window),
  # reached only over UCX; UCX_TLS=tcp keeps UCX from using shared memory between racks.
  export UCX_TLS=tcp UCX_NET_DEVICES=cx0 UCX_WARN_UNUSED_ENV_VARS=n UCX_TCP_CM_REUSEADDR=y
  mkdir -p "$work/rackS" "$work/rackC"
  xlog="$work/kv_remote.log"
  CXRPC_ROOT="$work/rackS" CXRPC_POD=1 ip netns exec "$S" "$(bin examples/kvstore/kv_server)" \
    --workers 1 --listen ucx://10.78.0.1:7400 >"$xlog" 2>&1 &
  xpid=$!
  for _ in $(seq 100); do grep -qs ready "$xlog" && break; sleep 0.1; done
  cat "$xlog"
  xload() { CXRPC_ROOT="$work/rackC" CXRPC_POD=2 ip netns exec "$C" "$(bin examples/kvstore/kv_load)" \
              --channel ucx://10.78.0.1:7400/kv "$@"; }
  step "cross-rack: kv_load workload b" xload --threads 1 --seconds 2 --workload b --keys 10000
  step "cross-rack: kv_load with 64 KiB values" \
    xload --threads 1 --seconds 1 --workload c --value-size 65536 --keys 64
  echo "-- cxrpcctl doctor in the client's rack:"
  step "cross-rack: cxrpcctl doctor" \
    env CXRPC_ROOT="$work/rackC" ip netns exec "$C" "$(bin tools/cxrpcctl)" doctor
  kill -TERM "$xpid"
  wait "$xpid" || true
  xpid=
  tail -1 "$xlog"
  ip netns del "$S"; ip netns del "$C"
  S= C=
fi

echo
section="summary"
if [ ${#failed[@]} -ne 0 ]; then
  echo "demo: ${#failed[@]} step(s) FAILED:" >&2
  printf '  %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "demo: every step passed"

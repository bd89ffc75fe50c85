#!/usr/bin/env bash
# The demo (./cxrpc.sh demo): builds and runs each layer's demo in turn, each with its own
# pod root under a temporary folder, and prints what happened. Layers add a section below.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
# $CXRPC_BAZEL may name another bazel command (e.g. with --output_base).
read -r -a B <<<"${CXRPC_BAZEL:-bazel}"
BAZEL=("${B[@]}" build -c opt --color=no --curses=no --noshow_progress --ui_event_filters=-info,-stdout,-stderr)
work=$(mktemp -d /tmp/cxrpc-demo.XXXX)
trap 'rm -rf "$work"' EXIT
# The bazel-bin symlink may belong to another output base: ask bazel.
BIN=$("${B[@]}" info -c opt bazel-bin 2>/dev/null)
bin() { echo "$BIN/$1"; }

# ---- the README's tour: a Greeter server and a client process, generated stubs ----
echo "== greet: the README tour (examples/greet): server and client processes, one pointer per call"
"${BAZEL[@]}" //examples/greet
mkdir -p "$work/greet"
CXRPC_ROOT="$work/greet" "$(bin examples/greet/greet)" ada lovelace
echo "-- files left under the pod root: $(ls -A "$work/greet" | wc -l)"
echo

# ---- shm: two processes share one heap at the same address and exchange a tree ----
echo "== shared heap: a pointer-rich tree built by one process, walked by another"
"${BAZEL[@]}" //examples/shared_heap //tools:cxrpcctl
mkdir -p "$work/shm"
CXRPC_ROOT="$work/shm" "$(bin examples/shared_heap/shared_heap)" --ctl "$(bin tools/cxrpcctl)"
echo "-- cxrpcctl heaps after the demo (the last holder removed its heap):"
CXRPC_ROOT="$work/shm" "$(bin tools/cxrpcctl)" heaps
echo "-- files left under the pod root: $(ls -A "$work/shm" | wc -l)"

# ---- rpc: the kv store, a server and clients in separate processes on tmpfs ----
echo
echo "== kv store: kv_server + kv_load clients over cxrpc on emulated CXL memory (tmpfs)"
"${BAZEL[@]}" //examples/kvstore:kv_server //examples/kvstore:kv_load //tools:cxrpcctl
kvroot=$(mktemp -d /dev/shm/cxrpc-kv.XXXX)
kvlog="$work/kv_server.log"
CXRPC_ROOT="$kvroot" "$(bin examples/kvstore/kv_server)" --workers 1 --unix "$kvroot/kv.sock" >"$kvlog" 2>&1 &
kvpid=$!
trap 'kill "$kvpid" 2>/dev/null; rm -rf "$work" "$kvroot"' EXIT
for _ in $(seq 100); do grep -qs ready "$kvlog" && break; sleep 0.1; done
cat "$kvlog"
kvload() { CXRPC_ROOT="$kvroot" "$(bin examples/kvstore/kv_load)" "$@"; }
kvload --threads 1 --seconds 2 --workload b
kvload --threads 1 --seconds 2 --workload b --unix "$kvroot/kv.sock" --no-preload
kvload --threads 2 --seconds 2 --workload a
echo "-- cxrpcctl channels / conns while a client is connected:"
kvload --threads 1 --seconds 2 --workload c --no-preload >/dev/null &
loadpid=$!
sleep 1
CXRPC_ROOT="$kvroot" "$(bin tools/cxrpcctl)" channels
CXRPC_ROOT="$kvroot" "$(bin tools/cxrpcctl)" conns kv
wait "$loadpid" || echo "(the background load reported errors)"
echo "-- 1 MiB values passed by pointer:"
kvload --threads 1 --seconds 1 --workload c --value-size 1048576 --keys 64
kill -TERM "$kvpid"
wait "$kvpid" || true
tail -1 "$kvlog"
rm -rf "$kvroot"

# ---- idl: the document store, pointer-rich trees on generated code only ----
echo
echo "== docstore: JSON-like trees built in the connection heap and passed by one pointer"
"${BAZEL[@]}" //examples/docstore:server //examples/docstore:client
docroot=$(mktemp -d /dev/shm/cxrpc-doc.XXXX)
doclog="$work/docstore.log"
CXRPC_ROOT="$docroot" "$(bin examples/docstore/server)" >"$doclog" 2>&1 &
docpid=$!
for _ in $(seq 100); do grep -qs serving "$doclog" && break; sleep 0.1; done
CXRPC_ROOT="$docroot" "$(bin examples/docstore/client)" || echo "(docstore client failed)"
kill -TERM "$docpid"
wait "$docpid" || true
cat "$doclog"
rm -rf "$docroot"

# ---- rdma: a kv client in another rack (network namespace, own pod root) over UCX/TCP ----
echo
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
  trap 'kill "${xpid:-}" 2>/dev/null || true; ip netns del "$S" 2>/dev/null || true
        ip netns del "$C" 2>/dev/null || true; rm -rf "$work"' EXIT
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
  xload --threads 1 --seconds 2 --workload b --keys 10000
  xload --threads 1 --seconds 1 --workload c --value-size 65536 --keys 64
  echo "-- cxrpcctl doctor in the client's rack:"
  CXRPC_ROOT="$work/rackC" ip netns exec "$C" "$(bin tools/cxrpcctl)" doctor
  kill -TERM "$xpid"
  wait "$xpid" || true
  tail -1 "$xlog"
  ip netns del "$S"; ip netns del "$C"
fi

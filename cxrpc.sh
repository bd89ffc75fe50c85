#!/usr/bin/env bash
# The entry script: installs what is missing (Debian 12, as root) and runs cxrpc.
#   ./cxrpc.sh demo    install, build, run the kv demo (pod clients + a cross-rack client)
#   ./cxrpc.sh test    install, build, run every suite (plain, ASan+UBSan, TSan, fuzzers)
#   ./cxrpc.sh bench   install, build, run the benchmarks and print their tables
#   ./cxrpc.sh deps    only install the packages
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")"

PACKAGES=(
  bazel-bootstrap bazel-rules-java bazel-platforms
  gcc g++ clang libclang-rt-14-dev libc6-dev
  libgtest-dev libucx-dev ucx-utils libibverbs-dev ibverbs-providers
  libpmem2-dev libseccomp-dev
  libprotobuf-c-dev protobuf-c-compiler protobuf-compiler libprotobuf-dev libprotoc-dev
  iproute2 procps psmisc groff-base
)

deps() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$(id -u)" -eq 0 ] || { echo "cxrpc: missing packages (${missing[*]}); run as root" >&2; exit 1; }
  echo "cxrpc: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
}

case "${1:-}" in
  deps) deps ;;
  demo) deps; exec bash scripts/demo.sh "${@:2}" ;;
  test) deps; exec bash scripts/test.sh "${@:2}" ;;
  bench) deps; exec bash scripts/bench.sh "${@:2}" ;;
  *) echo "usage: $0 demo|test|bench|deps" >&2; exit 2 ;;
esac

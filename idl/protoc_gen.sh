#!/bin/sh
# cxrpc_proto_library's generation step: usage protoc_gen.sh PLUGIN OUTDIR FILE.proto
# The plugin runs first: it refuses what cxrpc does not support with an error naming the
# file and the element, before protoc-c meets input it cannot handle (protoc-c 1.4.1
# segfaults on a proto2 group, which left the user with "Segmentation fault protoc-c").
set -e
protoc -I. --plugin=protoc-gen-cxrpc="$1" --cxrpc_out="$2" "$3"
protoc-c -I. --c_out="$2" "$3"

/*
 * The kvstore's shared constants. The protocol itself is examples/kvstore/kv.proto: the
 * generated stubs and skeleton (kv.cxr.h) carry Get/Set/Delete/Stats; this header only
 * holds the limits both sides check, the store's counters and the operation codes of the
 * Unix-socket baseline (unix.h), which keeps its own tiny framing: it is the peer that
 * cxrpc is compared with, not cxrpc.
 */
#ifndef CXRPC_EXAMPLES_KV_H
#define CXRPC_EXAMPLES_KV_H

#include <stddef.h>
#include <stdint.h>

#define KV_CHANNEL "kv"
#define KV_KEY_MAX 250u
#define KV_VALUE_MAX (1u << 20)

/* Operation codes of the Unix-socket baseline's framing. */
enum { KV_GET = 1, KV_SET = 2, KV_DELETE = 3 };

typedef struct kv_stats {
  uint64_t items, bytes, gets, hits, sets, deletes;
} kv_stats;

#endif

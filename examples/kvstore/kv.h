/*
 * The kvstore protocol on the raw rpc API (cxrpc/rpc.h): method ids and the message
 * structs that live in the connection heap. (The IDL will generate these later.)
 *
 *   KV_GET     args kv_req (key)                 result kv_value (copy of the value) or NULL
 *   KV_SET     args kv_req (key, value pointer)  result NULL
 *   KV_DELETE  args kv_req (key)                 result NULL; CXR_ENOENT if absent
 *   KV_STATS   no args                           result kv_stats
 *
 * A value (up to KV_VALUE_MAX) is passed by pointer: the client builds it in the connection
 * heap, the server copies it into its own store. GET's result is built by the server in the
 * same heap; the client frees it with cxr_heap_free(cxr_conn_heap(c), v).
 * Small requests (GET/DELETE/SET with keys up to KV_INLINE_KEY) travel inline in the call
 * descriptor (CXR_CALL_INLINE): no heap allocation for them.
 */
#ifndef CXRPC_EXAMPLES_KV_H
#define CXRPC_EXAMPLES_KV_H

#include <stddef.h>
#include <stdint.h>

#define KV_CHANNEL "kv"
#define KV_KEY_MAX 250u
#define KV_VALUE_MAX (1u << 20)
#define KV_INLINE_KEY 56u  /* header 16 + key: fits the 72 inline bytes of a descriptor */

enum { KV_GET = 1, KV_SET = 2, KV_DELETE = 3, KV_STATS = 4 };

typedef struct kv_req {
  uint32_t key_len;
  uint32_t value_len;
  uint64_t value;          /* SET: address of value_len bytes in the connection heap */
  char key[KV_KEY_MAX];    /* only key_len bytes are sent */
} kv_req;

#define KV_REQ_SIZE(key_len) (offsetof(kv_req, key) + (key_len))

typedef struct kv_value {
  uint32_t len;
  uint32_t pad;
  char data[];
} kv_value;

typedef struct kv_stats {
  uint64_t items, bytes, gets, hits, sets, deletes;
} kv_stats;

#endif

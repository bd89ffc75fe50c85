/* The kv store over a Unix stream socket: the baseline for cxrpc (same store, same ops). */
#ifndef CXRPC_EXAMPLES_KV_UNIX_H
#define CXRPC_EXAMPLES_KV_UNIX_H

#include <stdint.h>

#include "examples/kvstore/store.h"

/* Wire format, both directions: a header, then key and value bytes (request) or value
 * bytes (response). */
typedef struct kv_wire_req {
  uint32_t op;          /* KV_GET, KV_SET, KV_DELETE */
  uint32_t key_len;
  uint32_t value_len;
} kv_wire_req;
typedef struct kv_wire_resp {
  int32_t status;
  uint32_t value_len;   /* GET hit: bytes that follow; miss: 0 with found = 0 */
  uint32_t found;
} kv_wire_resp;

typedef struct kv_unix kv_unix;
/* Listens on path (replacing a stale socket) and serves each connection on a thread. */
int kv_unix_start(kv_unix **out, const char *path, store *s);
void kv_unix_stop(kv_unix *u);

#endif

/* The kv calls C++ suites make (examples/kvstore/kv.proto), with the copying of keys and
 * values into the connection heap folded in. */
#ifndef CXRPC_TESTS_RPC_KV_CLIENT_H
#define CXRPC_TESTS_RPC_KV_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include <cxrpc/idl.h>
#include <cxrpc/rpc.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Set(key, value) with both copied into c's heap first. */
int kvc_set(cxr_conn *c, const void *key, size_t kl, const void *value, size_t vl);
/* A GetRequest in c's heap (zeroed): its key field, which the caller points and rewrites. */
cxr_bytes *kvc_get_request(cxr_conn *c);
/* Get with the request kvc_get_request made, deadline_ns relative (0: the default). On a
 * hit *len = the value's length, at most cap bytes copied to out; on a miss *len = -1. */
int kvc_get(cxr_conn *c, const cxr_bytes *key, int64_t deadline_ns, void *out, size_t cap,
            int64_t *len);

#ifdef __cplusplus
}
#endif

#endif

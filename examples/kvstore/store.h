/* The kv store: a process-private hash table (striped locks) of copied keys and values. */
#ifndef CXRPC_EXAMPLES_KV_STORE_H
#define CXRPC_EXAMPLES_KV_STORE_H

#include <stdint.h>

#include "examples/kvstore/kv.h"

typedef struct store store;

store *store_new(void);
void store_free(store *s);
/* 0 with *out = a copy of the value (*len bytes) in a block from alloc(ctx, size), or
 * *out = NULL on a miss; CXR_ENOMEM if alloc fails. */
int store_get(store *s, const char *key, uint32_t kl, void *(*alloc)(void *, size_t), void *ctx,
              void **out, uint32_t *len);
/* Stores copies of key and value (value is read once, here). 0 or CXR_ENOMEM. */
int store_set(store *s, const char *key, uint32_t kl, const void *value, uint32_t vl);
/* 0, or CXR_ENOENT when the key is absent. */
int store_del(store *s, const char *key, uint32_t kl);
void store_stats(store *s, kv_stats *st);

#endif

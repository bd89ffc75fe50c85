/*
 * Private to rpc/remote_*.c: what the client and server halves of calls across racks share
 * (spare heaps, replicas at a peer's addresses, target parsing). See rpc/remote_client.c.
 */
#ifndef CXRPC_RPC_REMOTE_INT_H
#define CXRPC_RPC_REMOTE_INT_H

#include <pthread.h>

#include "rdma/internal.h"
#include "rpc/client.h"
#include "rpc/remote.h"
#include "rpc/remote_wire.h"
#include "rpc/server.h"
#include "shm/log.h"

bool cxr__rem_inside(uint64_t a, uint64_t len, uintptr_t base, size_t size);

/* Spare heaps: a connection heap nobody uses any more is kept for the next one. Creating a
 * heap costs milliseconds (a file, a mapping, the registry); reusing an empty one nothing. */
typedef struct spares {
  pthread_mutex_t lock;
  cxr_heap *h[8];
  unsigned n;
} spares;
cxr_heap *cxr__rem_spare_take(spares *s, size_t size);
/* Keeps h when it holds no live allocation (else closes it). */
void cxr__rem_spare_give(spares *s, cxr_heap *h);
void cxr__rem_spares_drop(spares *s);
/* A heap whose name goes at once (the file goes with the last mapping). */
int cxr__rem_heap_new(cxr_heap **h, const char *prefix, const char *chan, size_t size);

/* Replicas: plain memory at a peer's heap address, over our own window reservation only. */
int cxr__rem_replica_map(uintptr_t a, size_t len);
void cxr__rem_replica_unmap(uintptr_t a, size_t len);

/* "ucx://HOST:PORT/name" -> "HOST:PORT", "name" */
int cxr__rem_parse_target(const char *t, char *host, size_t hlen, char *name, size_t nlen);

#endif

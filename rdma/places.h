/* Private: places for answers posted and not yet sent, counted per client (not installed).
 * Its own header, C and C++, so that tests reach it without the rest of internal.h. */
#ifndef CXRPC_RDMA_PLACES_H
#define CXRPC_RDMA_PLACES_H

#include <stdbool.h>
#include <stddef.h>
#include <ucp/api/ucp.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Places for answers posted and not yet sent, counted per client (the UCX endpoint they go
 * on), so that a client that never reads fills only its own (the engine's hello answers;
 * rpc/remote_server.c's answers outside connections). Every client may always have one
 * answer out; its others come from a pool shared by all clients, so clients that flood
 * cannot take every place either. A client's entry lives only while it has answers out.
 * The entries are a hash table keyed by the endpoint (open addressing, at most half full):
 * a take or give costs O(1) expected under the caller's lock, where a list walked on each
 * cost O(clients), and every client holds one place, so a flood from many endpoints cost
 * O(clients^2) with the engine's lock held (tests/rdma/places_test prints the time).
 * No lock of its own: the caller's. A zeroed cxr__places is empty. */
typedef struct cxr__place {
  ucp_ep_h uep;  /* NULL: a free slot */
  unsigned out;  /* answers out, its own place included */
} cxr__place;
typedef struct cxr__places {
  cxr__place *slots;  /* cap of them, a power of 2; NULL (cap 0) while no client has any */
  size_t cap;
  size_t clients;     /* slots in use */
  unsigned out;       /* shared places taken: all clients' beyond each one's first */
} cxr__places;
/* Takes a place for one answer on `uep`: false when that client has `each` out, the shared
 * pool's `shared` are taken, or there is no memory (places.c). */
bool cxr__place_take(cxr__places *p, ucp_ep_h uep, unsigned each, unsigned shared);
/* Gives it back (no UCX calls: inside UCX callbacks too). */
void cxr__place_give(cxr__places *p, ucp_ep_h uep);
/* Frees the entries left (places of answers UCX will never finish). */
void cxr__places_drop(cxr__places *p);

#ifdef __cplusplus
}
#endif

#endif

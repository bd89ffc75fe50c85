/*
 * Private to rpc/: calls to and from other racks over UCX (rpc/remote_*.c). The rest of
 * rpc/ reaches it only through these hooks, each one line at the top of a public function
 * when the object is remote.
 */
#ifndef CXRPC_RPC_REMOTE_H
#define CXRPC_RPC_REMOTE_H

#include <cxrpc/rpc.h>

#ifdef __cplusplus
extern "C" {
#endif

struct cxr__rconn;    /* client side of a remote connection (cxr_conn.remote) */
struct cxr__rlisten;  /* server side: the channel's UCX listener (cxr_channel.remote) */
struct cxr__rcall;    /* one remote call being handled (cxr_call.remote) */

/* client */
int cxr__remote_connect(cxr_conn **out, const char *target, const cxr_conn_opts *o);
int cxr__remote_call_async(cxr_conn *c, uint32_t method, const void *args, cxr_future **out,
                           const cxr_call_opts *o);
int cxr__remote_call(cxr_conn *c, uint32_t method, const void *args, void **result,
                     const cxr_call_opts *o);
int cxr__remote_future_poll(cxr_future *f, void **result);
int cxr__remote_future_wait(cxr_future *f, int64_t timeout_ns, void **result);
int cxr__remote_future_then(cxr_future *f, void (*cb)(int, void *, void *), void *user);
int cxr__remote_future_cancel(cxr_future *f);
void cxr__remote_future_free(cxr_future *f);
void cxr__remote_close(cxr_conn *c);

/* server: listen = "ucx://ADDR:PORT" */
int cxr__remote_listen(cxr_channel *ch, const char *listen);
void cxr__remote_stop(cxr_channel *ch);
cxr_range cxr__remote_arg_range(cxr_call *call);
int cxr__remote_set_result_ranges(cxr_call *call, const cxr_range *r, size_t n);
int cxr__remote_peer(cxr_call *call, cxr_peer *out);
/* The client sent CANCEL for this call (cxr_call_cancelled adds the deadline). */
bool cxr__remote_call_cancelled(cxr_call *call);

#ifdef __cplusplus
}
#endif
#endif

/* Private to rpc/: the hooks through which sealing and sandboxing (rpc/seal_glue.c) join
 * the rpc engine. */
#ifndef CXRPC_RPC_SEAL_GLUE_H
#define CXRPC_RPC_SEAL_GLUE_H

#include "rpc/server.h"

struct cxr__seal_srv;
struct cxr__seal_cli;

/* Server: slot sc is about to be made ready: its table exists and is empty afterwards. */
void cxr__seal_slot_ready(cxr_channel *ch, cxr__sconn *sc);
/* Server: the channel closes. */
void cxr__seal_channel_close(cxr_channel *ch);
/* Server: whether the channel's workers take the seccomp policy (an untrusted channel
 * under CXRPC_SANDBOX_THREADS=1): serve() then keeps its caller's thread out of them. */
bool cxr__seal_restricts_workers(const cxr_channel *ch);
/* Server: seal check, sandbox and handler (from cxr__dispatch). */
int cxr__seal_dispatch(cxr_call *call, cxr_handler fn, void *user, void **result);
/* Client: the connection closes. */
void cxr__seal_conn_close(cxr_conn *c);

#endif

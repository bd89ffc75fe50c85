/*
 * cxrpc/seal.h: sealed calls (CXR_CALL_SEAL) on connections, the glue between rpc/ and
 * cxrpc/sandbox.h. Each connection slot has a seal table (a sealed memfd the server writes
 * and the client maps read-only). A client call with CXR_CALL_SEAL seals the argument
 * pages (the arguments must start on a page: cxr_heap_alloc_pages), the server checks the
 * seal before the handler runs (the handler sees CXR_ENOTSEALED instead if the claim is
 * false) and marks it done after, and the client releases when the call's future is freed.
 * Releases are batched: $CXRPC_SEAL_BATCH (default 1024) released calls restore write access
 * in one sweep; until then their pages stay read-only (cxr_conn_seal_flush sweeps now).
 *
 * Channels opened with `untrusted` run handlers inside cxr_sandbox_run (a fault becomes
 * CXR_EBADPTR for that call). $CXRPC_ENFORCE=1 on the server registers every sealed
 * connection with cxrpcd (clients must run under `cxrpcd run`); see docs/sandbox.md.
 */
#ifndef CXRPC_SEAL_H
#define CXRPC_SEAL_H

#include <cxrpc/rpc.h>
#include <cxrpc/sandbox.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Client: restores write access to every released argument page now. */
int cxr_conn_seal_flush(cxr_conn *c);
/* Client: the connection's seal counters (zeros before its first sealed call). */
int cxr_conn_seal_stats(cxr_conn *c, cxr_seal_stats *out);
/* Handler: 0 if [p, p + len) lies in the pages this call's seal covers (checked before the
 * handler ran); CXR_ENOTSEALED otherwise (also for calls that were not sealed). */
int cxr_call_check_sealed(cxr_call *call, const void *p, size_t len);

#ifdef __cplusplus
}
#endif
#endif

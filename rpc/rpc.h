/*
 * cxrpc/rpc.h: channels (server side), connections (client side), calls and futures.
 *
 * CONTRACT HEADER: written before the implementation so that rpc/, idl/ (generated stubs),
 * sandbox/ and rdma/ grow toward one API. The rpc/ implementation may add to it; changes to
 * what is here must be recorded in this comment and the README.
 *
 * A server opens a channel by name; a client connects by name and gets a connection with
 * its own heap mapped at the same address in both processes. A call passes a pointer to
 * arguments built in that heap; the handler builds its result in the same heap
 * (cxr_call_heap) and the client receives the pointer. The client owns the result and frees
 * it with cxr_conn_free(c, result) (in the pod that is cxr_heap_free on the connection heap;
 * across racks the result lives in the server's heap, replicated here).
 *
 * Targets: "name" (a channel in this pod's registry, over shared memory) or
 * "ucx://HOST:PORT/name" (a channel in another rack, over UCX).
 */
/*
 * Changes by the rpc/ implementation (see docs/rpc.md):
 *  - cxr_future_wait: a wait whose own timeout_ns (0 = no limit) passes before the call
 *    ends returns CXR_EAGAIN and leaves the call pending; the call's deadline gives
 *    CXR_ETIMEDOUT and ends it.
 *  - cxr_future_cancel returns CXR_EBUSY when the call had already ended (its outcome
 *    stands). After cxr_future_then the callback receives the result; the future must
 *    still be freed (from the callback is fine), not before the callback ran.
 *  - Futures belong to their connection: free them before cxr_conn_close, which ends
 *    calls still pending with CXR_ECLOSED (their callbacks run before it returns).
 *  - cxr_channel_on must be called before cxr_channel_serve/start (CXR_EBUSY after).
 *  - Added: inspection from outside the serving process (cxr_channel_list,
 *    cxr_channel_inspect, with cxr_channel_info / cxr_conn_info) for cxrpcctl.
 *  - Channel names: at most 32 characters of [A-Za-z0-9._-].
 *  - Added cxr_call_arg_len (bytes at args as sent).
 *  - Added cxr_conn_is_remote and cxr_conn_result_range (where results may live: the
 *    connection heap, or across racks the replica of the server's result heap), so typed
 *    stubs can ship argument ranges and check results on remote connections.
 */
#ifndef CXRPC_RPC_H
#define CXRPC_RPC_H

#include <cxrpc/shm.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cxr_channel cxr_channel;
typedef struct cxr_conn cxr_conn;
typedef struct cxr_call cxr_call;
typedef struct cxr_future cxr_future;

/* A byte range [p, p + len). Used for argument/result graphs and allowed ranges.
 * (Also declared by <cxrpc/sandbox.h>, which may not include this header: same guard.) */
#ifndef CXR_RANGE_DEFINED
#define CXR_RANGE_DEFINED
typedef struct cxr_range {
  const void *p;
  size_t len;
} cxr_range;
#endif

/* A handler runs on a server worker thread. `args` points into the connection heap (or
 * at an inline copy); it builds the result in cxr_call_heap(call), stores it in *result
 * (NULL is a valid result) and returns 0 or a CXR_E* code that the client receives. */
typedef int (*cxr_handler)(cxr_call *call, const void *args, void **result, void *user);

typedef struct cxr_channel_opts {
  unsigned mode;             /* file permissions deciding who may connect; default 0600 */
  size_t conn_heap_size;     /* bytes per connection heap; default 64 MiB */
  unsigned pool;             /* ready connections kept for fast connect; default 4 */
  unsigned max_conns;        /* default 64 */
  unsigned workers;          /* handler threads; default 1 */
  unsigned ring_slots;       /* descriptors per ring, a power of two; default 256 */
  int64_t peer_timeout_ns;   /* bound on dead-client detection; default 100 ms */
  bool untrusted;            /* peers are untrusted: validate, seal-check, sandbox */
  const char *listen;        /* also accept other racks, e.g. "ucx://0.0.0.0:7400"; NULL: no */
} cxr_channel_opts;

typedef struct cxr_conn_opts {
  int64_t default_deadline_ns;  /* for calls whose deadline_ns is 0; default 5 s */
  int64_t connect_timeout_ns;   /* default 2 s */
  int64_t peer_timeout_ns;      /* bound on dead-server detection; default 100 ms */
} cxr_conn_opts;

enum {
  CXR_CALL_SEAL = 1u << 0,    /* seal the argument pages for the call (cxrpc/sandbox.h) */
  CXR_CALL_INLINE = 1u << 1,  /* copy arg_len bytes into the descriptor (small args) */
};

typedef struct cxr_call_opts {
  int64_t deadline_ns;        /* relative timeout in ns; 0 = the connection's default */
  unsigned flags;             /* CXR_CALL_* */
  size_t arg_len;             /* bytes at args: sealed (page-rounded), copied inline, or
                                 what the handler's cxr_call_arg_len reports; 0 on a sealed
                                 call, or a remote call naming no ranges = the usable size
                                 of the heap block at args (otherwise it reports 0) */
  const cxr_range *ranges;    /* remote calls: the byte ranges of the argument graph to
                                 ship into the replica; NULL = [args, args + arg_len) */
  size_t nranges;
} cxr_call_opts;

void cxr_channel_opts_init(cxr_channel_opts *o);
void cxr_conn_opts_init(cxr_conn_opts *o);
void cxr_call_opts_init(cxr_call_opts *o);

/* ---- server ---- */
int cxr_channel_open(cxr_channel **ch, const char *name, const cxr_channel_opts *o);
int cxr_channel_on(cxr_channel *ch, uint32_t method, cxr_handler fn, void *user);
int cxr_channel_serve(cxr_channel *ch);   /* runs until cxr_channel_stop; 0 when stopped */
int cxr_channel_start(cxr_channel *ch);   /* serves on background threads instead */
void cxr_channel_stop(cxr_channel *ch);   /* from any thread (it may join the serving
                                             threads), not from a signal handler */
void cxr_channel_close(cxr_channel *ch);

/* ---- client ---- */
int cxr_connect(cxr_conn **c, const char *target, const cxr_conn_opts *o);
cxr_heap *cxr_conn_heap(cxr_conn *c);
int cxr_conn_call(cxr_conn *c, uint32_t method, const void *args, void **result,
                  const cxr_call_opts *o);
int cxr_conn_call_async(cxr_conn *c, uint32_t method, const void *args, cxr_future **f,
                        const cxr_call_opts *o);
void cxr_conn_close(cxr_conn *c);
/* Gives a call's result back when done with it. In the pod this is cxr_heap_free on the
 * connection heap; for a remote ("ucx://") connection the result lives in the server's heap
 * (replicated here at the same address) and this returns its blocks to the server. */
void cxr_conn_free(cxr_conn *c, void *result);
/* True for a "ucx://" connection (calls then ship argument ranges, cxr_call_opts.ranges). */
bool cxr_conn_is_remote(const cxr_conn *c);
/* The memory a call's result may lie in: the connection heap in the pod; across racks the
 * replica of the server's result heap for this connection. {NULL, 0} for NULL. */
cxr_range cxr_conn_result_range(cxr_conn *c);

/* ---- futures ---- */
int cxr_future_wait(cxr_future *f, int64_t timeout_ns, void **result); /* call's code */
int cxr_future_poll(cxr_future *f, void **result);   /* CXR_EAGAIN until done */
/* cb runs once, on a library thread (or at once if already done). */
int cxr_future_then(cxr_future *f, void (*cb)(int err, void *result, void *user), void *user);
int cxr_future_cancel(cxr_future *f);   /* the call ends with CXR_ECANCELED */
void cxr_future_free(cxr_future *f);    /* cancels if still pending */

/* ---- inside a handler ---- */
cxr_heap *cxr_call_heap(cxr_call *call);  /* where the handler builds results */
/* Bytes at args as sent: the inline copy's length, else the caller's arg_len (0 when the
 * caller gave none: then only the heap bounds, cxr_call_arg_range, limit it). */
size_t cxr_call_arg_len(cxr_call *call);
/* True once the caller has given up on this call: it cancelled it (cxr_future_cancel, or
 * freed its future), or the call's deadline passed. The answer will be discarded, so a
 * long handler may stop early (returning CXR_ECANCELED, say). Across racks the client's
 * CANCEL message is seen when the channel has two or more workers. Cheap: a load (a lock
 * across racks) and a clock read. */
bool cxr_call_cancelled(cxr_call *call);
/* Internal, for generated skeletons (<cxrpc/idl.h>): whether the channel validates its
 * arguments (untrusted) and whether the caller is in another rack, without the identity
 * check cxr_call_peer makes once per connection. An unknown call counts as untrusted. */
void cxr__call_kind(cxr_call *call, bool *untrusted, bool *remote);
/* The memory an argument graph may point into (the connection heap): for validators. */
cxr_range cxr_call_arg_range(cxr_call *call);
/* Remote calls: the byte ranges of the result graph to ship back; default is the usable
 * size of the block at *result. */
int cxr_call_set_result_ranges(cxr_call *call, const cxr_range *r, size_t n);

typedef struct cxr_peer {
  int pid;             /* -1 for a remote peer */
  unsigned uid;
  char host[64];       /* "" in the pod, else "hostname/pid" as the remote client sent it */
  bool trusted;
  bool verified;       /* in the pod: pid is a process that maps this connection's heap
                          (not the server, unless a client of its own) and uid its real
                          uid from /proc. false: as the client wrote them (and always
                          across racks) */
} cxr_peer;
int cxr_call_peer(cxr_call *call, cxr_peer *out);

/* ---- inspection from outside (cxrpcctl): reads the channel's shared counters ---- */
typedef struct cxr_channel_info {
  char name[CXR_NAME_MAX + 1];
  int server_pid;
  bool server_alive;
  bool open;
  unsigned mode, max_conns, pool, workers, ring_slots;
  unsigned ready, connected;       /* slots ready for fast connect; connected clients */
  uint64_t connects, disconnects, reclaimed, created;  /* created: connection heaps made */
  int64_t age_ns;
} cxr_channel_info;

typedef struct cxr_conn_info {
  unsigned slot;
  char state[12];                  /* "ready", "connected", "closing", "reclaim", "busy" */
  int client_pid;
  unsigned client_uid;
  bool client_alive;
  int64_t age_ns;                  /* since connect */
  char heap[CXR_NAME_MAX + 1];
  /* server side */
  uint64_t calls, errors, bytes_in, bytes_out, malformed, expired;
  uint64_t cancelled;              /* cancelled by the client while queued: not run */
  uint64_t inflight;               /* sent by the client, not answered yet */
  /* client side */
  uint64_t client_calls, client_errors, timeouts, cancels, peer_dead, late, stray;
} cxr_conn_info;

/* Channels in this pod's registry: fills up to max, *n gets how many exist. */
int cxr_channel_list(cxr_channel_info *out, size_t max, size_t *n);
/* One channel and its slots that are not free (up to max; *n gets how many). */
int cxr_channel_inspect(const char *name, cxr_channel_info *info, cxr_conn_info *conns,
                        size_t max, size_t *n);

#ifdef __cplusplus
}
#endif
#endif

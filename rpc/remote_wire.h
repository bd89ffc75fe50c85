/*
 * Private to rpc/ (and the hostile-peer tests): the wire format of calls across racks
 * (rpc/remote_*.c). Active message ids, headers and the range table that precedes the bytes.
 *
 *   OPEN     client -> server  r_open                      (reply OPEN_REP r_open_rep)
 *   CALL     client -> server  r_call; data: r_range[nranges], uint64_t rel[nrel],
 *                              inline bytes, then the bytes of each range in order
 *   CALL_REP server -> client  r_call_rep; data: r_range[nranges], then the bytes
 *   CLOSE    client -> server  r_close                     (reply CLOSE_REP r_close, the
 *                              client reuses its heap only after it; also sent, unanswered
 *                              by anyone, when a connect gives up after its OPEN)
 *   CANCEL   client -> server  r_cancel                    (no reply: the client gave up on
 *                              call_id; best effort, the server may have answered already)
 */
#ifndef CXRPC_RPC_REMOTE_WIRE_H
#define CXRPC_RPC_REMOTE_WIRE_H

#include <stdint.h>

#include "rpc/internal.h"

enum {
  R_OPEN = 32, R_OPEN_REP = 33, R_CALL = 34, R_CALL_REP = 35, R_CLOSE = 36, R_CLOSE_REP = 37,
  R_CANCEL = 38
};
#define R_MAGIC 0x31525843u /* "CXR1" */
#define R_MAX_RANGES 65536u
#define R_MAX_REL 1024u
/* A remote client's pending table: at most this many calls in flight per connection, and
 * a call id's low 32 bits are its index in the table (generation << 32 | index). */
#define R_CALLS_IN_FLIGHT 256u

typedef struct r_open {
  uint32_t magic, version;
  uint64_t token;    /* random: names the connection in every message of both sides, so a
                        peer that does not know it cannot act on it (ids are sequential) */
  uint64_t heap_addr, heap_size;
  char chan[CXR__CHAN_NAME_MAX + 1];
  char who[63];  /* "hostname/pid" of the client, for cxr_call_peer */
} r_open;

typedef struct r_open_rep {
  uint32_t magic;
  int32_t status;
  uint64_t token, conn_id;
  uint64_t rs_addr, rs_size;
} r_open_rep;

typedef struct r_call {
  uint32_t magic, method;
  uint64_t conn_id, call_id;
  uint64_t token;    /* the client's, as sent in OPEN: a call on a connection must carry it */
  uint64_t args, arg_len;
  int64_t deadline_rel;
  uint32_t flags, nranges, nrel, inline_len;
} r_call;

typedef struct r_call_rep {
  uint32_t magic;
  int32_t status;
  uint64_t token, call_id;
  uint64_t result;
  uint32_t nranges, pad;
} r_call_rep;

typedef struct r_close {
  uint32_t magic, pad;
  uint64_t conn_id;   /* 0: the connection opened with heap_addr and token (a connect that
                         gave up before the OPEN's answer, which has the id) */
  uint64_t token;     /* the client's, as sent in OPEN; echoed in CLOSE_REP */
  uint64_t heap_addr; /* the client's heap, as sent in OPEN */
} r_close;

typedef struct r_cancel {
  uint32_t magic, pad;
  uint64_t conn_id;
  uint64_t token;    /* the client's, as sent in OPEN: only the owner cancels */
  uint64_t call_id;
} r_cancel;

typedef struct r_range {
  uint64_t addr, len;
} r_range;

#endif

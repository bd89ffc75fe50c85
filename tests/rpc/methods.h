/* Methods served by the rpc test server (rpc_peer and in-process tests). */
#ifndef CXRPC_TESTS_RPC_METHODS_H
#define CXRPC_TESTS_RPC_METHODS_H

#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cxrpc/rpc.h>

#include "tests/rpc/spin.h"

/* Results are allocated by server threads and freed by the client process; a block freed
 * there and allocated again by another server thread would look like a race to TSan, which
 * cannot see synchronisation through another process: rpc/serve.c orders each connection's
 * handlers for it under TSan. */
static inline void *alloc_result(cxr_call *c, size_t n) {
  return cxr_heap_alloc(cxr_call_heap(c), n);
}

enum { M_NOOP = 1, M_ADD = 2, M_SLEEP = 3, M_FAIL = 4, M_ECHO = 5, M_PID = 6, M_SPIN = 7,
       M_PEER = 8 };

typedef struct add_args { int64_t a, b; } add_args;
typedef struct sleep_args { int64_t ms; } sleep_args;

static inline int m_noop(cxr_call *c, const void *a, void **r, void *u) {
  (void)c, (void)a, (void)r, (void)u;
  return 0;
}
static inline int m_add(cxr_call *c, const void *a, void **r, void *u) {
  (void)u;
  if (a == NULL) return CXR_EINVAL;
  const add_args *x = (const add_args *)a;
  int64_t *out = (int64_t *)alloc_result(c, sizeof *out);
  if (out == NULL) return CXR_ENOMEM;
  *out = x->a + x->b;
  *r = out;
  return 0;
}
static inline int m_sleep(cxr_call *c, const void *a, void **r, void *u) {
  (void)u;
  if (a == NULL) return CXR_EINVAL;
  int64_t ms = ((const sleep_args *)a)->ms;
  if (ms < 0 || ms > 60000) return CXR_EINVAL;
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000};
  nanosleep(&ts, NULL);
  int64_t *out = (int64_t *)alloc_result(c, sizeof *out);
  if (out == NULL) return CXR_ENOMEM;
  *out = ms;
  *r = out;
  return 0;
}
static inline int m_fail(cxr_call *c, const void *a, void **r, void *u) {
  (void)c, (void)a, (void)r, (void)u;
  return CXR_EPERM;
}
static inline int m_echo(cxr_call *c, const void *a, void **r, void *u) {
  (void)u;
  cxr_heap *h = cxr_call_heap(c);
  size_t n = cxr_call_arg_len(c); /* inline bytes, or what the caller said */
  if (a == NULL) return 0;
  if (n == 0) n = cxr_heap_usable_size(h, a);
  void *out = alloc_result(c, n);
  if (out == NULL) return CXR_ENOMEM;
  memcpy(out, a, n);
  *r = out;
  return 0;
}
static inline int m_pid(cxr_call *c, const void *a, void **r, void *u) {
  (void)a, (void)u;
  int64_t *out = (int64_t *)alloc_result(c, sizeof *out);
  if (out == NULL) return CXR_ENOMEM;
  *out = getpid();
  *r = out;
  return 0;
}

/* M_SPIN (sleep_args): tests/rpc/spin.h; counts per process (in-process tests read them). */
static spin_counts spin_seen;

/* M_PEER: the caller as cxr_call_peer sees it (a cxr_peer in the connection heap). */
static inline int m_peer(cxr_call *c, const void *a, void **r, void *u) {
  (void)a, (void)u;
  cxr_peer *p = (cxr_peer *)cxr_heap_alloc(cxr_call_heap(c), sizeof *p);
  if (p == NULL) return CXR_ENOMEM;
  int rc = cxr_call_peer(c, p);
  *r = p;
  return rc;
}

static inline int register_methods(cxr_channel *ch) {
  int rc = 0;
  rc |= cxr_channel_on(ch, M_NOOP, m_noop, NULL);
  rc |= cxr_channel_on(ch, M_ADD, m_add, NULL);
  rc |= cxr_channel_on(ch, M_SLEEP, m_sleep, NULL);
  rc |= cxr_channel_on(ch, M_FAIL, m_fail, NULL);
  rc |= cxr_channel_on(ch, M_ECHO, m_echo, NULL);
  rc |= cxr_channel_on(ch, M_PID, m_pid, NULL);
  rc |= cxr_channel_on(ch, M_SPIN, spin_handler, &spin_seen);
  rc |= cxr_channel_on(ch, M_PEER, m_peer, NULL);
  return rc;
}

#endif

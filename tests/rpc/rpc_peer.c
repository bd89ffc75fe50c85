/* A peer process for the multi-process rpc tests (started with posix_spawn):
 *   rpc_peer server NAME WORKERS   serve the test methods; print "ready\n"; stop on SIGTERM
 *   rpc_peer client NAME MS        connect, print "connected\n", call M_SLEEP(MS) forever
 *   rpc_peer connect NAME MS       exit with -(cxr_connect's code); MS > 0: connect timeout
 *   rpc_peer scribble NAME ROUNDS  a client that fills its request ring with garbage
 *   rpc_peer impostor NAME PID     a client that writes PID (0: its own) and uid 4242 into
 *                                  its slot, asks M_PEER through its raw rings and prints
 *                                  "peer <verified> <pid> <uid>" as the server saw it
 * Both print to stdout (a pipe to the test) and exit non-zero on errors. */
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include <cxrpc/rpc.h>

#include "rpc/internal.h"
#include "shm/proc.h"

#include "tests/rpc/methods.h"

static int server(const char *name, unsigned workers) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, NULL); /* worker threads inherit the mask */
  cxr_channel_opts o;
  cxr_channel_opts_init(&o);
  o.workers = workers;
  o.conn_heap_size = 8u << 20;
  cxr_channel *ch;
  int rc = cxr_channel_open(&ch, name, &o);
  if (rc != 0) {
    fprintf(stderr, "rpc_peer: open %s: %s\n", name, cxr_strerror(rc));
    return 1;
  }
  if (register_methods(ch) != 0 || cxr_channel_start(ch) != 0) return 1;
  printf("ready\n");
  fflush(stdout);
  int sig;
  sigwait(&set, &sig);
  cxr_channel_close(ch);
  return 0;
}

static int client(const char *name, int64_t ms) {
  cxr_conn *c;
  int rc = cxr_connect(&c, name, NULL);
  if (rc != 0) {
    fprintf(stderr, "rpc_peer: connect %s: %s\n", name, cxr_strerror(rc));
    return 1;
  }
  printf("connected\n");
  fflush(stdout);
  for (;;) {
    sleep_args *a = (sleep_args *)cxr_heap_alloc(cxr_conn_heap(c), sizeof *a);
    if (a == NULL) return 2;
    a->ms = ms;
    cxr_call_opts co;
    cxr_call_opts_init(&co);
    co.deadline_ns = 60000000000;
    void *res = NULL;
    rc = cxr_conn_call(c, M_SLEEP, a, &res, &co);
    cxr_heap_free(cxr_conn_heap(c), a);
    if (res) cxr_heap_free(cxr_conn_heap(c), res);
    if (rc != 0) return 3;
  }
}

/* A buggy client: overwrites its request ring's positions, sequence numbers and descriptors
 * with garbage (rounds times, ringing the server each time), then makes one call with a
 * 50 ms deadline and prints its code. */
/* Connects, then shrinks its connection heap's file to `keep` bytes (every process that maps
 * it past that gets SIGBUS there) and stays alive, touching nothing, until killed. */
static int shrink(const char *name, long keep) {
  cxr_conn *c;
  if (cxr_connect(&c, name, NULL) != 0) return 1;
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/%s.heap", cxr_root(), cxr_heap_name(cxr_conn_heap(c)));
  if (truncate(path, keep) != 0) return 2;
  printf("shrunk\n");
  fflush(stdout);
  for (;;) pause();
}

static int scribble(const char *name, int rounds) {
  cxr_conn *c;
  int rc = cxr_connect(&c, name, NULL);
  if (rc != 0) return 1;
  cxr__rview req, resp;
  if (cxr__conn_rings(c, &req, &resp) != 0) return 1;
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (int round = 0; round < rounds; round++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    __atomic_store_n(&req.r->head, x >> 7, __ATOMIC_RELEASE);
    __atomic_store_n(&req.r->tail, x >> 3, __ATOMIC_RELEASE);
    for (uint32_t i = 0; i <= req.mask; i++) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      /* Half the slots look published at the current head: the server will pop them. */
      cxr__slot *s = &req.s[i];
      __atomic_store_n(&s->seq, (uint32_t)((i & 1) ? (x >> 5) : req.r->head + 1), __ATOMIC_RELEASE);
      s->ptr = x;
      s->len_flags = (x >> 11) << 16 | ((x >> 40) & 3);
      s->method = (uint32_t)(x % 8);
      s->call_id = x;
      s->seal = (uint32_t)(x >> 13);
    }
    cxr__desc d;
    memset(&d, 0, sizeof d);
    cxr__conn_push_raw(c, &d); /* rings the doorbell (the push itself may fail) */
    usleep(1000);
  }
  cxr_call_opts o;
  cxr_call_opts_init(&o);
  o.deadline_ns = 50000000;
  rc = cxr_conn_call(c, M_NOOP, NULL, NULL, &o);
  printf("scribbled %d\n", rc);
  fflush(stdout);
  cxr_conn_close(c);
  return 0;
}

/* Says why an impostor gave up (its test only sees the exit status otherwise). */
static int impostor_fail(const char *step, int rc) {
  fprintf(stderr, "impostor: %s: %s\n", step, cxr_strerror(rc));
  return 1;
}

static int impostor(const char *name, int pid) {
  cxr_conn *c;
  /* Generous waits: the test runs beside many others under ThreadSanitizer, where a connect
   * (the pool refilled by the server's manager) has taken more than the default 2 s. */
  cxr_conn_opts co;
  cxr_conn_opts_init(&co);
  co.connect_timeout_ns = 20000000000;
  int rc = cxr_connect(&c, name, &co);
  if (rc != 0) return impostor_fail("connect", rc);
  char ctl_name[CXR_NAME_MAX + 1];
  snprintf(ctl_name, sizeof ctl_name, "ch.%s", name);
  cxr_heap *ctl;
  if ((rc = cxr_heap_open(&ctl, ctl_name)) != 0) return impostor_fail("control heap", rc);
  cxr__chan_block *cb = cxr_heap_get_root(ctl);
  cxr__conn_block *b = cxr_heap_get_root(cxr_conn_heap(c));
  if (cb == NULL || b == NULL) return impostor_fail("roots", CXR_ECORRUPT);
  cxr__cslot *s = &cb->slots[b->slot];
  uint64_t o = __atomic_load_n(&s->owner, __ATOMIC_ACQUIRE), start;
  /* The named process's start time too: with ours beside its pid, the server's liveness
   * check would find no such process and reclaim the slot before the call is answered
   * (which happened under TSan), and the test would learn nothing about verification. */
  if (pid != 0 && cxr__proc_start_time(pid, &start) == 0)
    __atomic_store_n(&s->client_start, start, __ATOMIC_RELEASE);
  if (pid != 0)
    __atomic_store_n(&s->owner, cxr__owner((uint32_t)pid, cxr__owner_state(o), cxr__owner_gen(o)),
                     __ATOMIC_RELEASE);
  __atomic_store_n(&s->client_uid, 4242u, __ATOMIC_RELEASE);
  /* Raw descriptors: the library's own calls would notice the changed owner and end. */
  cxr__desc d, r;
  memset(&d, 0, sizeof d);
  d.call_id = (uint64_t)1 << 32; /* generation 1, entry 0 */
  d.method = M_PEER;
  d.deadline = cxr_now_ns() + 20000000000;
  if ((rc = cxr__conn_push_raw(c, &d)) != 0) return impostor_fail("push", rc);
  if ((rc = cxr__conn_pop_raw(c, &r, 20000000000)) != 0) return impostor_fail("answer", rc);
  const cxr_peer *p = (const cxr_peer *)(uintptr_t)r.ptr;
  if (r.status != 0) return impostor_fail("call", r.status);
  if (p == NULL || !cxr_heap_contains(cxr_conn_heap(c), p, sizeof *p))
    return impostor_fail("result", CXR_EBADPTR);
  printf("peer %d %d %u\n", p->verified ? 1 : 0, p->pid, p->uid);
  fflush(stdout);
  _exit(0); /* its slot stays claimed under the other pid; the channel's close ends it */
}

/* Exits with -rc of cxr_connect (0 when it connected). */
static int try_connect(const char *name, int64_t timeout_ms) {
  cxr_conn *c;
  cxr_conn_opts co;
  cxr_conn_opts_init(&co);
  if (timeout_ms > 0) co.connect_timeout_ns = timeout_ms * 1000000;
  int rc = cxr_connect(&c, name, &co);
  if (rc == 0) cxr_conn_close(c);
  return -rc;
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "connect") == 0) return try_connect(argv[2], atoll(argv[3]));
  if (argc == 4 && strcmp(argv[1], "scribble") == 0) return scribble(argv[2], atoi(argv[3]));
  if (argc == 4 && strcmp(argv[1], "shrink") == 0) return shrink(argv[2], atol(argv[3]));
  if (argc == 4 && strcmp(argv[1], "impostor") == 0) return impostor(argv[2], atoi(argv[3]));
  if (argc == 4 && strcmp(argv[1], "server") == 0) return server(argv[2], (unsigned)atoi(argv[3]));
  if (argc == 4 && strcmp(argv[1], "client") == 0) return client(argv[2], atoll(argv[3]));
  fprintf(stderr, "usage: rpc_peer server NAME WORKERS | client NAME MS\n");
  return 2;
}

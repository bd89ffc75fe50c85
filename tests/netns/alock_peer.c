/* A participant in the ALock test, on the public API only.
 *   alock_peer host LISTEN ITERS SLOT    creates the lock in a pod heap ("alock"), exports
 *                                        it on LISTEN ("ADDR:PORT"), then takes part
 *   alock_peer local ITERS SLOT          another process of the pod: maps the heap
 *   alock_peer remote HOST:PORT ITERS SLOT  a host in another rack: UCX only
 * Each prints "READY", waits for "go" on stdin, runs ITERS critical sections (read the
 * counter, claim the owner word, check it, write counter + 1) and prints
 * "done <violations> <timeouts>". The host then answers "check" with "count <counter>". */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cxrpc/rdma.h>
#include <cxrpc/shm.h>

typedef struct shared {
  cxr_alock lock;
  uint64_t counter __attribute__((aligned(64)));
  uint64_t owner;
} shared;

static char line[128];
static void wait_word(const char *w) {
  while (fgets(line, sizeof line, stdin))
    if (!strncmp(line, w, strlen(w))) return;
  exit(0);
}

/* One critical section from the pod: plain loads and stores. */
static int cs_local(shared *s, uint64_t tag) {
  volatile uint64_t *c = &s->counter, *o = &s->owner;
  uint64_t v = *c;
  *o = tag;
  for (int i = 0; i < 50; i++) __builtin_ia32_pause();
  int bad = *o != tag;
  *c = v + 1;
  return bad;
}

/* The same from another rack: 8-byte RDMA reads and writes. */
static int cs_remote(cxr_alock_ref *r, uint64_t tag) {
  uint64_t base = r->addr, v = 0, o = 0;
  uint64_t c_at = base + offsetof(shared, counter), o_at = base + offsetof(shared, owner);
  if (cxr_rdma_get(r->ep, r->rk, c_at, &v, 8, 0) || cxr_rdma_put(r->ep, r->rk, o_at, &tag, 8, 0))
    return 1;
  if (cxr_rdma_get(r->ep, r->rk, o_at, &o, 8, 0)) return 1;
  v++;
  if (cxr_rdma_put(r->ep, r->rk, c_at, &v, 8, 0)) return 1;
  return o != tag;
}

static void run(cxr_alock_ref *r, shared *s, long iters) {
  uint64_t tag = ((uint64_t)getpid() << 8) | r->slot;
  long bad = 0, timeouts = 0;
  for (long i = 0; i < iters; i++) {
    int rc = cxr_alock_lock(r, cxr_now_ns() + 20000000000);
    if (rc) {
      timeouts++;
      continue;
    }
    bad += s ? cs_local(s, tag) : cs_remote(r, tag);
    if (cxr_alock_unlock(r) != 0) bad++;
    if (i % 64 == 0) sched_yield();
  }
  printf("done %ld %ld\n", bad, timeouts);
  fflush(stdout);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc == 5 && !strcmp(argv[1], "host")) {
    cxr_heap *h;
    int rc = cxr_heap_create(&h, "alock", 4u << 20, NULL);
    shared *s = rc ? NULL : cxr_heap_alloc_aligned(h, 64, sizeof *s);
    if (s == NULL) return printf("err %d\n", rc ? rc : cxr_last_error()), 1;
    memset(s, 0, sizeof *s);
    cxr_alock_init(&s->lock, 0);
    cxr_heap_set_root(h, s);
    cxr_rdma_opts o;
    cxr_rdma_opts_init(&o);
    o.listen = argv[2];
    cxr_rdma *r;
    cxr_rdma_mr *mr;
    if ((rc = cxr_rdma_open(&r, &o)) || (rc = cxr_rdma_export(r, "alock", s, sizeof *s, &mr)))
      return printf("err %d\n", rc), 1;
    printf("READY\n");
    wait_word("go");
    cxr_alock_ref ref = {.local = &s->lock, .slot = (unsigned)atoi(argv[4])};
    run(&ref, s, atol(argv[3]));
    wait_word("check");
    printf("count %llu\n", (unsigned long long)__atomic_load_n(&s->counter, __ATOMIC_ACQUIRE));
    wait_word("quit");
    cxr_rdma_close(r);
    cxr_heap_close(h);
    cxr_heap_unlink("alock");
    return 0;
  }
  if (argc == 4 && !strcmp(argv[1], "local")) {
    cxr_heap *h;
    int rc = cxr_heap_open(&h, "alock");
    shared *s = rc ? NULL : cxr_heap_get_root(h);
    if (s == NULL) return printf("err %d\n", rc), 1;
    printf("READY\n");
    wait_word("go");
    cxr_alock_ref ref = {.local = &s->lock, .slot = (unsigned)atoi(argv[3])};
    run(&ref, s, atol(argv[2]));
    wait_word("quit");
    cxr_heap_close(h);
    return 0;
  }
  if (argc == 5 && !strcmp(argv[1], "remote")) {
    cxr_rdma *r;
    cxr_rdma_ep *ep;
    cxr_alock_ref ref = {.slot = (unsigned)atoi(argv[4])};
    size_t len;
    int rc = cxr_rdma_open(&r, NULL);
    if (!rc) rc = cxr_rdma_connect(r, argv[2], 0, &ep);
    if (!rc) rc = cxr_rdma_rkey_get(ep, "alock", &ref.rk, &ref.addr, &len);
    if (rc) return printf("err %d\n", rc), 1;
    ref.ep = ep;
    printf("READY\n");
    wait_word("go");
    run(&ref, NULL, atol(argv[3]));
    wait_word("quit");
    cxr_rdma_ep_close(ep);
    cxr_rdma_close(r);
    return 0;
  }
  fprintf(stderr, "usage: see the comment at the top of alock_peer.c\n");
  return 2;
}

/* kv_server: a memcached-like store served over cxrpc (get, set, delete, stats) with the
 * stubs generated from kv.proto (service kv.KV).
 *   kv_server [--workers N] [--channel NAME] [--heap MiB] [--unix PATH] [--listen ucx://ADDR:PORT]
 *             [--untrusted]
 * --untrusted makes the generated skeleton validate every request graph before a handler.
 * Prints "kv_server ready on channel NAME" and serves until SIGINT or SIGTERM.
 * The store is process-private memory (store.c); values cross the call boundary by pointer
 * and are copied exactly once each way. --unix PATH also serves the same store over a Unix
 * socket (unix.c), the baseline kv_load --unix measures. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cxrpc/rpc.h>

#include "examples/kvstore/kv.cxr.h"
#include "examples/kvstore/kv.h"
#include "examples/kvstore/store.h"
#include "examples/kvstore/unix.h"

/* The handlers run behind the generated skeleton (kv.cxr.c). The channel is trusted by
 * default, as memcached's clients are: the skeleton checks only that the request struct
 * lies in the heap and does not walk requests, so the handlers check the two pointers they
 * follow (key and value inside the caller's heap, which across racks is our replica of
 * it), as cheap as the raw API's checks were. --untrusted makes the skeleton validate every
 * request graph first. Results are built in cxr_call_heap(call); across racks the skeleton
 * ships the whole result graph back. */
/* A bytes field of a request, read exactly once. The request lives in the caller's heap,
 * which the caller can keep writing while we run (--untrusted too: the skeleton's check was
 * of what the field held then), so a field read twice can change between its check and its
 * use: a length checked at 8 and used at 64 KiB overran the key buffer on our stack. Every
 * handler loads each field here once and checks and uses only the copy. */
static cxr_bytes load_bytes(const cxr_bytes *b) {
  return (cxr_bytes){.ptr = __atomic_load_n(&b->ptr, __ATOMIC_RELAXED),
                     .len = __atomic_load_n(&b->len, __ATOMIC_RELAXED)};
}

/* b is a local copy (load_bytes): checking it checks what is used. */
static int check_bytes(cxr_call *call, cxr_bytes b, size_t max) {
  if (b.len > max) return CXR_EINVAL;
  if (b.len == 0) return 0;
  cxr_range r = cxr_call_arg_range(call);
  uintptr_t p = (uintptr_t)b.ptr, lo = (uintptr_t)r.p;
  return p >= lo && p - lo <= r.len && b.len <= r.len - (p - lo) ? 0 : CXR_EBADPTR;
}

/* The key field, loaded and checked once and its bytes copied out of shared memory before
 * they are used; *kl is the checked length, the only one used afterwards. */
static int take_key(cxr_call *call, const cxr_bytes *field, char copy[KV_KEY_MAX],
                    uint32_t *kl) {
  cxr_bytes k = load_bytes(field);
  if (k.len == 0) return CXR_EINVAL;
  int rc = check_bytes(call, k, KV_KEY_MAX);
  if (rc) return rc;
  memcpy(copy, k.ptr, k.len);
  *kl = (uint32_t)k.len;
  return 0;
}

static void *heap_alloc(void *ctx, size_t n) { return cxr_heap_alloc(ctx, n); }

static int kv_get(cxr_call *call, const kv_GetRequest *rq, kv_GetResponse **rs, void *user) {
  char key[KV_KEY_MAX];
  uint32_t kl;
  int rc = take_key(call, &rq->key, key, &kl);
  if (rc) return rc;
  cxr_heap *h = cxr_call_heap(call);
  void *v;
  uint32_t vl;
  if ((rc = store_get(user, key, kl, heap_alloc, h, &v, &vl)) || v == NULL)
    return rc; /* a miss: NULL result */
  kv_GetResponse *r = kv_GetResponse_new(h);
  if (r == NULL) {
    cxr_heap_free(h, v);
    return CXR_ENOMEM;
  }
  r->value.ptr = v; /* the copy store_get made in the call heap: no second copy */
  r->value.len = vl;
  *rs = r;
  return 0;
}

static int kv_set(cxr_call *call, const kv_SetRequest *rq, kv_SetResponse **rs, void *user) {
  char key[KV_KEY_MAX];
  uint32_t kl;
  int rc = take_key(call, &rq->key, key, &kl);
  if (rc) return rc;
  cxr_bytes value = load_bytes(&rq->value);
  if ((rc = check_bytes(call, value, KV_VALUE_MAX)) != 0) return rc;
  (void)rs;
  /* the value's bytes may still change under the copy store_set makes: the caller's own
   * data, torn at worst, and never more than the checked length */
  return store_set(user, key, kl, value.ptr, (uint32_t)value.len);
}

static int kv_delete(cxr_call *call, const kv_DeleteRequest *rq, kv_DeleteResponse **rs,
                     void *user) {
  char key[KV_KEY_MAX];
  uint32_t kl;
  int rc = take_key(call, &rq->key, key, &kl);
  (void)rs;
  return rc ? rc : store_del(user, key, kl);
}

static int kv_stats_fn(cxr_call *call, const kv_StatsRequest *rq, kv_StatsResponse **rs,
                       void *user) {
  kv_StatsResponse *r = kv_StatsResponse_new(cxr_call_heap(call));
  if (r == NULL) return CXR_ENOMEM;
  kv_stats st;
  store_stats(user, &st);
  *r = (kv_StatsResponse){.items = st.items, .bytes = st.bytes, .gets = st.gets,
                          .hits = st.hits, .sets = st.sets, .deletes = st.deletes};
  *rs = r;
  (void)rq;
  return 0;
}

int main(int argc, char **argv) {
  cxr_channel_opts o;
  cxr_channel_opts_init(&o);
  const char *name = KV_CHANNEL, *unix_path = NULL;
  o.conn_heap_size = 64u << 20;
  o.max_conns = 32;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--workers") && i + 1 < argc) o.workers = (unsigned)atoi(argv[++i]);
    else if (!strcmp(argv[i], "--channel") && i + 1 < argc) name = argv[++i];
    else if (!strcmp(argv[i], "--heap") && i + 1 < argc) o.conn_heap_size = (size_t)atoi(argv[++i]) << 20;
    else if (!strcmp(argv[i], "--unix") && i + 1 < argc) unix_path = argv[++i];
    else if (!strcmp(argv[i], "--listen") && i + 1 < argc) o.listen = argv[++i]; /* other racks */
    else if (!strcmp(argv[i], "--untrusted")) o.untrusted = true;
    else {
      fprintf(stderr, "usage: kv_server [--workers N] [--channel NAME] [--heap MiB] [--unix PATH]\n"
                      "                 [--listen ucx://ADDR:PORT] [--untrusted]\n");
      return 2;
    }
  }
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, NULL); /* handler threads inherit it; main waits below */
  store *s = store_new();
  if (s == NULL) return 1;
  cxr_channel *ch;
  int rc = cxr_channel_open(&ch, name, &o);
  if (rc != 0) {
    fprintf(stderr, "kv_server: cannot open channel %s: %s\n", name, cxr_strerror(rc));
    return 1;
  }
  static kv_KV_server srv = {.handlers = {.Get = kv_get, .Set = kv_set, .Delete = kv_delete,
                                          .Stats = kv_stats_fn}};
  srv.user = s;
  cxr_limits_init(&srv.limits);
  srv.limits.max_len = KV_VALUE_MAX; /* no bytes field longer than a value */
  srv.limits.max_nodes = 16;
  if ((rc = kv_KV_serve(ch, &srv)) != 0) {
    fprintf(stderr, "kv_server: %s\n", cxr_strerror(rc));
    return 1;
  }
  if ((rc = cxr_channel_start(ch)) != 0) {
    fprintf(stderr, "kv_server: %s\n", cxr_strerror(rc));
    return 1;
  }
  /* The same store also behind a Unix socket: the baseline kv_load --unix compares with. */
  kv_unix *ux = NULL;
  if (unix_path != NULL && (rc = kv_unix_start(&ux, unix_path, s)) != 0) {
    fprintf(stderr, "kv_server: cannot listen on %s\n", unix_path);
    return 1;
  }
  printf("kv_server ready on channel %s (%u worker%s, pid %d)%s%s\n", name, o.workers,
         o.workers == 1 ? "" : "s", (int)getpid(), unix_path ? " and unix socket " : "",
         unix_path ? unix_path : "");
  fflush(stdout);
  int sig;
  sigwait(&set, &sig);
  kv_unix_stop(ux);
  cxr_channel_close(ch);
  kv_stats st;
  store_stats(s, &st);
  printf("kv_server: %llu items, %llu bytes; %llu gets (%llu hits), %llu sets, %llu deletes\n",
         (unsigned long long)st.items, (unsigned long long)st.bytes, (unsigned long long)st.gets,
         (unsigned long long)st.hits, (unsigned long long)st.sets, (unsigned long long)st.deletes);
  store_free(s);
  return 0;
}

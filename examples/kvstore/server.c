/* kv_server: a memcached-like store served over cxrpc (get, set, delete, stats).
 *   kv_server [--workers N] [--channel NAME] [--heap MiB] [--unix PATH] [--listen ucx://ADDR:PORT]
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

#include "examples/kvstore/kv.h"
#include "examples/kvstore/store.h"
#include "examples/kvstore/unix.h"

/* Checks a request from the (possibly buggy) client: the struct and its key inside what was
 * sent, the value inside the connection heap. Returns 0 or a CXR_E* code. */
static int check_req(cxr_call *call, const void *args, const kv_req **out, bool want_value) {
  if (args == NULL) return CXR_EINVAL;
  cxr_range heap = cxr_call_arg_range(call);
  size_t sent = cxr_call_arg_len(call);
  const kv_req *r = args;
  const char *lo = heap.p, *hi = lo + heap.len, *p = args;
  bool in_heap = p >= lo && p < hi;
  size_t room = sent ? sent : in_heap ? (size_t)(hi - p) : 0;
  if (room < offsetof(kv_req, key)) return CXR_EPROTO;
  uint32_t kl = r->key_len, vl = r->value_len;
  if (kl == 0 || kl > KV_KEY_MAX || KV_REQ_SIZE(kl) > room) return CXR_EPROTO;
  if (want_value) {
    const char *v = (const char *)(uintptr_t)r->value;
    if (vl > KV_VALUE_MAX) return CXR_EINVAL;
    if (vl && (v < lo || v > hi || (size_t)(hi - v) < vl)) return CXR_EBADPTR;
  }
  *out = r;
  return 0;
}

static void *heap_alloc(void *ctx, size_t n) { return cxr_heap_alloc(cxr_call_heap(ctx), n); }

static int kv_get(cxr_call *call, const void *args, void **result, void *user) {
  const kv_req *r;
  int rc = check_req(call, args, &r, false);
  if (rc) return rc;
  char key[KV_KEY_MAX];
  uint32_t kl = r->key_len;
  memcpy(key, r->key, kl); /* copied once out of shared memory */
  kv_value *v;
  rc = store_get(user, key, kl, heap_alloc, call, &v);
  *result = v;
  return rc;
}

static int kv_set(cxr_call *call, const void *args, void **result, void *user) {
  const kv_req *r;
  int rc = check_req(call, args, &r, true);
  if (rc) return rc;
  /* Key copied out of shared memory first (the client could change it while we look). */
  char key[KV_KEY_MAX];
  uint32_t kl = r->key_len, vl = r->value_len;
  memcpy(key, r->key, kl);
  (void)result;
  return store_set(user, key, kl, (const void *)(uintptr_t)r->value, vl);
}

static int kv_delete(cxr_call *call, const void *args, void **result, void *user) {
  const kv_req *r;
  int rc = check_req(call, args, &r, false);
  if (rc) return rc;
  char key[KV_KEY_MAX];
  uint32_t kl = r->key_len;
  memcpy(key, r->key, kl);
  (void)result;
  return store_del(user, key, kl);
}

static int kv_stats_fn(cxr_call *call, const void *args, void **result, void *user) {
  kv_stats *st = cxr_heap_alloc(cxr_call_heap(call), sizeof *st);
  if (st == NULL) return CXR_ENOMEM;
  store_stats(user, st);
  *result = st;
  (void)args;
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
    else {
      fprintf(stderr, "usage: kv_server [--workers N] [--channel NAME] [--heap MiB] [--unix PATH]\n"
                      "                 [--listen ucx://ADDR:PORT]\n");
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
  cxr_channel_on(ch, KV_GET, kv_get, s);
  cxr_channel_on(ch, KV_SET, kv_set, s);
  cxr_channel_on(ch, KV_DELETE, kv_delete, s);
  cxr_channel_on(ch, KV_STATS, kv_stats_fn, s);
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

/* kv_server: a memcached-like store served over cxrpc (get, set, delete, stats).
 *   kv_server [--workers N] [--channel NAME] [--heap MiB]
 * Prints "kv_server ready on channel NAME" and serves until SIGINT or SIGTERM.
 * The store is process-private memory (a hash table with striped locks); values cross the
 * call boundary by pointer and are copied exactly once each way. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cxrpc/rpc.h>

#include "examples/kvstore/kv.h"

#define STRIPES 64u
#define BUCKETS (1u << 16)

typedef struct item {
  struct item *next;
  uint64_t hash;
  uint32_t key_len, value_len;
  char *value;
  char key[];
} item;

typedef struct store {
  item *buckets[BUCKETS];
  pthread_rwlock_t locks[STRIPES];
  uint64_t items, bytes;                         /* under the stripe locks: atomics */
  uint64_t gets, hits, sets, deletes;            /* atomics */
} store;

static uint64_t hash_key(const char *k, uint32_t n) {
  uint64_t h = 1469598103934665603ull;
  for (uint32_t i = 0; i < n; i++) h = (h ^ (unsigned char)k[i]) * 1099511628211ull;
  return h;
}

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

static int kv_get(cxr_call *call, const void *args, void **result, void *user) {
  store *s = user;
  const kv_req *r;
  int rc = check_req(call, args, &r, false);
  if (rc) return rc;
  uint64_t h = hash_key(r->key, r->key_len);
  __atomic_fetch_add(&s->gets, 1, __ATOMIC_RELAXED);
  pthread_rwlock_t *l = &s->locks[h % STRIPES];
  pthread_rwlock_rdlock(l);
  for (item *it = s->buckets[h % BUCKETS]; it; it = it->next) {
    if (it->hash == h && it->key_len == r->key_len && !memcmp(it->key, r->key, r->key_len)) {
      kv_value *v = cxr_heap_alloc(cxr_call_heap(call), sizeof *v + it->value_len);
      if (v == NULL) {
        pthread_rwlock_unlock(l);
        return CXR_ENOMEM;
      }
      v->len = it->value_len;
      memcpy(v->data, it->value, it->value_len);
      pthread_rwlock_unlock(l);
      __atomic_fetch_add(&s->hits, 1, __ATOMIC_RELAXED);
      *result = v;
      return 0;
    }
  }
  pthread_rwlock_unlock(l);
  return 0; /* a miss: NULL result */
}

static int kv_set(cxr_call *call, const void *args, void **result, void *user) {
  store *s = user;
  const kv_req *r;
  int rc = check_req(call, args, &r, true);
  if (rc) return rc;
  /* Copy key and value out of shared memory before using them (the client could change
   * them while we look). */
  uint32_t kl = r->key_len, vl = r->value_len;
  item *n = malloc(sizeof *n + kl);
  char *val = malloc(vl ? vl : 1);
  if (n == NULL || val == NULL) {
    free(n);
    free(val);
    return CXR_ENOMEM;
  }
  memcpy(n->key, r->key, kl);
  if (vl) memcpy(val, (const void *)(uintptr_t)r->value, vl);
  n->key_len = kl;
  n->value_len = vl;
  n->value = val;
  n->hash = hash_key(n->key, kl);
  __atomic_fetch_add(&s->sets, 1, __ATOMIC_RELAXED);
  pthread_rwlock_t *l = &s->locks[n->hash % STRIPES];
  pthread_rwlock_wrlock(l);
  item **pp = &s->buckets[n->hash % BUCKETS];
  for (; *pp; pp = &(*pp)->next) {
    item *it = *pp;
    if (it->hash == n->hash && it->key_len == kl && !memcmp(it->key, n->key, kl)) {
      n->next = it->next;
      *pp = n;
      __atomic_fetch_add(&s->bytes, (uint64_t)vl - it->value_len, __ATOMIC_RELAXED);
      pthread_rwlock_unlock(l);
      free(it->value);
      free(it);
      return 0;
    }
  }
  n->next = NULL;
  *pp = n;
  __atomic_fetch_add(&s->items, 1, __ATOMIC_RELAXED);
  __atomic_fetch_add(&s->bytes, vl, __ATOMIC_RELAXED);
  pthread_rwlock_unlock(l);
  (void)result;
  return 0;
}

static int kv_delete(cxr_call *call, const void *args, void **result, void *user) {
  store *s = user;
  const kv_req *r;
  int rc = check_req(call, args, &r, false);
  if (rc) return rc;
  uint64_t h = hash_key(r->key, r->key_len);
  __atomic_fetch_add(&s->deletes, 1, __ATOMIC_RELAXED);
  pthread_rwlock_t *l = &s->locks[h % STRIPES];
  pthread_rwlock_wrlock(l);
  for (item **pp = &s->buckets[h % BUCKETS]; *pp; pp = &(*pp)->next) {
    item *it = *pp;
    if (it->hash == h && it->key_len == r->key_len && !memcmp(it->key, r->key, r->key_len)) {
      *pp = it->next;
      __atomic_fetch_sub(&s->items, 1, __ATOMIC_RELAXED);
      __atomic_fetch_sub(&s->bytes, it->value_len, __ATOMIC_RELAXED);
      pthread_rwlock_unlock(l);
      free(it->value);
      free(it);
      return 0;
    }
  }
  pthread_rwlock_unlock(l);
  (void)result;
  return CXR_ENOENT;
}

static int kv_stats_fn(cxr_call *call, const void *args, void **result, void *user) {
  store *s = user;
  kv_stats *st = cxr_heap_alloc(cxr_call_heap(call), sizeof *st);
  if (st == NULL) return CXR_ENOMEM;
  st->items = __atomic_load_n(&s->items, __ATOMIC_RELAXED);
  st->bytes = __atomic_load_n(&s->bytes, __ATOMIC_RELAXED);
  st->gets = __atomic_load_n(&s->gets, __ATOMIC_RELAXED);
  st->hits = __atomic_load_n(&s->hits, __ATOMIC_RELAXED);
  st->sets = __atomic_load_n(&s->sets, __ATOMIC_RELAXED);
  st->deletes = __atomic_load_n(&s->deletes, __ATOMIC_RELAXED);
  *result = st;
  (void)args;
  return 0;
}

int main(int argc, char **argv) {
  cxr_channel_opts o;
  cxr_channel_opts_init(&o);
  const char *name = KV_CHANNEL;
  o.conn_heap_size = 64u << 20;
  o.max_conns = 32;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--workers") && i + 1 < argc) o.workers = (unsigned)atoi(argv[++i]);
    else if (!strcmp(argv[i], "--channel") && i + 1 < argc) name = argv[++i];
    else if (!strcmp(argv[i], "--heap") && i + 1 < argc) o.conn_heap_size = (size_t)atoi(argv[++i]) << 20;
    else if (!strcmp(argv[i], "--listen") && i + 1 < argc) o.listen = argv[++i]; /* other racks */
    else {
      fprintf(stderr, "usage: kv_server [--workers N] [--channel NAME] [--heap MiB] [--listen ucx://ADDR:PORT]\n");
      return 2;
    }
  }
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, NULL); /* handler threads inherit it; main waits below */
  store *s = calloc(1, sizeof *s);
  if (s == NULL) return 1;
  for (unsigned i = 0; i < STRIPES; i++) pthread_rwlock_init(&s->locks[i], NULL);
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
  printf("kv_server ready on channel %s (%u worker%s, pid %d)\n", name, o.workers,
         o.workers == 1 ? "" : "s", (int)getpid());
  fflush(stdout);
  int sig;
  sigwait(&set, &sig);
  cxr_channel_close(ch);
  printf("kv_server: %llu items, %llu bytes; %llu gets (%llu hits), %llu sets, %llu deletes\n",
         (unsigned long long)s->items, (unsigned long long)s->bytes, (unsigned long long)s->gets,
         (unsigned long long)s->hits, (unsigned long long)s->sets, (unsigned long long)s->deletes);
  for (unsigned b = 0; b < BUCKETS; b++)
    for (item *it = s->buckets[b], *next; it; it = next) {
      next = it->next;
      free(it->value);
      free(it);
    }
  free(s);
  return 0;
}

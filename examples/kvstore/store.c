/* The kv store itself: a process-private hash table with striped read-write locks, shared
 * by the cxrpc server (server.c) and the Unix-socket baseline (unix.c). */
#include "examples/kvstore/store.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <cxrpc/base.h>

#define STRIPES 64u
#define BUCKETS (1u << 16)

typedef struct item item;

struct item {
  struct item *next;
  uint64_t hash;
  uint32_t key_len, value_len;
  char *value;
  char key[];
};

struct store {
  item *buckets[BUCKETS];
  pthread_rwlock_t locks[STRIPES];
  uint64_t items, bytes;                         /* under the stripe locks: atomics */
  uint64_t gets, hits, sets, deletes;            /* atomics */
};

static uint64_t hash_key(const char *k, uint32_t n) {
  uint64_t h = 1469598103934665603ull;
  for (uint32_t i = 0; i < n; i++) h = (h ^ (unsigned char)k[i]) * 1099511628211ull;
  return h;
}

/* Looks key up; on a hit copies the value into a block from alloc(ctx, size). */
int store_get(store *s, const char *key, uint32_t kl, void *(*alloc)(void *, size_t),
              void *ctx, void **out, uint32_t *len) {
  uint64_t h = hash_key(key, kl);
  *out = NULL;
  *len = 0;
  __atomic_fetch_add(&s->gets, 1, __ATOMIC_RELAXED);
  pthread_rwlock_t *l = &s->locks[h % STRIPES];
  pthread_rwlock_rdlock(l);
  for (item *it = s->buckets[h % BUCKETS]; it; it = it->next) {
    if (it->hash == h && it->key_len == kl && !memcmp(it->key, key, kl)) {
      void *v = alloc(ctx, it->value_len ? it->value_len : 1);
      if (v == NULL) {
        pthread_rwlock_unlock(l);
        return CXR_ENOMEM;
      }
      memcpy(v, it->value, it->value_len);
      *len = it->value_len;
      pthread_rwlock_unlock(l);
      __atomic_fetch_add(&s->hits, 1, __ATOMIC_RELAXED);
      *out = v;
      return 0;
    }
  }
  pthread_rwlock_unlock(l);
  return 0; /* a miss */
}

/* Stores a copy of key and value (value may be in shared memory: read once, here). */
int store_set(store *s, const char *key, uint32_t kl, const void *value, uint32_t vl) {
  item *n = malloc(sizeof *n + kl);
  char *val = malloc(vl ? vl : 1);
  if (n == NULL || val == NULL) {
    free(n);
    free(val);
    return CXR_ENOMEM;
  }
  memcpy(n->key, key, kl);
  if (vl) memcpy(val, value, vl);
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
  return 0;
}

int store_del(store *s, const char *key, uint32_t kl) {
  uint64_t h = hash_key(key, kl);
  __atomic_fetch_add(&s->deletes, 1, __ATOMIC_RELAXED);
  pthread_rwlock_t *l = &s->locks[h % STRIPES];
  pthread_rwlock_wrlock(l);
  for (item **pp = &s->buckets[h % BUCKETS]; *pp; pp = &(*pp)->next) {
    item *it = *pp;
    if (it->hash == h && it->key_len == kl && !memcmp(it->key, key, kl)) {
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
  return CXR_ENOENT;
}

store *store_new(void) {
  store *s = calloc(1, sizeof *s);
  if (s == NULL) return NULL;
  for (unsigned i = 0; i < STRIPES; i++) pthread_rwlock_init(&s->locks[i], NULL);
  return s;
}

void store_stats(store *s, kv_stats *st) {
  st->items = __atomic_load_n(&s->items, __ATOMIC_RELAXED);
  st->bytes = __atomic_load_n(&s->bytes, __ATOMIC_RELAXED);
  st->gets = __atomic_load_n(&s->gets, __ATOMIC_RELAXED);
  st->hits = __atomic_load_n(&s->hits, __ATOMIC_RELAXED);
  st->sets = __atomic_load_n(&s->sets, __ATOMIC_RELAXED);
  st->deletes = __atomic_load_n(&s->deletes, __ATOMIC_RELAXED);
}

void store_free(store *s) {
  if (s == NULL) return;
  for (unsigned b = 0; b < BUCKETS; b++)
    for (item *it = s->buckets[b], *next; it; it = next) {
      next = it->next;
      free(it->value);
      free(it);
    }
  free(s);
}

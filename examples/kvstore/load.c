/* kv_load: a YCSB-like load generator for kv_server, on the stubs generated from kv.proto. Each thread has its own connection and
 * runs a closed loop of calls; keys follow a Zipfian distribution (scrambled, as in YCSB).
 *   kv_load [--channel kv | ucx://HOST:PORT/kv] [--threads 2] [--seconds 3] [--workload a|b|c] [--keys N]
 *           [--value-size BYTES] [--zipf THETA] [--no-preload] [--unix PATH]
 *   workload a: 50% get, 50% set;  b: 95% get, 5% set;  c: 100% get
 * --unix PATH runs the same load over kv_server's Unix-socket baseline instead of cxrpc.
 * Prints calls/s, hit ratio, errors and latency percentiles. Calls, calls/s and latency count
 * successful calls only, over the time the threads really ran; failed calls are counted apart
 * as errors (a thread stops at CXR_EPEERDEAD: no later call on its connection can succeed).
 * Exit status 1 on errors. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cxrpc/rpc.h>

#include "examples/kvstore/kv.cxr.h"
#include "examples/kvstore/kv.h"
#include "examples/kvstore/unix.h"

typedef struct cfg {
  const char *channel;
  int threads;
  double seconds;
  char workload;
  uint64_t keys;
  uint32_t value_size;
  double theta;
  bool preload;
  const char *unix_path;
} cfg;

/* ---- Zipfian keys (Gray et al., as YCSB generates them) ---- */
typedef struct zipf {
  uint64_t n;
  double theta, alpha, zetan, eta;
} zipf;

static void zipf_init(zipf *z, uint64_t n, double theta) {
  double zetan = 0, zeta2 = 1 + pow(0.5, theta);
  for (uint64_t i = 1; i <= n; i++) zetan += 1.0 / pow((double)i, theta);
  z->n = n;
  z->theta = theta;
  z->alpha = 1.0 / (1.0 - theta);
  z->zetan = zetan;
  z->eta = (1 - pow(2.0 / (double)n, 1 - theta)) / (1 - zeta2 / zetan);
}

static uint64_t rng_next(uint64_t *s) { /* xorshift64* */
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 2685821657736338717ull;
}
static double rng_unit(uint64_t *s) { return (rng_next(s) >> 11) * (1.0 / 9007199254740992.0); }

static uint64_t zipf_next(const zipf *z, uint64_t *rng) {
  double u = rng_unit(rng), uz = u * z->zetan;
  uint64_t rank;
  if (uz < 1.0) rank = 0;
  else if (uz < 1.0 + pow(0.5, z->theta)) rank = 1;
  else rank = (uint64_t)((double)z->n * pow(z->eta * u - z->eta + 1, z->alpha));
  if (rank >= z->n) rank = z->n - 1;
  /* Scramble so that popular keys are spread over the key space. */
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < 8; i++) h = (h ^ ((rank >> (8 * i)) & 0xff)) * 1099511628211ull;
  return h % z->n;
}

/* ---- one thread ---- */
typedef struct worker {
  const cfg *c;
  const zipf *z;
  int id;
  uint64_t ops, gets, hits, sets, errors, bad_values; /* ops, gets, sets: successful calls */
  int first_error;
  int64_t t_begin, t_end; /* the timed loop, for calls/s (0: it did not run) */
  /* Latency of successful calls, ns: a reservoir of cap samples (Algorithm R), so that a
   * long run neither grows it without bound nor keeps only its first seconds. */
  uint32_t *lat, lat_max;
  size_t nlat, cap;
  uint64_t lat_seen, lat_rng;
  int setup_rc;
  bool synced;     /* passed the barrier after the preload */
} worker;

/* Every thread finishes its share of the preload before any starts the timed loop (else
 * early gets would miss keys another thread has not written yet). A count rather than a
 * pthread barrier: when a thread cannot be created, main takes its place without waiting. */
static pthread_mutex_t preload_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t preload_cv = PTHREAD_COND_INITIALIZER;
static int preload_left; /* threads that have not finished their preload */
static void preload_leave(int n, bool wait) {
  pthread_mutex_lock(&preload_mu);
  if ((preload_left -= n) <= 0) pthread_cond_broadcast(&preload_cv);
  while (wait && preload_left > 0) pthread_cond_wait(&preload_cv, &preload_mu);
  pthread_mutex_unlock(&preload_mu);
}
static void preload_done(worker *w) {
  if (!w->synced) preload_leave(1, true);
  w->synced = true;
}

static void failed(worker *w, int rc) {
  if (w->errors++ == 0) w->first_error = rc;
}

static void lat_add(worker *w, int64_t dt) {
  uint32_t ns = dt > UINT32_MAX ? UINT32_MAX : (uint32_t)dt;
  if (ns > w->lat_max) w->lat_max = ns;
  uint64_t n = ++w->lat_seen;
  if (w->nlat < w->cap) {
    w->lat[w->nlat++] = ns;
    return;
  }
  /* kept with probability cap/n, in place of a random sample: uniform over the run */
  uint64_t j = (uint64_t)(((unsigned __int128)rng_next(&w->lat_rng) * n) >> 64);
  if (j < w->cap) w->lat[j] = ns;
}

static int key_of(uint64_t k, char *buf) { return snprintf(buf, 32, "key:%010llu", (unsigned long long)k); }

/* One thread's requests, built once in the connection heap and reused for every call
 * (only the key bytes and lengths change): a call allocates nothing on the client. The
 * messages are from kv.proto; across racks the generated stubs ship exactly their bytes. */
typedef struct reqs {
  kv_GetRequest *get;
  kv_SetRequest *set;
  char *key;    /* KV_KEY_MAX bytes, shared by both requests' key fields */
  char *value;  /* value_size bytes */
} reqs;

/* SET key k to value_size bytes whose first 8 hold k (checked by GET). */
static int do_set(cxr_conn *conn, reqs *q, uint32_t vlen, uint64_t k) {
  q->set->key.len = (uint64_t)key_of(k, q->key);
  q->set->value.len = vlen;
  if (vlen >= 8) memcpy(q->value, &k, 8);
  kv_SetResponse *rs = NULL;
  int rc = kv_KV_Set(conn, q->set, &rs, NULL);
  if (rs) kv_SetResponse_release(conn, rs); /* the server returns none; a buggy one might */
  return rc;
}

static int do_get(cxr_conn *conn, reqs *q, uint64_t k, uint32_t vlen, bool *hit, bool *bad) {
  q->get->key.len = (uint64_t)key_of(k, q->key);
  kv_GetResponse *rs = NULL;
  int rc = kv_KV_Get(conn, q->get, &rs, NULL); /* rs validated by the stub */
  *hit = rs != NULL;
  *bad = false;
  if (rs != NULL) {
    uint64_t got = 0;
    if (rs->value.len >= 8) memcpy(&got, rs->value.ptr, 8);
    *bad = rs->value.len != vlen || (vlen >= 8 && got != k);
    kv_GetResponse_release(conn, rs); /* in the pod: freed; across racks: back to the server */
  }
  return rc;
}

static void reqs_free(cxr_heap *h, reqs *q) {
  cxr_heap_free(h, q->get);
  cxr_heap_free(h, q->set);
  cxr_heap_free(h, q->key);
  cxr_heap_free(h, q->value);
}

static int reqs_new(cxr_heap *h, reqs *q, uint32_t vsize) {
  *q = (reqs){kv_GetRequest_new(h), kv_SetRequest_new(h), cxr_heap_alloc(h, KV_KEY_MAX),
              cxr_heap_alloc(h, vsize ? vsize : 1)};
  if (!q->get || !q->set || !q->key || !q->value) {
    reqs_free(h, q);
    return CXR_ENOMEM;
  }
  memset(q->value, 'v', vsize);
  q->get->key.ptr = (const uint8_t *)q->key;
  q->set->key.ptr = (const uint8_t *)q->key;
  q->set->value.ptr = (const uint8_t *)q->value;
  return 0;
}

/* ---- the timed loop, the same for both transports ---- */
/* One thread's share of the preload, the barrier, then gets and sets in the workload's mix
 * until time is up, one latency sample per call. Each transport gives its own SET and GET
 * of key k on ctx. Always inlined into each transport's thread, so those calls stay direct
 * (the loop is what kv_load times). */
typedef int (*kv_set_fn)(void *ctx, uint64_t k);
typedef int (*kv_get_fn)(void *ctx, uint64_t k, bool *hit, bool *bad);

static inline __attribute__((always_inline)) void drive(worker *w, void *ctx, kv_set_fn set,
                                                        kv_get_fn get) {
  const cfg *c = w->c;
  int rc = 0;
  if (c->preload) /* each thread loads its share of the keys */
    for (uint64_t k = (uint64_t)w->id; k < c->keys && rc != CXR_EPEERDEAD;
         k += (uint64_t)c->threads)
      if ((rc = set(ctx, k)) != 0) failed(w, rc);
  preload_done(w);
  if (rc == CXR_EPEERDEAD) return;
  uint64_t rng = 0x9E3779B97F4A7C15ull * (uint64_t)(w->id + 1);
  int get_pct = c->workload == 'a' ? 50 : c->workload == 'b' ? 95 : 100;
  w->t_begin = cxr_now_ns();
  int64_t end = w->t_begin + (int64_t)(c->seconds * 1e9), t0;
  /* A failed call is no call served: it counts as an error only (against a dead server
   * each failed at once, and millions of "calls/s" were printed). */
  while ((t0 = cxr_now_ns()) < end) {
    uint64_t k = zipf_next(w->z, &rng);
    bool is_get = (int)(rng_next(&rng) % 100) < get_pct, hit = false, bad = false;
    rc = is_get ? get(ctx, k, &hit, &bad) : set(ctx, k);
    int64_t dt = cxr_now_ns() - t0;
    if (rc != 0) {
      failed(w, rc);
      if (rc == CXR_EPEERDEAD) break; /* the connection is gone for good */
      continue;
    }
    w->ops++;
    if (is_get) {
      w->gets++;
      w->hits += hit;
      w->bad_values += bad;
    } else {
      w->sets++;
    }
    lat_add(w, dt);
  }
  w->t_end = cxr_now_ns();
}

/* ---- the Unix-socket baseline: same operations, bytes copied through the kernel ---- */
static int io_full(int fd, void *buf, size_t n, bool wr) {
  for (size_t done = 0; done < n;) {
    ssize_t r = wr ? write(fd, (char *)buf + done, n - done) : read(fd, (char *)buf + done, n - done);
    if (r <= 0) return -1;
    done += (size_t)r;
  }
  return 0;
}

static int unix_op(int fd, uint32_t op, uint64_t k, char *value, uint32_t vlen, uint32_t want,
                   bool *hit, bool *bad) {
  char key[32];
  kv_wire_req rq = {op, (uint32_t)key_of(k, key), op == KV_SET ? vlen : 0};
  if (op == KV_SET && vlen >= 8) memcpy(value, &k, 8);
  struct iovec_like { const void *p; size_t n; } parts[3] = {
      {&rq, sizeof rq}, {key, rq.key_len}, {value, rq.value_len}};
  for (int i = 0; i < 3; i++)
    if (parts[i].n && io_full(fd, (void *)parts[i].p, parts[i].n, true) != 0) return CXR_EPEERDEAD;
  kv_wire_resp rs;
  if (io_full(fd, &rs, sizeof rs, false) != 0 || rs.value_len > KV_VALUE_MAX) return CXR_EPEERDEAD;
  if (rs.value_len && io_full(fd, value, rs.value_len, false) != 0) return CXR_EPEERDEAD;
  if (hit) *hit = rs.found != 0;
  if (bad) {
    uint64_t got = 0;
    if (rs.value_len >= 8) memcpy(&got, value, 8);
    *bad = rs.found && (rs.value_len != want || (want >= 8 && got != k));
  }
  return rs.status;
}

typedef struct unix_ctx {
  int fd;
  char *value; /* KV_VALUE_MAX bytes: sent on SET, received into on GET */
  uint32_t value_size;
} unix_ctx;

static int unix_set(void *ctx, uint64_t k) {
  unix_ctx *u = ctx;
  return unix_op(u->fd, KV_SET, k, u->value, u->value_size, 0, NULL, NULL);
}

static int unix_get(void *ctx, uint64_t k, bool *hit, bool *bad) {
  unix_ctx *u = ctx;
  return unix_op(u->fd, KV_GET, k, u->value, 0, u->value_size, hit, bad);
}

static void *run_unix(worker *w) {
  const cfg *c = w->c;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", c->unix_path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  char *value = malloc(KV_VALUE_MAX);
  if (fd < 0 || value == NULL || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    w->setup_rc = CXR_ENOTCONN;
    if (fd >= 0) close(fd);
    free(value);
    return NULL;
  }
  memset(value, 'v', c->value_size);
  unix_ctx u = {fd, value, c->value_size};
  drive(w, &u, unix_set, unix_get);
  close(fd);
  free(value);
  return NULL;
}

/* ---- cxrpc: the generated stubs on one connection, requests reused ---- */
typedef struct cxrpc_ctx {
  cxr_conn *conn;
  reqs q;
  uint32_t value_size;
} cxrpc_ctx;

static int cxrpc_set(void *ctx, uint64_t k) {
  cxrpc_ctx *x = ctx;
  return do_set(x->conn, &x->q, x->value_size, k);
}

static int cxrpc_get(void *ctx, uint64_t k, bool *hit, bool *bad) {
  cxrpc_ctx *x = ctx;
  return do_get(x->conn, &x->q, k, x->value_size, hit, bad);
}

static void *run_cxrpc(worker *w) {
  const cfg *c = w->c;
  cxrpc_ctx x = {.value_size = c->value_size};
  if ((w->setup_rc = cxr_connect(&x.conn, c->channel, NULL)) != 0) return NULL;
  if ((w->setup_rc = reqs_new(cxr_conn_heap(x.conn), &x.q, c->value_size)) != 0) {
    cxr_conn_close(x.conn);
    return NULL;
  }
  drive(w, &x, cxrpc_set, cxrpc_get);
  reqs_free(cxr_conn_heap(x.conn), &x.q);
  cxr_conn_close(x.conn);
  return NULL;
}

static void *run(void *arg) {
  worker *w = arg;
  if (w->c->unix_path != NULL) run_unix(w);
  else run_cxrpc(w);
  preload_done(w); /* a thread that failed to set up must not hold the others back */
  return NULL;
}

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

static int usage(void) {
  fprintf(stderr,
          "usage: kv_load [--channel NAME] [--threads N] [--seconds S] [--workload a|b|c]\n"
          "               [--keys N] [--value-size BYTES] [--zipf THETA] [--no-preload]\n"
          "               [--unix PATH]\n");
  return 2;
}

int main(int argc, char **argv) {
  cfg c = {KV_CHANNEL, 2, 3.0, 'b', 0, 100, 0.99, true, NULL};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--no-preload")) { c.preload = false; continue; }
    if (v == NULL) return usage();
    if (!strcmp(a, "--channel")) c.channel = v;
    else if (!strcmp(a, "--threads")) c.threads = atoi(v);
    else if (!strcmp(a, "--seconds")) c.seconds = atof(v);
    else if (!strcmp(a, "--workload")) c.workload = v[0];
    else if (!strcmp(a, "--keys")) c.keys = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--value-size")) c.value_size = (uint32_t)strtoul(v, NULL, 10);
    else if (!strcmp(a, "--zipf")) c.theta = atof(v);
    else if (!strcmp(a, "--unix")) c.unix_path = v;
    else return usage();
    i++;
  }
  if (c.threads < 1 || c.threads > 64 || c.seconds <= 0 || c.value_size > KV_VALUE_MAX ||
      (c.workload != 'a' && c.workload != 'b' && c.workload != 'c') || c.theta <= 0 || c.theta >= 1)
    return usage();
  if (c.keys == 0) { /* keep the store under ~256 MiB */
    c.keys = (256ull << 20) / (c.value_size + 64);
    if (c.keys > 100000) c.keys = 100000;
    if (c.keys < 16) c.keys = 16;
  }
  zipf z;
  zipf_init(&z, c.keys, c.theta);
  worker *w = calloc((size_t)c.threads, sizeof *w);
  pthread_t *t = calloc((size_t)c.threads, sizeof *t);
  /* Latency samples: 64 MiB for all threads at most (one per call took 256 MiB a thread),
   * and no more than a run can fill at ~2 M calls/s. Each thread's reservoir weighs the
   * same in the percentiles: the threads run the same loop. */
  size_t cap = (16u << 20) / (size_t)c.threads;
  if ((double)cap > c.seconds * 2e6 + 1024) cap = (size_t)(c.seconds * 2e6) + 1024;
  if (w == NULL || t == NULL) {
    fprintf(stderr, "kv_load: out of memory\n");
    return 1;
  }
  for (int i = 0; i < c.threads; i++) {
    w[i] = (worker){.c = &c, .z = &z, .id = i, .cap = cap,
                    .lat_rng = 0x2545F4914F6CDD1Dull * (uint64_t)(i + 1)};
    if ((w[i].lat = malloc(cap * sizeof *w[i].lat)) == NULL) {
      fprintf(stderr, "kv_load: out of memory for %zu latency samples\n", cap);
      return 1;
    }
  }
  preload_left = c.threads;
  int started = 0;
  for (; started < c.threads; started++) {
    int rc = pthread_create(&t[started], NULL, run, &w[started]);
    if (rc != 0) {
      fprintf(stderr, "kv_load: thread %d: pthread_create: %s\n", started, strerror(rc));
      preload_leave(c.threads - started, false); /* the others must not wait for them */
      break;
    }
  }
  uint64_t ops = 0, gets = 0, hits = 0, sets = 0, errors = started < c.threads, bad = 0;
  size_t nlat = 0;
  int64_t t_begin = 0, t_end = 0;
  for (int i = 0; i < started; i++) {
    pthread_join(t[i], NULL);
    if (w[i].setup_rc != 0) {
      fprintf(stderr, "kv_load: thread %d: %s\n", i, cxr_strerror(w[i].setup_rc));
      errors++;
    }
    if (w[i].errors)
      fprintf(stderr, "kv_load: thread %d: %llu failed calls, the first: %s\n", i,
              (unsigned long long)w[i].errors, cxr_strerror(w[i].first_error));
    ops += w[i].ops, gets += w[i].gets, hits += w[i].hits, sets += w[i].sets;
    errors += w[i].errors, bad += w[i].bad_values, nlat += w[i].nlat;
    if (w[i].t_begin && (t_begin == 0 || w[i].t_begin < t_begin)) t_begin = w[i].t_begin;
    if (w[i].t_end > t_end) t_end = w[i].t_end;
  }
  /* calls/s over the time the loops really ran, not the --seconds asked for */
  double secs = t_begin && t_end > t_begin ? (double)(t_end - t_begin) / 1e9 : 0;
  uint32_t *all = malloc((nlat ? nlat : 1) * sizeof *all), lat_max = 0;
  if (all == NULL) nlat = 0;
  size_t k = 0;
  for (int i = 0; i < c.threads; i++) {
    if (all) memcpy(all + k, w[i].lat, w[i].nlat * sizeof *all);
    k += w[i].nlat;
    if (w[i].lat_max > lat_max) lat_max = w[i].lat_max;
    free(w[i].lat);
  }
  if (nlat) qsort(all, nlat, sizeof *all, cmp_u32);
  const char *mix = c.workload == 'a' ? "50% get / 50% set" : c.workload == 'b' ? "95% get / 5% set" : "100% get";
  printf("kv_load%s: workload %c (%s), %d thread%s, %llu keys (zipf %.2f), values %u B, %.1f s\n",
         c.unix_path ? " over a Unix socket (baseline)" : " over cxrpc", c.workload - 32, mix, c.threads, c.threads == 1 ? "" : "s", (unsigned long long)c.keys,
         c.theta, c.value_size, c.seconds);
  double bytes = ((double)hits + (double)sets) * c.value_size; /* values moved: hits, sets */
  printf("  %llu calls  %.0f calls/s in %.2f s  (%.1f MB/s of values)  hits %.1f%%  errors %llu"
         "  bad values %llu\n",
         (unsigned long long)ops, secs > 0 ? ops / secs : 0.0, secs,
         secs > 0 ? bytes / secs / 1e6 : 0.0, gets ? 100.0 * hits / gets : 0.0,
         (unsigned long long)errors, (unsigned long long)bad);
  if (errors)
    printf("  (calls, calls/s and latency: successful calls only; %llu failed)\n",
           (unsigned long long)errors);
  if (nlat) {
#define P(q) (all[(size_t)((double)(nlat - 1) * (q))] / 1000.0)
    printf("  latency us: p50 %.2f  p90 %.2f  p99 %.2f  p99.9 %.2f  max %.1f%s\n", P(0.5),
           P(0.9), P(0.99), P(0.999), lat_max / 1000.0,
           nlat < ops ? " (percentiles of a uniform sample)" : "");
  }
  free(all);
  free(w);
  free(t);
  return errors || bad ? 1 : 0;
}

/*
 * Allocator benchmark: median and p99 ns per alloc+free pair at 64 B, 1 KiB and 64 KiB,
 * for cxr_heap_alloc/free (one shared heap) beside glibc malloc/free, measured in the same
 * run, with one thread, two threads (one process) and two processes (both on one heap for
 * cxrpc; each with its own malloc arena, the best case for glibc).
 *
 * A sample is one round: allocate BATCH blocks (touching each), then free them; the sample
 * is the round's time divided by BATCH. Run: bazel run -c opt //bench:alloc_bench
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cxrpc/shm.h>

#define BATCH 32
#define ROUNDS 3000
#define WARMUP 200

typedef struct ctx {
  cxr_heap *heap; /* NULL: glibc malloc */
  size_t size;
  double *samples; /* ROUNDS per worker */
} ctx;

static inline uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *worker(void *arg) {
  ctx *c = arg;
  void *p[BATCH];
  for (int r = -WARMUP; r < ROUNDS; r++) {
    uint64_t t0 = now_ns();
    for (int i = 0; i < BATCH; i++) {
      p[i] = c->heap ? cxr_heap_alloc(c->heap, c->size) : malloc(c->size);
      if (!p[i]) {
        fprintf(stderr, "alloc failed: %s\n", cxr_strerror(cxr_last_error()));
        exit(1);
      }
      *(volatile char *)p[i] = (char)i;
    }
    for (int i = 0; i < BATCH; i++) {
      if (c->heap) cxr_heap_free(c->heap, p[i]);
      else free(p[i]);
    }
    uint64_t t1 = now_ns();
    if (r >= 0) c->samples[r] = (double)(t1 - t0) / BATCH;
  }
  return NULL;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

typedef struct result {
  double median, p99;
} result;

static result summarize(double *s, size_t n) {
  qsort(s, n, sizeof *s, cmp);
  result r = {s[n / 2], s[(size_t)((double)n * 0.99)]};
  return r;
}

/* mode: 0 one thread, 1 two threads, 2 two processes. */
static result run(const char *heap_name, cxr_heap *parent_heap, size_t size, int mode) {
  int workers = mode == 0 ? 1 : 2;
  size_t n = (size_t)workers * ROUNDS;
  /* Shared so that forked workers can hand their samples back. */
  double *s = mmap(NULL, n * sizeof(double), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (s == MAP_FAILED) exit(1);
  if (mode < 2) {
    pthread_t t[2];
    ctx c[2];
    for (int i = 0; i < workers; i++) {
      c[i] = (ctx){parent_heap, size, s + (size_t)i * ROUNDS};
      pthread_create(&t[i], NULL, worker, &c[i]);
    }
    for (int i = 0; i < workers; i++) pthread_join(t[i], NULL);
  } else {
    pid_t pid[2];
    int go[2];
    if (pipe(go) != 0) exit(1);
    for (int i = 0; i < 2; i++) {
      pid[i] = fork();
      if (pid[i] == 0) {
        close(go[1]);
        cxr_heap *h = NULL;
        if (heap_name && cxr_heap_open(&h, heap_name) != 0) _exit(2);
        char b;
        if (read(go[0], &b, 1) < 0) _exit(3); /* start together */
        ctx c = {h, size, s + (size_t)i * ROUNDS};
        worker(&c);
        if (h) cxr_heap_close(h);
        _exit(0);
      }
    }
    close(go[0]);
    close(go[1]);
    for (int i = 0; i < 2; i++) {
      int st;
      waitpid(pid[i], &st, 0);
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "worker process failed (%d)\n", st);
        exit(1);
      }
    }
  }
  result r = summarize(s, n);
  munmap(s, n * sizeof(double));
  return r;
}

int main(void) {
  char tmp[] = "/dev/shm/cxrpc-alloc-bench.XXXXXX";
  if (getenv("CXRPC_ROOT") == NULL) {
    if (mkdtemp(tmp) == NULL) {
      perror("mkdtemp");
      return 1;
    }
    setenv("CXRPC_ROOT", tmp, 1);
  }
  char name[64];
  snprintf(name, sizeof name, "alloc-bench-%d", (int)getpid());
  cxr_heap *h;
  cxr_heap_opts o;
  cxr_heap_opts_init(&o);
  o.remove_on_last_close = true;
  int rc = cxr_heap_create(&h, name, 64 << 20, &o);
  if (rc) {
    fprintf(stderr, "create heap: %s\n", cxr_strerror(rc));
    return 1;
  }
  static const size_t sizes[] = {64, 1024, 65536};
  static const char *modes[] = {"1 thread", "2 threads", "2 processes"};
  printf("alloc+free pair, ns (median / p99 of %d rounds of %d per worker)\n", ROUNDS, BATCH);
  printf("%-8s %-12s %10s %10s %10s %10s %8s\n", "size", "mode", "cxr med", "cxr p99", "malloc med",
         "malloc p99", "cxr/mal");
  for (size_t si = 0; si < 3; si++) {
    for (int m = 0; m < 3; m++) {
      result c = run(name, h, sizes[si], m);
      result g = run(NULL, NULL, sizes[si], m);
      char sz[32];
      if (sizes[si] >= 1024) snprintf(sz, sizeof sz, "%zu KiB", sizes[si] / 1024);
      else snprintf(sz, sizeof sz, "%zu B", sizes[si]);
      printf("%-8s %-12s %10.1f %10.1f %10.1f %10.1f %8.2f\n", sz, modes[m], c.median, c.p99,
             g.median, g.p99, c.median / g.median);
      fflush(stdout);
    }
  }
  cxr_heap_stats st;
  cxr_heap_stats(h, &st);
  printf("heap after the run: %zu bytes used, %zu cached in this thread's caches, %lu allocs\n",
         st.used, st.cached, (unsigned long)st.allocs);
  cxr_heap_close(h);
  if (!strcmp(getenv("CXRPC_ROOT"), tmp)) rmdir(tmp);
  return 0;
}

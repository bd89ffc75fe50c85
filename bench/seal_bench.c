/*
 * seal_bench: the cost of seals, releases, supervision and the sandbox, in one run.
 *
 *   floors        a bare syscall; mprotect read-only then read-write of one page inside a
 *                 larger mapping (what a seal and an unbatched release cost at least)
 *   seal+release  seal (sender) + check with kernel verification + done (receiver) +
 *                 release (sender), both handles in one process; release thresholds 1, 64,
 *                 1024 (median, p99 and mean: the mean carries the amortized sweep)
 *   sandbox       cxr_sandbox_run of an empty function (enter + exit), cxr_range_check
 *   supervised    a process under `cxrpcd run`: one raise of permissions in the window that
 *                 the supervisor answers (the cost of one decision), and seal+release under
 *                 enforcement with thresholds 1 and 1024
 *   round trips   a no-op call between two processes through rpc: relaxed, sealed (release
 *                 thresholds 1, 64, 1024), sandboxed (untrusted channel), sealed+sandboxed
 *
 * Usage: seal_bench [iterations, default 20000]. cxrpcd is found next to this binary in
 * Bazel's runfiles, or through $CXRPCD.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cxrpc/rpc.h>
#include <cxrpc/seal.h>
#include <cxrpc/sandbox.h>

#define PAGE 4096u
#define POOL_PAGES 2048u

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

typedef struct stats {
  double med, p99, mean; /* ns; mean = amortized: median op + median sweep / batch */
} stats;

static stats summarize(int64_t *v, int n) {
  double sum = 0;
  for (int i = 0; i < n; i++) sum += (double)v[i];
  qsort(v, (size_t)n, sizeof *v, cmp_i64);
  stats s = {(double)v[n / 2], (double)v[(int)(n * 0.99)], sum / n};
  return s;
}

static void row(const char *name, stats s, double floor) {
  printf("| %-46s | %9.0f | %9.0f | %9.0f | %6.2fx |\n", name, s.med, s.p99, s.mean,
         floor > 0 ? s.med / floor : 0.0);
}

/* Where the benchmark maps its pages: near the end of the address window. */
static uintptr_t bench_addr(unsigned k) {
  uintptr_t lo = 0x600000000000ull, hi = 0x700000000000ull;
  const char *w = getenv("CXRPC_WINDOW");
  if (w) {
    char *e;
    unsigned long long a = strtoull(w, &e, 0);
    if (*e == '-') lo = a, hi = strtoull(e + 1, NULL, 0);
  }
  (void)lo;
  return hi - (uintptr_t)(k + 1) * 0x100000000ull;
}

static unsigned char *map_pool(unsigned k, int *fd_out) {
  int fd = memfd_create("seal-bench-pool", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, (off_t)POOL_PAGES * PAGE) != 0) return NULL;
  void *p = mmap((void *)bench_addr(k), (size_t)POOL_PAGES * PAGE, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0);
  if (p == MAP_FAILED) return NULL;
  memset(p, 1, (size_t)POOL_PAGES * PAGE);
  *fd_out = fd;
  return p;
}

/* seal + check + done + release on page i of the pool, n times; per-iteration ns in lat. */
static int seal_cycle(unsigned char *pool, cxr_seal_table *snd, cxr_seal_table *rcv, int n,
                      unsigned batch, int64_t *lat, int64_t *sweep, int *nsweep) {
  *nsweep = 0;
  int k = 0;
  for (int i = 0; i < n; i++) {
    unsigned char *p = pool + (size_t)(i % POOL_PAGES) * PAGE;
    int64_t t0 = cxr_now_ns();
    cxr_seal_id id;
    int rc = cxr_seal_table_seal(snd, p, PAGE, &id);
    if (!rc) rc = cxr_seal_table_check(rcv, id, p, 64);
    if (!rc) rc = cxr_seal_table_done(rcv, id);
    if (!rc) rc = cxr_seal_table_release(snd, id);
    int64_t d = cxr_now_ns() - t0;
    if (batch > 1 && (i + 1) % (int)batch == 0) sweep[(*nsweep)++] = d; /* this one swept */
    else lat[k++] = d;
    if (rc) {
      fprintf(stderr, "seal cycle %d: %s\n", i, cxr_strerror(rc));
      return rc;
    }
  }
  return cxr_seal_table_flush(snd);
}

/* One seal table pair over a fresh pool; enforce: register with the supervisor at sock. */
static int seal_run(unsigned k, unsigned batch, int n, const char *sock, stats *out) {
  int fd;
  unsigned char *pool = map_pool(k, &fd);
  if (!pool) return CXR_ENOMEM;
  cxr_seal_opts o;
  cxr_seal_opts_init(&o);
  o.release_batch = batch;
  o.slots = 2048;
  cxr_seal_table *rcv = NULL, *snd = NULL;
  /* Both mappings inside the window: a supervised process may map shared files only there. */
  o.addr = bench_addr(k) + (size_t)POOL_PAGES * PAGE + 0x100000;
  int rc = cxr_seal_table_create(&rcv, &o);
  o.addr += 0x100000;
  if (!rc) rc = cxr_seal_table_attach(&snd, cxr_seal_table_fd(rcv), &o);
  if (!rc) rc = cxr_seal_table_set_peer(rcv, getpid(), pool, (size_t)POOL_PAGES * PAGE);
  if (!rc && sock) rc = cxr_seal_table_enforce(rcv, sock);
  int64_t *lat = malloc(sizeof(int64_t) * (size_t)n), *sw = malloc(sizeof(int64_t) * (size_t)n);
  int nsw = 0;
  if (!rc) rc = seal_cycle(pool, snd, rcv, n / 10 + 1, batch, lat, sw, &nsw); /* warm up */
  if (!rc) rc = seal_cycle(pool, snd, rcv, n, batch, lat, sw, &nsw);
  if (!rc) {
    *out = summarize(lat, n - nsw);
    out->mean = out->med;
    if (nsw > 0) out->mean += summarize(sw, nsw).med / batch; /* the sweep, amortized */
  }
  free(lat);
  free(sw);
  cxr_seal_table_close(snd);
  cxr_seal_table_close(rcv);
  munmap(pool, (size_t)POOL_PAGES * PAGE);
  close(fd);
  return rc;
}

static int noop(void *arg) {
  (void)arg;
  return 0;
}

static double per_op(int (*body)(int), int n) {
  int64_t best = INT64_MAX;
  for (int r = 0; r < 5; r++) {
    int64_t t0 = cxr_now_ns();
    body(n);
    int64_t d = cxr_now_ns() - t0;
    if (d < best) best = d;
  }
  return (double)best / n;
}
static int run_sandbox(int n) {
  int s = 0;
  for (int i = 0; i < n; i++) s += cxr_sandbox_run(noop, NULL);
  return s;
}
static char range_buf[4096];
static int run_range(int n) {
  cxr_range r = {range_buf, sizeof range_buf};
  int s = 0;
  for (int i = 0; i < n; i++) s += cxr_range_check(&r, range_buf + (i & 1023), 8, 8);
  return s;
}
static int run_syscall(int n) {
  for (int i = 0; i < n; i++) syscall(SYS_getppid);
  return 0;
}

/* mprotect read-only then read-write of one page inside a larger mapping; the raise is
 * timed on its own too (it is what the supervisor sees). */
static void mprotect_pair(unsigned k, int n, stats *pair, stats *raise) {
  int fd;
  unsigned char *pool = map_pool(k, &fd);
  int64_t *a = malloc(sizeof(int64_t) * (size_t)n), *b = malloc(sizeof(int64_t) * (size_t)n);
  for (int i = 0; i < n; i++) {
    unsigned char *p = pool + (size_t)(i % POOL_PAGES) * PAGE;
    int64_t t0 = cxr_now_ns();
    mprotect(p, PAGE, PROT_READ);
    int64_t t1 = cxr_now_ns();
    mprotect(p, PAGE, PROT_READ | PROT_WRITE);
    int64_t t2 = cxr_now_ns();
    a[i] = t2 - t0;
    b[i] = t2 - t1;
  }
  *pair = summarize(a, n);
  *raise = summarize(b, n);
  pair->mean = pair->med, raise->mean = raise->med; /* nothing to amortize */
  free(a), free(b);
  munmap(pool, (size_t)POOL_PAGES * PAGE);
  close(fd);
}

/* ---- the supervised part runs in a child under `cxrpcd run` ---- */

static int supervised_child(const char *sock, int out_fd, int n) {
  stats raise_s, pair, s1, s1024;
  mprotect_pair(10, n / 10, &pair, &raise_s);
  int rc1 = seal_run(11, 1, n / 10, sock, &s1);
  int rc2 = seal_run(12, 1024, n, sock, &s1024);
  dprintf(out_fd, "%f %f %f %f %f %f %f %f %f %d %d\n", raise_s.med, raise_s.p99, raise_s.mean,
          s1.med, s1.p99, s1.mean, s1024.med, s1024.p99, s1024.mean, rc1, rc2);
  return 0;
}

static const char *cxrpcd_path(const char *self) {
  static char buf[4096];
  const char *e = getenv("CXRPCD");
  if (e && access(e, X_OK) == 0) return e;
  const char *rf = getenv("RUNFILES_DIR");
  if (rf) {
    snprintf(buf, sizeof buf, "%s/cxrpc/tools/cxrpcd/cxrpcd", rf);
    if (access(buf, X_OK) == 0) return buf;
  }
  snprintf(buf, sizeof buf, "%s.runfiles/cxrpc/tools/cxrpcd/cxrpcd", self);
  if (access(buf, X_OK) == 0) return buf;
  if (access("tools/cxrpcd/cxrpcd", X_OK) == 0) return "tools/cxrpcd/cxrpcd";
  return NULL;
}

static int supervised(const char *self, int n, double floor) {
  const char *cx = cxrpcd_path(self);
  if (!cx) {
    printf("(supervised rows skipped: cxrpcd not found; set $CXRPCD)\n");
    return -1;
  }
  char sock[64];
  snprintf(sock, sizeof sock, "/tmp/cxrpcd-bench-%d.sock", getpid());
  pid_t sup = fork();
  if (sup == 0) {
    execl(cx, "cxrpcd", "serve", "--socket", sock, (char *)NULL);
    _exit(127);
  }
  for (int i = 0; i < 500 && access(sock, F_OK) != 0; i++) usleep(10000);
  int pfd[2];
  if (pipe(pfd) != 0) return -1;
  char nbuf[16], fbuf[16];
  snprintf(nbuf, sizeof nbuf, "%d", n);
  snprintf(fbuf, sizeof fbuf, "%d", pfd[1]);
  pid_t c = fork();
  if (c == 0) {
    close(pfd[0]);
    char exe[4096];
    ssize_t l = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[l > 0 ? l : 0] = 0;
    execl(cx, "cxrpcd", "run", "--socket", sock, "--", exe, "--supervised-child", sock, fbuf,
          nbuf, (char *)NULL);
    _exit(127);
  }
  close(pfd[1]);
  char line[512] = {0};
  FILE *f = fdopen(pfd[0], "r");
  int ok = f && fgets(line, sizeof line, f) != NULL;
  if (f) fclose(f);
  int st;
  waitpid(c, &st, 0);
  kill(sup, SIGTERM);
  waitpid(sup, &st, 0);
  stats r, s1, s1024;
  int rc1 = -1, rc2 = -1;
  if (!ok || sscanf(line, "%lf %lf %lf %lf %lf %lf %lf %lf %lf %d %d", &r.med, &r.p99, &r.mean,
                    &s1.med, &s1.p99, &s1.mean, &s1024.med, &s1024.p99, &s1024.mean, &rc1,
                    &rc2) != 11) {
    printf("(supervised rows failed: %s)\n", line);
    return -1;
  }
  r.mean = r.med;
  row("supervised decision (one raise via cxrpcd)", r, floor);
  if (rc1 == 0) row("seal+check+done+release, enforced, batch 1", s1, floor);
  if (rc2 == 0) row("seal+check+done+release, enforced, batch 1024", s1024, floor);
  return 0;
}


/* ---- round trips through rpc ---- */

#define M_NOOP 1
static int h_noop(cxr_call *call, const void *args, void **result, void *user) {
  (void)call, (void)args, (void)user;
  *result = NULL;
  return 0;
}

/* The server: a forked process serving a trusted and an untrusted channel until the
 * parent closes the pipe. */
static pid_t start_server(const char *name, const char *uname, int *keep) {
  int p[2];
  if (pipe(p) != 0) return -1;
  pid_t pid = fork();
  if (pid != 0) {
    close(p[0]);
    *keep = p[1];
    return pid;
  }
  close(p[1]);
  cxr_channel_opts o;
  cxr_channel_opts_init(&o);
  cxr_channel *a = NULL, *b = NULL;
  if (cxr_channel_open(&a, name, &o) || cxr_channel_on(a, M_NOOP, h_noop, NULL) ||
      cxr_channel_start(a))
    _exit(1);
  o.untrusted = true;
  if (cxr_channel_open(&b, uname, &o) || cxr_channel_on(b, M_NOOP, h_noop, NULL) ||
      cxr_channel_start(b))
    _exit(1);
  char c;
  while (read(p[0], &c, 1) > 0) {
  }
  cxr_channel_close(a);
  cxr_channel_close(b);
  _exit(0);
}

static int connect_retry(cxr_conn **c, const char *name) {
  int rc = CXR_ENOENT;
  for (int i = 0; i < 500 && (rc = cxr_connect(c, name, NULL)) == CXR_ENOENT; i++) usleep(10000);
  return rc;
}

/* n no-op calls whose argument is one page of a 2048-page pool, sealed or not. */
static int round_trips(const char *name, const char *batch, unsigned flags, int n, stats *out) {
  setenv("CXRPC_SEAL_BATCH", batch, 1);
  cxr_conn *c = NULL;
  int rc = connect_retry(&c, name);
  if (rc) return rc;
  enum { POOL = 2048 };
  void **pool = calloc(POOL, sizeof *pool);
  for (int i = 0; i < POOL && !rc; i++)
    if (!(pool[i] = cxr_heap_alloc_pages(cxr_conn_heap(c), PAGE))) rc = CXR_ENOMEM;
  int64_t *lat = malloc(sizeof(int64_t) * (size_t)n);
  cxr_call_opts o;
  cxr_call_opts_init(&o);
  o.flags = flags;
  o.arg_len = 64;
  int warm = n / 10 + 100;
  for (int i = 0; i < warm + n && !rc; i++) {
    void *r = NULL;
    int64_t t0 = cxr_now_ns();
    rc = cxr_conn_call(c, M_NOOP, pool[i % POOL], &r, &o);
    if (i >= warm) lat[i - warm] = cxr_now_ns() - t0;
  }
  if (!rc) {
    *out = summarize(lat, n);
    out->mean = out->med;
  } else {
    fprintf(stderr, "round trips on %s: %s\n", name, cxr_strerror(rc));
  }
  cxr_conn_seal_flush(c);
  for (int i = 0; i < POOL; i++)
    if (pool[i]) cxr_heap_free(cxr_conn_heap(c), pool[i]);
  free(pool);
  free(lat);
  cxr_conn_close(c);
  return rc;
}

static void rpc_rows(int n) {
  char root[96], name[40], uname[40];
  snprintf(root, sizeof root, "/dev/shm/cxrpc-sealbench-%d", getpid());
  mkdir(root, 0700);
  setenv("CXRPC_ROOT", root, 1);
  snprintf(name, sizeof name, "sb%d", getpid() % 100000);
  snprintf(uname, sizeof uname, "sbu%d", getpid() % 100000);
  int keep = -1;
  pid_t srv = start_server(name, uname, &keep);
  if (srv < 0) return;
  stats relaxed = {0, 0, 0}, s;
  if (round_trips(name, "1024", 0, n, &relaxed) == 0) row("round trip: no-op, relaxed", relaxed, relaxed.med);
  const char *batches[] = {"1", "64", "1024"};
  for (int i = 0; i < 3; i++) {
    char label[64];
    snprintf(label, sizeof label, "round trip: sealed, batch %s", batches[i]);
    if (round_trips(name, batches[i], CXR_CALL_SEAL, n, &s) == 0) row(label, s, relaxed.med);
  }
  if (round_trips(uname, "1024", 0, n, &s) == 0) row("round trip: sandboxed (untrusted channel)", s, relaxed.med);
  if (round_trips(uname, "1024", CXR_CALL_SEAL, n, &s) == 0)
    row("round trip: sealed+sandboxed, batch 1024", s, relaxed.med);
  close(keep);
  int st;
  waitpid(srv, &st, 0);
  char cmd[160];
  snprintf(cmd, sizeof cmd, "rm -rf %s", root);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
}

int main(int argc, char **argv) {
  if (argc == 5 && !strcmp(argv[1], "--supervised-child"))
    return supervised_child(argv[2], atoi(argv[3]), atoi(argv[4]));
  int n = argc > 1 ? atoi(argv[1]) : 20000;
  if (n < 100) n = 100;
  printf("seal_bench: %d iterations per row, ns. median/p99 of single operations (for batched\n"
         "release, of those that did not sweep); amortized = median + median sweep / batch;\n"
         "ratio = median over the mprotect RO+RW floor of the same run\n\n", n);
  printf("| %-46s | %9s | %9s | %9s | %7s |\n|---|---|---|---|---|\n", "operation", "median",
         "p99", "amortized", "ratio");
  stats pair, raise_s;
  mprotect_pair(0, n, &pair, &raise_s);
  double floor = pair.med;
  double sc = per_op(run_syscall, 100000);
  printf("| %-46s | %9.0f | %9s | %9s | %7s |\n", "bare syscall (getppid)", sc, "", "", "");
  row("floor: mprotect RO + RW, 1 page of 2048", pair, floor);
  row("  of which the raise (RW)", raise_s, floor);
  unsigned batches[] = {1, 64, 1024};
  for (int i = 0; i < 3; i++) {
    stats s;
    char name[64];
    snprintf(name, sizeof name, "seal+check+done+release, batch %u", batches[i]);
    if (seal_run(1 + (unsigned)i, batches[i], n, NULL, &s) == 0) row(name, s, floor);
  }
  printf("| %-46s | %9.1f | %9s | %9s | %7s |\n", "sandbox enter+exit (cxr_sandbox_run)",
         per_op(run_sandbox, 1000000), "", "", "");
  printf("| %-46s | %9.1f | %9s | %9s | %7s |\n", "cxr_range_check", per_op(run_range, 1000000),
         "", "", "");
  supervised(argv[0], n, floor);
  printf("\n| %-46s | %9s | %9s | %9s | %7s |\n|---|---|---|---|---|\n", "rpc (2 processes)",
         "median", "p99", "", "vs relaxed");
  rpc_rows(n);
  printf("\nmachine: %ld CPUs; pkeys %s\n", sysconf(_SC_NPROCESSORS_ONLN),
         cxr_domain_supported() ? "available" : "not available (sandbox without domains)");
  return 0;
}

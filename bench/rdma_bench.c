/* rdma: throughput of cxr_rdma_get and cxr_rdma_put of 64 KiB, 1 MiB and 16 MiB between two
 * processes over UCX on TCP (loopback), median and worst of the rounds, in MiB/s; beside a
 * plain memcpy of the same size in this process (the copy every bounced chunk adds).
 * Run: bazel run -c opt //bench:rdma_bench. The child exports 16 MiB and serves until its
 * stdin closes. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cxrpc/rdma.h>

enum { EXPORT = 16 << 20 };

static int serve(int rfd, int wfd) {
  cxr_rdma_opts o;
  cxr_rdma_opts_init(&o);
  o.listen = "127.0.0.1:0";
  cxr_rdma *r;
  if (cxr_rdma_open(&r, &o) != 0) return 1;
  unsigned char *mem = aligned_alloc(4096, EXPORT);
  memset(mem, 7, EXPORT);
  cxr_rdma_mr *mr;
  if (cxr_rdma_export(r, "mem", mem, EXPORT, &mr) != 0) return 1;
  int port = cxr_rdma_port(r);
  if (write(wfd, &port, sizeof port) != sizeof port) return 1;
  char c;
  while (read(rfd, &c, 1) > 0) {
  }
  cxr_rdma_close(r);
  free(mem);
  return 0;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* MiB/s of `rounds` transfers of `len` bytes: median and the slowest round. */
static void row(const char *what, cxr_rdma_ep *ep, cxr_rdma_rkey *rk, uint64_t base, size_t len,
                int rounds, int kind) {
  unsigned char *buf = malloc(len), *src = malloc(len);
  double mbs[64];
  memset(buf, 1, len);
  memset(src, 2, len);
  for (int i = -1; i < rounds; i++) {  /* round -1 warms up */
    int64_t t0 = cxr_now_ns();
    int rc = kind == 0   ? cxr_rdma_get(ep, rk, base, buf, len, t0 + 30000000000LL)
             : kind == 1 ? cxr_rdma_put(ep, rk, base, buf, len, t0 + 30000000000LL)
                         : (memcpy(buf, src, len), 0);
    int64_t dt = cxr_now_ns() - t0;
    if (rc) {
      printf("%-22s failed: %s\n", what, cxr_strerror(rc));
      free(buf);
      free(src);
      return;
    }
    if (i >= 0) mbs[i] = (double)len / (1 << 20) / (dt / 1e9);
  }
  qsort(mbs, (size_t)rounds, sizeof mbs[0], cmp);
  printf("| %-26s | %9.0f | %9.0f | %d |\n", what, mbs[rounds / 2], mbs[0], rounds);
  free(buf);
  free(src);
}

int main(void) {
  setenv("UCX_TLS", "tcp", 0);
  setenv("UCX_NET_DEVICES", "lo", 0);
  int down[2], up[2];
  if (pipe(down) || pipe(up)) return 1;
  pid_t pid = fork();
  if (pid == 0) {
    close(down[1]);
    close(up[0]);
    _exit(serve(down[0], up[1]));
  }
  close(down[0]);
  close(up[1]);
  int port = 0;
  if (read(up[0], &port, sizeof port) != sizeof port) return 1;
  cxr_rdma *r;
  cxr_rdma_ep *ep;
  cxr_rdma_rkey *rk;
  uint64_t base;
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  if (cxr_rdma_open(&r, NULL) || cxr_rdma_connect(r, addr, 0, &ep) ||
      cxr_rdma_rkey_get(ep, "mem", &rk, &base, NULL)) {
    fprintf(stderr, "rdma_bench: cannot connect to the child\n");
    kill(pid, SIGKILL);
    return 1;
  }
  printf("| transfer (loopback TCP) | median MiB/s | slowest MiB/s | rounds |\n|---|---|---|---|\n");
  static const struct { const char *name; size_t len; int rounds; } s[] = {
      {"64 KiB", 64 << 10, 64}, {"1 MiB", 1 << 20, 40}, {"16 MiB", 16 << 20, 10}};
  for (unsigned i = 0; i < sizeof s / sizeof s[0]; i++) {
    char what[48];
    snprintf(what, sizeof what, "get %s", s[i].name);
    row(what, ep, rk, base, s[i].len, s[i].rounds, 0);
    snprintf(what, sizeof what, "put %s", s[i].name);
    row(what, ep, rk, base, s[i].len, s[i].rounds, 1);
    snprintf(what, sizeof what, "memcpy %s (copy cost)", s[i].name);
    row(what, ep, rk, base, s[i].len, s[i].rounds, 2);
  }
  cxr_rdma_ep_close(ep);
  cxr_rdma_close(r);
  close(down[1]);
  int st;
  waitpid(pid, &st, 0);
  return 0;
}

/*
 * Cross-rack benchmark: two network namespaces joined by a veth switch, UCX over TCP
 * (UCX_TLS=tcp, UCX_NET_DEVICES=cx0), as another rack would be reached without RDMA.
 * One run prints, side by side:
 *   - a remote no-op call (cxr_conn_call on "ucx://...") beside a raw TCP busy-poll
 *     ping-pong of 64 bytes between the same namespaces (the floor);
 *   - calls/s, one thread, sequential and with 16 calls in flight;
 *   - a logical connect to a known host (fast-connect directory + pooled endpoint) beside
 *     a cold UCX endpoint creation with its handshake, and a whole cxr_connect;
 *   - pinned bytes for a 1 GiB exported heap.
 * Run as root: bazel run -c opt //bench:remote_bench   (it sets up and removes the
 * namespaces itself; `remote_bench serve|client` are its two halves).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cxrpc/rdma.h>
#include <cxrpc/rpc.h>
#include "tests/netns/netns.h"

enum { PORT_RPC = 7400, PORT_RDMA = 7401, PORT_TCP = 7402, MSG = 64 };
enum { N_RTT = 20000, N_WARM = 2000, N_CONNECT = 200, N_COLD = 100 };

static int cmp64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}
static double pct(int64_t *v, size_t n, double p) {
  qsort(v, n, sizeof *v, cmp64);
  size_t i = (size_t)(p * (double)(n - 1));
  return (double)v[i] / 1000.0;
}

/* ================= server half ================= */

static int h_noop(cxr_call *call, const void *args, void **result, void *user) { return 0; }

static void *tcp_echo(void *arg) {
  int ls = *(int *)arg;
  for (;;) {
    int s = accept(ls, NULL, NULL);
    if (s < 0) continue;
    int one = 1;
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char buf[MSG];
    for (;;) {
      size_t got = 0;
      ssize_t n = 0;
      while (got < MSG && (n = recv(s, buf + got, MSG - got, MSG_DONTWAIT)) != 0) {
        if (n > 0) got += (size_t)n;
        else if (errno != EAGAIN && errno != EWOULDBLOCK) break;
      }
      if (got < MSG || send(s, buf, MSG, 0) != MSG) break;
    }
    close(s);
  }
  return NULL;
}

static int serve(const char *ip) {
  char where[64];
  snprintf(where, sizeof where, "ucx://%s:%d", ip, PORT_RPC);
  cxr_channel_opts co;
  cxr_channel_opts_init(&co);
  co.listen = where;
  cxr_channel *ch;
  int rc = cxr_channel_open(&ch, "bench", &co);
  if (rc == 0) rc = cxr_channel_on(ch, 1, h_noop, NULL);
  if (rc == 0) rc = cxr_channel_start(ch);
  if (rc) {
    fprintf(stderr, "serve: channel: %s\n", cxr_strerror(rc));
    return 1;
  }
  /* A plain engine for the connect measurements, exporting a 1 GiB heap. */
  char hp[64];
  snprintf(hp, sizeof hp, "%s:%d", ip, PORT_RDMA);
  cxr_rdma_opts ro;
  cxr_rdma_opts_init(&ro);
  ro.listen = hp;
  cxr_rdma *r;
  if ((rc = cxr_rdma_open(&r, &ro)) != 0) {
    fprintf(stderr, "serve: rdma: %s\n", cxr_strerror(rc));
    return 1;
  }
  size_t gib = 1ull << 30;
  void *heap = mmap(NULL, gib, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                    -1, 0);
  cxr_rdma_mr *mr;
  rc = heap == MAP_FAILED ? CXR_ENOMEM : cxr_rdma_export(r, "heap", heap, gib, &mr);
  cxr_rdma_stats st;
  cxr_rdma_stats_get(r, &st);
  /* The same export where pinning applies (CXRPC_RDMA_PIN=always), default budget. */
  cxr_rdma_opts po;
  cxr_rdma_opts_init(&po);
  po.pin_mode = CXR_RDMA_PIN_ALWAYS;
  cxr_rdma *rp;
  int prc = cxr_rdma_open(&rp, &po), xrc = prc;
  cxr_rdma_stats pst = {0};
  if (prc == 0) {
    cxr_rdma_mr *pm;
    xrc = cxr_rdma_export(rp, "heap", heap, gib, &pm);
    cxr_rdma_stats_get(rp, &pst);
    cxr_rdma_close(rp);
  }
  int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(PORT_TCP)};
  inet_pton(AF_INET, ip, &sa.sin_addr);
  if (bind(ls, (struct sockaddr *)&sa, sizeof sa) || listen(ls, 8)) {
    perror("serve: tcp");
    return 1;
  }
  pthread_t t;
  pthread_create(&t, NULL, tcp_echo, &ls);
  printf("READY export=%d pinned=%zu mode=%d always_export=%d always_pinned=%zu budget=%zu\n", rc,
         st.pinned, st.pin_mode, xrc, pst.pinned, pst.pin_budget);
  fflush(stdout);
  char c;
  while (read(0, &c, 1) > 0) {
  }
  cxr_channel_close(ch);
  cxr_rdma_close(r);
  return 0;
}

/* ================= client half ================= */

static void tcp_pingpong(const char *ip, double *med, double *p99) {
  int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(PORT_TCP)};
  inet_pton(AF_INET, ip, &sa.sin_addr);
  *med = *p99 = -1;
  if (connect(s, (struct sockaddr *)&sa, sizeof sa) != 0) return;
  setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  int64_t *v = malloc(N_RTT * sizeof *v);
  char buf[MSG] = {1};
  for (int i = -1000; i < N_RTT; i++) {
    int64_t t0 = cxr_now_ns();
    if (send(s, buf, MSG, 0) != MSG) break;
    size_t got = 0;
    while (got < MSG) {
      ssize_t n = recv(s, buf + got, MSG - got, MSG_DONTWAIT);
      if (n > 0) got += (size_t)n;
      else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) break;
    }
    if (i >= 0) v[i] = cxr_now_ns() - t0;
  }
  close(s);
  *med = pct(v, N_RTT, 0.5);
  *p99 = pct(v, N_RTT, 0.99);
  free(v);
}

static int client(const char *ip, const char *server_line) {
  char target[96], host[64];
  snprintf(target, sizeof target, "ucx://%s:%d/bench", ip, PORT_RPC);
  snprintf(host, sizeof host, "%s:%d", ip, PORT_RDMA);
  int64_t *v = malloc(N_RTT * sizeof *v);

  double tmed, tp99;
  tcp_pingpong(ip, &tmed, &tp99);

  /* remote no-op calls */
  cxr_conn *c;
  int64_t t0 = cxr_now_ns();
  int rc = cxr_connect(&c, target, NULL);
  double first_connect = (double)(cxr_now_ns() - t0) / 1000.0;
  if (rc) {
    fprintf(stderr, "client: connect %s: %s\n", target, cxr_strerror(rc));
    return 1;
  }
  for (int i = 0; i < 1000; i++) cxr_conn_call(c, 1, NULL, NULL, NULL);
  int errs = 0;
  int64_t start = cxr_now_ns();
  for (int i = 0; i < N_RTT; i++) {
    int64_t a = cxr_now_ns();
    errs += cxr_conn_call(c, 1, NULL, NULL, NULL) != 0;
    v[i] = cxr_now_ns() - a;
  }
  double secs = (double)(cxr_now_ns() - start) / 1e9;
  double cmed = pct(v, N_RTT, 0.5), cp99 = pct(v, N_RTT, 0.99);
  double cps = N_RTT / secs;
  /* 16 in flight */
  enum { DEPTH = 16 };
  cxr_future *f[DEPTH];
  start = cxr_now_ns();
  int done = 0;
  for (int i = 0; i < DEPTH; i++) errs += cxr_conn_call_async(c, 1, NULL, &f[i], NULL) != 0;
  while (done < N_RTT) {
    for (int i = 0; i < DEPTH && done < N_RTT; i++) {
      errs += cxr_future_wait(f[i], 0, NULL) != 0;
      cxr_future_free(f[i]);
      done++;
      errs += cxr_conn_call_async(c, 1, NULL, &f[i], NULL) != 0;
    }
  }
  for (int i = 0; i < DEPTH; i++) {
    cxr_future_wait(f[i], 0, NULL);
    cxr_future_free(f[i]);
  }
  double cps16 = N_RTT / ((double)(cxr_now_ns() - start) / 1e9);

  /* whole cxr_connect to the known host (heap creation + open round trip) */
  for (int i = 0; i < N_CONNECT; i++) {
    cxr_conn *c2;
    int64_t a = cxr_now_ns();
    rc = cxr_connect(&c2, target, NULL);
    v[i] = cxr_now_ns() - a;
    if (rc == 0) cxr_conn_close(c2);
    else errs++;
  }
  double fmed = pct(v, N_CONNECT, 0.5), fp99 = pct(v, N_CONNECT, 0.99);
  cxr_conn_close(c);

  /* logical connects on the rdma engine: cold (directory forgotten) and warm */
  cxr_rdma *r;
  if ((rc = cxr_rdma_open(&r, NULL)) != 0) return 1;
  for (int i = 0; i < N_COLD; i++) {
    cxr_rdma_forget(r, host);
    cxr_rdma_ep *ep;
    int64_t a = cxr_now_ns();
    rc = cxr_rdma_connect(r, host, 0, &ep);
    v[i] = cxr_now_ns() - a;
    if (rc == 0) cxr_rdma_ep_close(ep);
    else errs++;
  }
  double cold_med = pct(v, N_COLD, 0.5), cold_p99 = pct(v, N_COLD, 0.99);
  for (int i = 0; i < N_WARM; i++) {
    cxr_rdma_ep *ep;
    usleep(200); /* let the pool refill in the background */
    int64_t a = cxr_now_ns();
    rc = cxr_rdma_connect(r, host, 0, &ep);
    v[i] = cxr_now_ns() - a;
    if (rc == 0) cxr_rdma_ep_close(ep);
    else errs++;
  }
  double warm_med = pct(v, N_WARM, 0.5), warm_p99 = pct(v, N_WARM, 0.99);
  /* the warm endpoint is usable: one-sided read from the exported 1 GiB heap */
  cxr_rdma_ep *ep;
  uint64_t word = 0, base = 0;
  size_t len = 0;
  cxr_rdma_rkey *rk;
  int grc = cxr_rdma_connect(r, host, 0, &ep);
  if (grc == 0) grc = cxr_rdma_rkey_get(ep, "heap", &rk, &base, &len);
  if (grc == 0) grc = cxr_rdma_get(ep, rk, base + len - 8, &word, 8, 0);
  cxr_rdma_stats st;
  cxr_rdma_stats_get(r, &st);
  cxr_rdma_close(r);

  int exp_rc = 0, mode = 0, always_rc = 0;
  size_t pinned = 0, always_pinned = 0, budget = 0;
  sscanf(server_line, "READY export=%d pinned=%zu mode=%d always_export=%d always_pinned=%zu budget=%zu",
         &exp_rc, &pinned, &mode, &always_rc, &always_pinned, &budget);

  printf("cxrpc remote benchmark: client and server in two network namespaces, UCX_TLS=tcp "
         "over a veth switch\n\n");
  printf("| measurement                                         |   median |      p99 | note\n");
  printf("|-----------------------------------------------------|----------|----------|-----\n");
  printf("| raw TCP busy-poll ping-pong, 64 B (floor)           | %6.1f us | %6.1f us | same namespaces\n",
         tmed, tp99);
  printf("| remote no-op call, cxr_conn_call on ucx://          | %6.1f us | %6.1f us | %.2fx the floor (target <= 1.5x)\n",
         cmed, cp99, cmed / tmed);
  printf("| remote calls/s, 1 thread, sequential                | %8.0f |          |\n", cps);
  printf("| remote calls/s, 1 thread, 16 in flight              | %8.0f |          |\n", cps16);
  printf("| logical connect, known host (pooled endpoint)       | %6.1f us | %6.1f us | target < 20 us; %llu of %llu from the pool\n",
         warm_med, warm_p99, (unsigned long long)st.pool_hits,
         (unsigned long long)st.warm_connects);
  printf("| cold UCX endpoint creation + handshake              | %6.1f us | %6.1f us | %.0fx the warm connect\n",
         cold_med, cold_p99, cold_med / warm_med);
  printf("| whole cxr_connect ucx://, known host                | %6.1f us | %6.1f us | heap + open round trip; first: %.0f us\n",
         fmed, fp99, first_connect);
  printf("| pinned bytes, 1 GiB exported heap (pin mode %s)  | %8zu |          | export %s\n",
         mode == CXR_RDMA_PIN_NEVER ? "auto " : "pin  ", pinned, exp_rc ? cxr_strerror(exp_rc) : "ok");
  printf("| pinned bytes, same with CXRPC_RDMA_PIN=always       | %8zu |          | export %s (budget %zu MiB; the "
         "pinned bytes are the bounce buffer)\n",
         always_pinned, always_rc ? "refused" : "ok", budget >> 20);
  printf("\nerrors: %d; one-sided read of the last word of the 1 GiB export: %s\n", errs,
         grc ? cxr_strerror(grc) : "ok");
  free(v);
  return errs != 0;
}

/* ================= orchestration ================= */

static int run_in(const char *ns, char *const argv[], int *in, int *out) {
  int pi[2], po[2];
  if (pipe(pi) || pipe(po)) return -1;
  pid_t p = fork();
  if (p == 0) {
    dup2(pi[0], 0);
    dup2(po[1], 1);
    close(pi[1]);
    close(po[0]);
    char *args[16] = {"/usr/sbin/ip", "netns", "exec", (char *)ns};
    int k = 4;
    for (int i = 0; argv[i] && k < 15; i++) args[k++] = argv[i];
    args[k] = NULL;
    execv(args[0], args);
    _exit(127);
  }
  close(pi[0]);
  close(po[1]);
  *in = pi[1];
  *out = po[0];
  return p;
}

static int read_line(int fd, char *buf, size_t n) {
  size_t k = 0;
  while (k + 1 < n) {
    ssize_t r = read(fd, buf + k, 1);
    if (r <= 0) break;
    if (buf[k] == '\n') break;
    k++;
  }
  buf[k] = '\0';
  return (int)k;
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "serve")) return serve(argv[2]);
  if (argc == 4 && !strcmp(argv[1], "client")) return client(argv[2], argv[3]);
  if (!cxrt_net_available()) {
    fprintf(stderr, "remote_bench: needs root (network namespaces); skipped\n");
    return 0;
  }
  cxrt_net net;
  if (cxrt_net_up(&net, "bench", 2) != 0) return 1;
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return 1;
  self[n] = '\0';
  setenv("UCX_TLS", "tcp", 1);
  setenv("UCX_NET_DEVICES", "cx0", 1);
  setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1);
  setenv("CXRPC_LOG", "error", 0); /* the table, not the endpoints closing at the end */
  char root_s[] = "/tmp/cxrpc-rbench-s.XXXXXX", root_c[] = "/tmp/cxrpc-rbench-c.XXXXXX";
  if (!mkdtemp(root_s) || !mkdtemp(root_c)) return 1;
  int sin, sout, cin, cout;
  setenv("CXRPC_ROOT", root_s, 1);
  setenv("CXRPC_POD", "1", 1);
  char *sargv[] = {self, "serve", net.ip[1], NULL};
  pid_t sp = run_in(net.ns[1], sargv, &sin, &sout);
  char line[512];
  read_line(sout, line, sizeof line);
  int rc = 1;
  if (strncmp(line, "READY", 5) == 0) {
    setenv("CXRPC_ROOT", root_c, 1);
    setenv("CXRPC_POD", "2", 1);
    char *cargv[] = {self, "client", net.ip[1], line, NULL};
    pid_t cp = run_in(net.ns[0], cargv, &cin, &cout);
    char buf[4096];
    ssize_t k;
    while ((k = read(cout, buf, sizeof buf)) > 0) fwrite(buf, 1, (size_t)k, stdout);
    int st = 0;
    waitpid(cp, &st, 0);
    rc = WIFEXITED(st) ? WEXITSTATUS(st) : 1;
  } else {
    fprintf(stderr, "remote_bench: server did not start: %s\n", line);
  }
  close(sin);
  for (int i = 0; i < 300 && waitpid(sp, NULL, WNOHANG) == 0; i++) usleep(10000);
  kill(sp, SIGKILL);
  waitpid(sp, NULL, 0);
  cxrt_net_down(&net);
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf %s %s", root_s, root_c);
  if (system(cmd) != 0) fprintf(stderr, "remote_bench: could not remove %s\n", root_s);
  return rc;
}

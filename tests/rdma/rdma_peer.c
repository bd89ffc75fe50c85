/* A real peer process for the rdma tests.
 *   rdma_peer serve ADDR:PORT [export_bytes]: listens, exports "mem" (bytes i & 0xff) and
 *     "spare" (4 KiB),
 *     echoes messages 20 -> 21, prints "READY <port> <mem address>", runs until stdin
 *     reaches EOF or it is killed.
 *   rdma_peer client: prints "READY", then runs commands from stdin, one answer line each:
 *     connect HOST:PORT MS   -> "ok" | "err <code> <ms taken>"
 *     ping MS                -> "ok" | "timeout" | "err <code>"   (echo within MS) |
 *                               "gone <code>" (the endpoint failed first, no echo)
 *     fadd                   -> "ok <old>" | "err <code>"         (on "mem" word 0)
 *     watch MS               -> "status <code>" (pings until the endpoint fails or MS)
 *     sendgone BYTES MS      -> "closed <send code> <close ms>": sends BYTES (message 20)
 *                               with an MS deadline, closes the endpoint, then drops the
 *                               buffer's pages (MADV_DONTNEED: the caller let it go)
 *     touched                -> "touched <pages>": pages of that buffer read or written
 *                               since (resident again, mincore)
 *     stream BYTES MS        -> "streamed <posts> <status>": posts BYTES (message 20) every
 *                               200 us, none waited for (they pile up in UCX when the
 *                               receiver is slower), until MS pass or the endpoint fails
 *                               (its status then), then closes the endpoint
 *   rdma_peer flood PORT N [ID [CONNS]]: a bare UCX client of an engine's listener on
 *     127.0.0.1:PORT that speaks its hello (rdma/ep.c: id 1, header {magic "cxrh", version
 *     1, token}, answered with id 2), or sends message ID with that header (answered with
 *     ID + 1), on CONNS connections (default 1, at most 256): waits for one answer on each,
 *     sends N more on each without progressing its worker again (it reads nothing more),
 *     prints "FLOODED", waits for stdin's EOF.
 *   rdma_peer opts: cxr_rdma_opts_init from the environment it was started with
 *     (CXRPC_REMOTE_HEAP_MB aside: it moves msg_max's default), its warnings on stdout,
 *     then "MSG_MAX <bytes>". A test sets a variable for this process alone: setenv in
 *     the test's, beside engines' threads that call getenv, is undefined. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <stdatomic.h>

#include <arpa/inet.h>
#include <ucp/api/ucp.h>

#include <cxrpc/rdma.h>

static void echo(cxr_rdma_msg *m, void *user) {
  size_t hl, dl;
  const void *h = cxr_rdma_msg_hdr(m, &hl);
  const void *d = cxr_rdma_msg_data(m, &dl);
  struct iovec iov = {(void *)d, dl};
  cxr_rdma_reply(m, 21, h, hl, dl ? &iov : NULL, dl ? 1 : 0, 0);
}

static _Atomic int echoes;
static void on_echo(cxr_rdma_msg *m, void *user) { echoes++; }

/* sendgone: sends a buffer with a deadline, closes the endpoint and drops the buffer's pages.
 * Nothing of ours touches it again, so a page resident afterwards was touched by UCX (a
 * read faults in the zero page). Returns the send's code; *ms gets how long the close took. */
static char *gone;
static size_t gone_len;

static int send_and_close(cxr_rdma_ep *ep, size_t bytes, long deadline_ms, long *ms) {
  gone = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (gone == MAP_FAILED) {
    gone = NULL;
    return CXR_ENOMEM;
  }
  gone_len = bytes;
  memset(gone, 0x5a, bytes);
  struct iovec iov = {gone, bytes};
  int rc = cxr_rdma_am_send(ep, 20, "g", 1, &iov, 1, cxr_now_ns() + deadline_ms * 1000000);
  int64_t t0 = cxr_now_ns();
  cxr_rdma_ep_close(ep);
  *ms = (long)((cxr_now_ns() - t0) / 1000000);
  madvise(gone, bytes, MADV_DONTNEED);
  return rc;
}

static long touched(void) {
  size_t pg = (size_t)sysconf(_SC_PAGESIZE), n = (gone_len + pg - 1) / pg;
  unsigned char *v = malloc(n ? n : 1);
  long t = 0;
  if (gone == NULL || v == NULL || mincore(gone, gone_len, v) != 0) t = -1;
  for (size_t i = 0; t >= 0 && i < n; i++) t += v[i] & 1;
  free(v);
  return t;
}

/* stream: one buffer for every post, kept to the process's end (a post may outlive the
 * endpoint's close). Returns how many posts UCX took; *status gets the endpoint's status. */
static long stream(cxr_rdma_ep *ep, size_t bytes, long ms, int *status) {
  static char *buf;
  static size_t len;
  if (buf == NULL) {
    buf = malloc(bytes ? bytes : 1);
    if (buf == NULL) return -1;
    memset(buf, 0x17, bytes);
    len = bytes;
  }
  struct iovec iov = {buf, bytes < len ? bytes : len};
  long posts = 0;
  int64_t end = cxr_now_ns() + ms * 1000000;
  while ((*status = cxr_rdma_ep_status(ep)) == 0 && cxr_now_ns() < end) {
    if (cxr_rdma_am_post(ep, 20, "s", 1, &iov, 1) == 0) posts++;
    usleep(200);
  }
  cxr_rdma_ep_close(ep);
  return posts;
}

static int client(void) {
  cxr_rdma *r;
  int rc = cxr_rdma_open(&r, NULL);
  if (rc == 0) rc = cxr_rdma_am_set(r, 21, on_echo, NULL);
  if (rc) {
    printf("err %d\n", rc);
    return 1;
  }
  printf("READY\n");
  fflush(stdout);
  cxr_rdma_ep *ep = NULL;
  char line[256], arg[128];
  long ms;
  unsigned long bytes;
  while (fgets(line, sizeof line, stdin)) {
    if (sscanf(line, "connect %127s %ld", arg, &ms) == 2) {
      int64_t t0 = cxr_now_ns();
      if (ep) cxr_rdma_ep_close(ep), ep = NULL;
      rc = cxr_rdma_connect(r, arg, t0 + ms * 1000000, &ep);
      if (rc) printf("err %d %ld\n", rc, (long)((cxr_now_ns() - t0) / 1000000));
      else printf("ok\n");
    } else if (sscanf(line, "ping %ld", &ms) == 1 && ep) {
      int before = echoes;
      int64_t end = cxr_now_ns() + ms * 1000000;
      rc = cxr_rdma_am_send(ep, 20, "p", 1, NULL, 0, end);
      while (rc == 0 && echoes == before && cxr_rdma_ep_status(ep) == 0 && cxr_now_ns() < end)
        usleep(100);
      /* Gone: an echo that came before the failure is still queued for its handler. */
      for (int i = 0; i < 200 && rc == 0 && echoes == before && cxr_rdma_ep_status(ep); i++)
        usleep(1000);
      if (rc) printf("err %d\n", rc);
      else if (echoes > before) printf("ok\n");
      else if (cxr_rdma_ep_status(ep)) printf("gone %d\n", cxr_rdma_ep_status(ep));
      else printf("timeout\n");
    } else if (!strncmp(line, "fadd", 4) && ep) {
      cxr_rdma_rkey *rk;
      uint64_t base, old = 0;
      size_t len;
      rc = cxr_rdma_rkey_get(ep, "mem", &rk, &base, &len);
      if (rc == 0) rc = cxr_rdma_fadd64(ep, rk, base, 1, &old, 0);
      if (rc) printf("err %d\n", rc);
      else printf("ok %llu\n", (unsigned long long)old);
    } else if (sscanf(line, "watch %ld", &ms) == 1 && ep) {
      int64_t end = cxr_now_ns() + ms * 1000000;
      while (cxr_rdma_ep_status(ep) == 0 && cxr_now_ns() < end) {
        cxr_rdma_am_post(ep, 20, "w", 1, NULL, 0);
        usleep(20000);
      }
      printf("status %d\n", cxr_rdma_ep_status(ep));
    } else if (sscanf(line, "sendgone %lu %ld", &bytes, &ms) == 2 && ep && !gone) {
      long took = 0;
      rc = send_and_close(ep, bytes, ms, &took);
      ep = NULL;
      printf("closed %d %ld\n", rc, took);
    } else if (sscanf(line, "stream %lu %ld", &bytes, &ms) == 2 && ep) {
      int st = 0;
      long posts = stream(ep, bytes, ms, &st);
      ep = NULL;
      printf("streamed %ld %d\n", posts, st);
    } else if (!strncmp(line, "touched", 7)) {
      printf("touched %ld\n", touched());
    } else {
      printf("err %d\n", CXR_EINVAL);
    }
    fflush(stdout);
  }
  if (ep) cxr_rdma_ep_close(ep);
  cxr_rdma_close(r);
  return 0;
}

static ucs_status_t on_answer(void *arg, const void *h, size_t hl, void *d, size_t dl,
                              const ucp_am_recv_param_t *p) {
  ++*(int *)arg;
  return UCS_OK;
}
static void on_flood_err(void *arg, ucp_ep_h ep, ucs_status_t st) {}

/* A client-server endpoint to the engine listening on 127.0.0.1:port (NULL on failure). */
static ucp_ep_h flood_ep(ucp_worker_h w, int port) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  ucp_ep_params_t p = {
      .field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER,
      .flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
      .sockaddr = {(const struct sockaddr *)&sa, sizeof sa},
      .err_mode = UCP_ERR_HANDLING_MODE_PEER,
      .err_handler = {on_flood_err, NULL}};
  ucp_ep_h ep;
  return ucp_ep_create(w, &p, &ep) == UCS_OK ? ep : NULL;
}

/* Sends n messages `id` with a hello header on ep; never progresses the worker. */
static void flood_send(ucp_ep_h ep, unsigned id, int n) {
  static const struct {
    uint32_t magic, version;
    uint64_t token;
  } hello = {0x63787268u, 1, 7};
  ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                            .flags = UCP_AM_SEND_FLAG_REPLY};
  for (int i = 0; i < n; i++) {
    ucs_status_ptr_t sp = ucp_am_send_nbx(ep, id, &hello, sizeof hello, NULL, 0, &rp);
    if (UCS_PTR_IS_PTR(sp)) ucp_request_free(sp); /* pending: it stays, never progressed */
  }
}

enum { FLOOD_CONNS_MAX = 256 };

static int flood(int port, int n, unsigned id, int conns) {
  setenv("UCX_TCP_SNDBUF", "4m", 1); /* hellos sent without progress all reach the socket */
  ucp_config_t *cfg;
  ucp_context_h ctx;
  ucp_worker_h w;
  static ucp_ep_h eps[FLOOD_CONNS_MAX];
  int answers = 0;
  if (conns < 1 || conns > FLOOD_CONNS_MAX) return 2;
  if (ucp_config_read(NULL, NULL, &cfg) != UCS_OK) return 1;
  ucp_params_t cp = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_AM};
  ucs_status_t st = ucp_init(&cp, cfg, &ctx);
  ucp_config_release(cfg);
  ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                            .thread_mode = UCS_THREAD_MODE_SINGLE};
  if (st != UCS_OK || ucp_worker_create(ctx, &wp, &w) != UCS_OK) return 1;
  ucp_am_handler_param_t hp = {
      .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG,
      .id = id == 1 ? 2 : id + 1, .cb = on_answer, .arg = &answers};
  if (ucp_worker_set_am_recv_handler(w, &hp) != UCS_OK) return 1;
  for (int c = 0; c < conns; c++) {
    if ((eps[c] = flood_ep(w, port)) == NULL) return 1;
    flood_send(eps[c], id, 1);
  }
  /* One answer per connection: each is up. Then nothing more is read. */
  int64_t end = cxr_now_ns() + 20000000000;
  while (answers < conns && cxr_now_ns() < end) ucp_worker_progress(w);
  if (answers < conns) return 1;
  for (int c = 0; c < conns; c++) flood_send(eps[c], id, n);
  printf("FLOODED\n");
  fflush(stdout);
  char c;
  while (read(0, &c, 1) > 0) {
  }
  _exit(0); /* no close: nothing of the answers is read, ever */
}

static int opts(void) {
  unsetenv("CXRPC_REMOTE_HEAP_MB"); /* no thread here but this one */
  if (dup2(1, 2) < 0) return 1;
  cxr_log_set_level(CXR_LOG_WARN);
  cxr_rdma_opts o;
  cxr_rdma_opts_init(&o);
  printf("MSG_MAX %zu\n", o.msg_max);
  return 0;
}

int main(int argc, char **argv) {
  if (argc >= 2 && !strcmp(argv[1], "client")) return client();
  if (argc >= 2 && !strcmp(argv[1], "opts")) return opts();
  if (argc >= 4 && !strcmp(argv[1], "flood"))
    return flood(atoi(argv[2]), atoi(argv[3]), argc > 4 ? (unsigned)atoi(argv[4]) : 1,
                 argc > 5 ? atoi(argv[5]) : 1);
  if (argc < 3 || strcmp(argv[1], "serve")) {
    fprintf(stderr, "usage: rdma_peer serve ADDR:PORT [export_bytes]\n");
    return 2;
  }
  size_t len = argc > 3 ? strtoull(argv[3], NULL, 0) : (4u << 20);
  cxr_rdma_opts o;
  cxr_rdma_opts_init(&o);
  o.listen = argv[2];
  cxr_rdma *r;
  int rc = cxr_rdma_open(&r, &o);
  if (rc) {
    fprintf(stderr, "rdma_peer: open: %s\n", cxr_strerror(rc));
    return 1;
  }
  unsigned char *mem = aligned_alloc(4096, len);
  for (size_t i = 0; i < len; i++) mem[i] = (unsigned char)i;
  cxr_rdma_mr *mr;
  rc = cxr_rdma_export(r, "mem", mem, len, &mr);
  static unsigned char spare[4096] __attribute__((aligned(4096)));
  cxr_rdma_mr *spare_mr;
  if (rc == 0) rc = cxr_rdma_export(r, "spare", spare, sizeof spare, &spare_mr);
  if (rc == 0) rc = cxr_rdma_am_set(r, 20, echo, NULL);
  if (rc) {
    fprintf(stderr, "rdma_peer: export: %s\n", cxr_strerror(rc));
    return 1;
  }
  printf("READY %d %p\n", cxr_rdma_port(r), (void *)mem);
  fflush(stdout);
  char c;
  while (read(0, &c, 1) > 0) {
  }
  cxr_rdma_close(r);
  free(mem);
  return 0;
}

/* A real process for the cross-rack tests, on the public API only.
 *   remote_peer server NAME LISTEN   opens channel NAME (also listening on LISTEN, e.g.
 *       "ucx://10.77.0.1:7400"), serves, prints "READY", runs until stdin reaches EOF.
 *       With REMOTE_PEER_WORKERS=N, N workers (default 2); with REMOTE_PEER_UNTRUSTED=1,
 *       an untrusted channel.
 *   remote_peer client TARGET        prints "READY"; commands on stdin, one answer line each:
 *       connect MS        -> "ok" | "err <code> <ms taken>"
 *       graph N           -> "ok <args address>" | "err <code>" | "bad <what>"
 *                            (a pointer-rich message of N nodes there and back)
 *       many K N          -> K graph calls: "ok" | first failure
 *       noop MS           -> "ok" | "err <code>"   (a call with a deadline of MS)
 *       slow MS DL        -> starts a call the server sleeps MS in (deadline DL ms), prints
 *                            "sent", then its outcome "ok" | "err <code> <ms taken>"
 *       whoami            -> "ok <server pid>"
 *       spin MS AFTER     -> starts a call the server works in until the caller gives up
 *                            (at most MS), cancels it after AFTER ms, then asks the server
 *                            until that handler stopped: "ok <started> <stopped>" (the
 *                            server's counts of such handlers) | "err <code>"
 *       cycles N          -> N times connect + call + close: "ok" | first failure
 *       giveup N US       -> N connects with a timeout of US microseconds each (those that
 *                            make it are closed at once): "ok <gave up> <connected>" | the
 *                            first other failure
 *       queued DL         -> two calls that sleep 1 s occupy the server's two workers, and a
 *                            spin call with a deadline of DL ms waits behind them; then
 *                            "ok <spin call's code> <spin handlers started>"
 *       cancelmany K MS   -> like queued, K spin calls of MS ms each wait behind the two
 *                            sleeping calls, and all K are cancelled at once: "ok <spin
 *                            handlers started since>" (0: the server skipped every one)
 *       cbclose MS        -> a call the server sleeps MS in, with a callback that frees its
 *                            future, then the connection's close: "ok <ms the close took>
 *                            <callbacks run>"
 *       forkexit          -> a child made by fork(2) returns from main (atexit handlers run,
 *                            the parent's engine among them): "ok <child's exit status>"
 *       forkcall          -> a child made by fork(2) calls on the parent's connection, then
 *                            connects on its own: both must be refused (CXR_ECLOSED: UCX is
 *                            not fork-safe): "ok <child's exit status>" (0, or the step that
 *                            was not refused)
 *       fill N BYTE       -> a call whose result is N bytes of BYTE in the server's result
 *                            heap: "ok <result address> <result heap base>" once every byte
 *                            is BYTE | "err <code>" | "bad <offset of the first wrong byte>"
 *       argsback N        -> a call with N bytes of arguments (byte i = i % 251) whose
 *                            handler adds 1 to each in its replica and names them as part of
 *                            its result: "ok" once the client's own block holds i % 251 + 1
 *                            and the result points at it | "err <code>" | "bad <what>"
 *       failgraph N       -> N calls whose handler builds a result graph (root, name, three
 *                            nodes, its ranges set) and then fails: "ok <bytes used in the
 *                            server's result heap before> <after>" | "err <code>"
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cxrpc/rpc.h>

#include "tests/rpc/spin.h"

enum { M_GRAPH = 1, M_NOOP = 2, M_SLEEP = 3, M_WHOAMI = 4, M_SPIN = 5, M_SPIN_COUNTS = 6,
       M_FAIL_GRAPH = 7, M_HEAP_USED = 8, M_FILL = 9, M_ARGS_BACK = 10 };

/* M_FILL's arguments (inline): its result is n bytes of `byte`. */
typedef struct fill_args {
  int64_t n, byte;
} fill_args;

typedef struct node {
  int64_t v;
  struct node *next;
  char *label;
} node;

typedef struct graph_args {
  int64_t n;
  node *head;
  char *name;
} graph_args;

typedef struct graph_res {
  int64_t sum, n;
  node *rev;          /* new nodes in the result heap; labels point into the arguments */
  char *name;         /* a copy in the result heap */
  const graph_args *echo;  /* the arguments' own address, as the server saw it */
  int32_t server_pid;
} graph_res;

/* The forkexit child leaves its copy of the parent's UCX engine alone on purpose (rdma:
 * cxr_rdma_close does nothing in a child): LeakSanitizer, when the build has it, skips its
 * check in that child only (it calls this hook at exit). */
static int forked_child;
int __lsan_is_turned_off(void);
int __lsan_is_turned_off(void) { return forked_child; }

static bool in(cxr_range r, const void *p, size_t len) {
  uintptr_t a = (uintptr_t)p, b = (uintptr_t)r.p;
  return p != NULL && a >= b && len <= r.len && a - b <= r.len - len;
}

/* ---- server ---- */

static int h_graph(cxr_call *call, const void *args, void **result, void *user) {
  cxr_range ar = cxr_call_arg_range(call);
  const graph_args *ga = args;
  if (!in(ar, ga, sizeof *ga) || ga->n < 0 || ga->n > 100000 || !in(ar, ga->name, 1))
    return CXR_EBADPTR;
  cxr_heap *h = cxr_call_heap(call);
  graph_res *res = cxr_heap_alloc(h, sizeof *res);
  size_t nl = strnlen(ga->name, 64);
  char *name = cxr_heap_alloc(h, nl + 1);
  cxr_range *rg = malloc((size_t)(ga->n + 2) * sizeof *rg);
  if (res == NULL || name == NULL || rg == NULL) return CXR_ENOMEM;
  memcpy(name, ga->name, nl);
  name[nl] = '\0';
  *res = (graph_res){.name = name, .echo = ga, .server_pid = (int32_t)getpid()};
  size_t nr = 0;
  rg[nr++] = (cxr_range){res, sizeof *res};
  rg[nr++] = (cxr_range){name, nl + 1};
  const node *x = ga->head;
  for (int64_t i = 0; i < ga->n; i++) {
    if (!in(ar, x, sizeof *x) || !in(ar, x->label, 1)) return CXR_EBADPTR;
    char want[24];
    snprintf(want, sizeof want, "L%" PRId64, x->v);
    if (strncmp(x->label, want, sizeof want) != 0) return CXR_EPROTO;
    node *y = cxr_heap_alloc(h, sizeof *y);
    if (y == NULL) return CXR_ENOMEM;
    *y = (node){.v = x->v, .next = res->rev, .label = x->label};
    res->rev = y;
    res->sum += x->v;
    res->n++;
    rg[nr++] = (cxr_range){y, sizeof *y};
    x = x->next;
  }
  if (x != NULL) return CXR_EPROTO;
  int rc = cxr_call_set_result_ranges(call, rg, nr);
  free(rg);
  *result = res;
  return rc;
}

static int h_noop(cxr_call *call, const void *args, void **result, void *user) { return 0; }

static int h_sleep(cxr_call *call, const void *args, void **result, void *user) {
  int64_t ms = 0;
  if (args) memcpy(&ms, args, sizeof ms);
  if (ms > 0 && ms < 60000) usleep((useconds_t)ms * 1000);
  return 0;
}

static int h_whoami(cxr_call *call, const void *args, void **result, void *user) {
  int32_t *p = cxr_heap_alloc(cxr_call_heap(call), sizeof *p);
  if (p == NULL) return CXR_ENOMEM;
  *p = (int32_t)getpid();
  *result = p;
  return 0;
}

/* M_SPIN: tests/rpc/spin.h; M_SPIN_COUNTS answers with its counts. */
static spin_counts spins;

static int h_spin_counts(cxr_call *call, const void *args, void **result, void *user) {
  int64_t *p = cxr_heap_alloc(cxr_call_heap(call), 2 * sizeof *p);
  if (p == NULL) return CXR_ENOMEM;
  p[0] = __atomic_load_n(&spins.started, __ATOMIC_SEQ_CST);
  p[1] = __atomic_load_n(&spins.stopped, __ATOMIC_SEQ_CST);
  *result = p;
  return 0;
}

/* M_FAIL_GRAPH: a result graph in the result heap, its ranges named, then an error. */
static int h_fail_graph(cxr_call *call, const void *args, void **result, void *user) {
  cxr_heap *h = cxr_call_heap(call);
  graph_res *res = cxr_heap_alloc(h, sizeof *res);
  char *name = cxr_heap_alloc(h, 16);
  if (res == NULL || name == NULL) return CXR_ENOMEM;
  *res = (graph_res){.name = name};
  strcpy(name, "never read");
  cxr_range rg[5] = {{res, sizeof *res}, {name, 16}};
  for (int i = 0; i < 3; i++) {
    node *y = cxr_heap_alloc(h, sizeof *y);
    if (y == NULL) return CXR_ENOMEM;
    *y = (node){.v = i, .next = res->rev};
    res->rev = y;
    rg[2 + i] = (cxr_range){y, sizeof *y};
  }
  int rc = cxr_call_set_result_ranges(call, rg, 5);
  *result = res;
  return rc ? rc : CXR_EPERM;
}

/* M_HEAP_USED: the bytes in use in this connection's result heap (before its own answer). */
static int h_heap_used(cxr_call *call, const void *args, void **result, void *user) {
  cxr_heap_stats st;
  int rc = cxr_heap_get_stats(cxr_call_heap(call), &st);
  if (rc) return rc;
  int64_t *p = cxr_heap_alloc(cxr_call_heap(call), sizeof *p);
  if (p == NULL) return CXR_ENOMEM;
  *p = (int64_t)st.used;
  *result = p;
  return 0;
}

static int h_fill(cxr_call *call, const void *args, void **result, void *user) {
  fill_args fa;
  if (args == NULL) return CXR_EINVAL;
  memcpy(&fa, args, sizeof fa);
  if (fa.n <= 0 || fa.n > (64 << 20)) return CXR_EINVAL;
  void *p = cxr_heap_alloc(cxr_call_heap(call), (size_t)fa.n);
  if (p == NULL) return CXR_ENOMEM;
  memset(p, (int)fa.byte, (size_t)fa.n);
  *result = p;
  return 0;
}

/* M_ARGS_BACK: the arguments, each byte plus one, go back as part of the result graph
 * (across racks: from the server's replica of the client's heap). */
static int h_args_back(cxr_call *call, const void *args, void **result, void *user) {
  cxr_range ar = cxr_call_arg_range(call);
  size_t n = cxr_call_arg_len(call);
  if (n == 0 || !in(ar, args, n)) return CXR_EBADPTR;
  unsigned char *b = (unsigned char *)args; /* the handler's own copy across racks */
  for (size_t i = 0; i < n; i++) {
    if (b[i] != i % 251) return CXR_EPROTO;
    b[i]++;
  }
  const void **root = cxr_heap_alloc(cxr_call_heap(call), sizeof *root);
  if (root == NULL) return CXR_ENOMEM;
  *root = args;
  cxr_range rg[2] = {{root, sizeof *root}, {args, n}};
  *result = root;
  return cxr_call_set_result_ranges(call, rg, 2);
}

static int server(const char *name, const char *listen) {
  cxr_channel_opts o;
  cxr_channel_opts_init(&o);
  o.listen = listen;
  const char *w = getenv("REMOTE_PEER_WORKERS"), *u = getenv("REMOTE_PEER_UNTRUSTED");
  o.workers = w && atoi(w) > 0 ? (unsigned)atoi(w) : 2;
  o.untrusted = u && strcmp(u, "1") == 0;
  cxr_channel *ch;
  int rc = cxr_channel_open(&ch, name, &o);
  if (rc == 0) rc = cxr_channel_on(ch, M_GRAPH, h_graph, NULL);
  if (rc == 0) rc = cxr_channel_on(ch, M_NOOP, h_noop, NULL);
  if (rc == 0) rc = cxr_channel_on(ch, M_SLEEP, h_sleep, NULL);
  if (rc == 0) rc = cxr_channel_on(ch, M_WHOAMI, h_whoami, NULL);
  if (rc == 0) rc = cxr_channel_on(ch, M_SPIN, spin_handler, &spins);
  if (rc == 0) rc = cxr_channel_on(ch, M_SPIN_COUNTS, h_spin_counts, NULL);
  if (rc == 0) rc = cxr_channel_on(ch, M_FAIL_GRAPH, h_fail_graph, NULL);
  if (rc == 0) rc = cxr_channel_on(ch, M_HEAP_USED, h_heap_used, NULL);
  if (rc == 0) rc = cxr_channel_on(ch, M_FILL, h_fill, NULL);
  if (rc == 0) rc = cxr_channel_on(ch, M_ARGS_BACK, h_args_back, NULL);
  if (rc == 0) rc = cxr_channel_start(ch);
  if (rc) {
    printf("err %d\n", rc);
    return 1;
  }
  printf("READY\n");
  fflush(stdout);
  char c;
  while (read(0, &c, 1) > 0) {
  }
  cxr_channel_close(ch);
  return 0;
}

/* ---- client ---- */

static cxr_conn *conn;
static char target[256];

static int callbacks_run;
static void free_own_future(int err, void *result, void *user) {
  (void)err, (void)result;
  __atomic_add_fetch(&callbacks_run, 1, __ATOMIC_SEQ_CST);
  cxr_future_free(user);
}

/* cbclose's second form: the callback calls again on the connection being closed, which
 * must refuse it (CXR_ECLOSED): a call it took then would never end. */
static cxr_conn *closing;
static int again_rc = 1;
static void call_again(int err, void *result, void *user) {
  free_own_future(err, result, user);
  int64_t ms = 0;
  cxr_call_opts co;
  cxr_call_opts_init(&co);
  co.flags = CXR_CALL_INLINE;
  co.arg_len = sizeof ms;
  cxr_future *g = NULL; /* (not touched: the connection is going) */
  __atomic_store_n(&again_rc, cxr_conn_call_async(closing, M_SLEEP, &ms, &g, &co),
                   __ATOMIC_SEQ_CST);
}

static int do_connect(long ms) {
  if (conn) cxr_conn_close(conn), conn = NULL;
  cxr_conn_opts o;
  cxr_conn_opts_init(&o);
  o.connect_timeout_ns = ms * 1000000;
  return cxr_connect(&conn, target, &o);
}

/* Builds the message, calls, checks the answer. 0, a CXR_E* code, or 1 (wrong answer). */
static int graph(int64_t n, char *what, size_t wl, void **addr) {
  cxr_heap *h = cxr_conn_heap(conn);
  int64_t cap = n + 2;
  cxr_range *rg = malloc((size_t)(2 * cap) * sizeof *rg);
  node **nodes = malloc((size_t)cap * sizeof *nodes);
  graph_args *ga = cxr_heap_alloc(h, sizeof *ga);
  char *name = cxr_heap_alloc(h, 32);
  if (!rg || !nodes || !ga || !name) return CXR_ENOMEM;
  snprintf(name, 32, "client-%d", (int)getpid());
  *ga = (graph_args){.n = n, .name = name};
  size_t nr = 0;
  rg[nr++] = (cxr_range){ga, sizeof *ga};
  rg[nr++] = (cxr_range){name, 32};
  node **link = &ga->head;
  int64_t sum = 0;
  for (int64_t i = 0; i < n; i++) {
    node *x = cxr_heap_alloc(h, sizeof *x);
    char *l = cxr_heap_alloc(h, 24);
    if (!x || !l) return CXR_ENOMEM;
    *x = (node){.v = i * 7 + 1, .label = l};
    snprintf(l, 24, "L%" PRId64, x->v);
    sum += x->v;
    *link = x;
    link = &x->next;
    nodes[i] = x;
    rg[nr++] = (cxr_range){x, sizeof *x};
    rg[nr++] = (cxr_range){l, 24};
  }
  cxr_call_opts o;
  cxr_call_opts_init(&o);
  o.ranges = rg;
  o.nranges = nr;
  o.deadline_ns = 5000000000;
  graph_res *res = NULL;
  int rc = cxr_conn_call(conn, M_GRAPH, ga, (void **)&res, &o);
  *addr = ga;
  if (rc == 0) {
    const char *bad = NULL;
    if (res == NULL) bad = "no result";
    else if (res->sum != sum || res->n != n) bad = "sum";
    else if (res->echo != ga) bad = "arguments not at the same address";
    else if (strcmp(res->name, name) != 0) bad = "name";
    else {
      node *y = res->rev;
      for (int64_t i = n - 1; i >= 0 && !bad; i--, y = y->next) {
        if (y == NULL || y->v != nodes[i]->v) bad = "reversed list";
        else if (y->label != nodes[i]->label) bad = "label pointer";
      }
      if (!bad && y != NULL) bad = "list too long";
    }
    if (bad) {
      snprintf(what, wl, "%s", bad);
      rc = 1;
    }
    cxr_conn_free(conn, res);
  }
  for (int64_t i = 0; i < n; i++) {
    cxr_heap_free(h, nodes[i]->label);
    cxr_heap_free(h, nodes[i]);
  }
  cxr_heap_free(h, name);
  cxr_heap_free(h, ga);
  free(rg);
  free(nodes);
  return rc;
}

/* Two calls that sleep 1 s, to occupy the server's two workers. Each has its own argument
 * block: concurrent calls whose ranges overlap would land in the server's one replica of
 * them at once. */
typedef struct sleepers {
  int64_t *ms[2];
  cxr_future *f[2];
} sleepers;

/* Starts them: 0, or the first failure (sleepers_end cleans up either way). */
static int sleepers_start(sleepers *s) {
  cxr_call_opts so;
  cxr_call_opts_init(&so);
  so.deadline_ns = 10000000000;
  so.arg_len = sizeof(int64_t);
  int rc = 0;
  for (int i = 0; i < 2; i++) {
    s->f[i] = NULL;
    s->ms[i] = cxr_heap_alloc(cxr_conn_heap(conn), sizeof(int64_t));
    if (s->ms[i] == NULL && rc == 0) rc = CXR_ENOMEM;
  }
  for (int i = 0; rc == 0 && i < 2; i++) {
    *s->ms[i] = 1000;
    rc = cxr_conn_call_async(conn, M_SLEEP, s->ms[i], &s->f[i], &so);
  }
  return rc;
}

/* Waits for them (when rc, what went before, is 0) and frees them: rc, or their failure. */
static int sleepers_end(sleepers *s, int rc) {
  for (int i = 0; i < 2; i++) {
    if (s->f[i] && rc == 0) rc = cxr_future_wait(s->f[i], 0, NULL);
    cxr_future_free(s->f[i]);
  }
  for (int i = 0; i < 2; i++) cxr_heap_free(cxr_conn_heap(conn), s->ms[i]);
  return rc;
}

/* The server's spin counts (started, stopped): 0, or the call's error. */
static int spin_counts_now(int64_t out[2]) {
  int64_t *counts = NULL;
  int rc = cxr_conn_call(conn, M_SPIN_COUNTS, NULL, (void **)&counts, NULL);
  if (rc == 0 && counts == NULL) rc = CXR_EPROTO;
  if (rc == 0) memcpy(out, counts, 2 * sizeof *out);
  cxr_conn_free(conn, counts);
  return rc;
}

/* Options of a spin call (its inline argument: how many ms to spin), deadline in ms. */
static cxr_call_opts spin_opts(int64_t deadline_ms) {
  cxr_call_opts po;
  cxr_call_opts_init(&po);
  po.deadline_ns = deadline_ms * 1000000;
  po.flags = CXR_CALL_INLINE;
  po.arg_len = sizeof(int64_t);
  return po;
}

static int client(const char *t) {
  snprintf(target, sizeof target, "%s", t);
  printf("READY\n");
  fflush(stdout);
  char line[256], what[64];
  long a, b;
  int nf; /* fields sscanf filled */
  while (fgets(line, sizeof line, stdin)) {
    if (sscanf(line, "connect %ld", &a) == 1) {
      int64_t t0 = cxr_now_ns();
      int rc = do_connect(a);
      if (rc) printf("err %d %ld\n", rc, (long)((cxr_now_ns() - t0) / 1000000));
      else printf("ok\n");
    } else if (sscanf(line, "cycles %ld", &a) == 1) {
      int rc = 0;
      for (long i = 0; i < a && rc == 0; i++) {
        if ((rc = do_connect(5000)) != 0) break;
        rc = cxr_conn_call(conn, M_NOOP, NULL, NULL, NULL);
        cxr_conn_close(conn);
        conn = NULL;
      }
      if (rc) printf("err %d\n", rc);
      else printf("ok\n");
    } else if (sscanf(line, "giveup %ld %ld", &a, &b) == 2) {
      long gave_up = 0, made = 0;
      int rc = 0;
      for (long i = 0; i < a && rc == 0; i++) {
        cxr_conn *g = NULL;
        cxr_conn_opts o;
        cxr_conn_opts_init(&o);
        o.connect_timeout_ns = b * 1000;
        rc = cxr_connect(&g, target, &o);
        if (rc == CXR_ETIMEDOUT) gave_up++, rc = 0;
        else if (rc == 0) made++, cxr_conn_close(g);
      }
      if (rc) printf("err %d\n", rc);
      else printf("ok %ld %ld\n", gave_up, made);
    } else if (conn == NULL) {
      printf("err %d\n", CXR_ENOTCONN);
    } else if (sscanf(line, "graph %ld", &a) == 1) {
      void *addr = NULL;
      int rc = graph(a, what, sizeof what, &addr);
      if (rc == 1) printf("bad %s\n", what);
      else if (rc) printf("err %d\n", rc);
      else printf("ok %p\n", addr);
    } else if (sscanf(line, "many %ld %ld", &a, &b) == 2) {
      int rc = 0;
      void *addr;
      for (long i = 0; i < a && rc == 0; i++) rc = graph(b, what, sizeof what, &addr);
      if (rc == 1) printf("bad %s\n", what);
      else if (rc) printf("err %d\n", rc);
      else printf("ok\n");
    } else if (strncmp(line, "forkexit", 8) == 0) {
      fflush(stdout);
      pid_t child = fork();
      if (child == 0) {
        forked_child = 1;
        exit(0); /* as a child that is done returns from main */
      }
      int st = -1;
      if (child > 0) waitpid(child, &st, 0);
      printf("ok %d\n", st);
    } else if (strncmp(line, "forkcall", 8) == 0) {
      fflush(stdout);
      pid_t child = fork();
      if (child == 0) {
        forked_child = 1;
        int step = cxr_conn_call(conn, M_NOOP, NULL, NULL, NULL) != CXR_ECLOSED ? 1 : 0;
        if (step == 0 && do_connect(5000) != CXR_ECLOSED) step = 2;
        exit(step);
      }
      int st = -1;
      if (child > 0) waitpid(child, &st, 0);
      printf("ok %d\n", st);
    } else if (sscanf(line, "failgraph %ld", &a) == 1) {
      int64_t used[2] = {0, 0}, *u = NULL;
      int rc = 0;
      for (int k = 0; k < 2 && rc == 0; k++) {
        if (k == 1)
          for (long i = 0; i < a && rc == 0; i++) {
            void *res = (void *)1;
            int e = cxr_conn_call(conn, M_FAIL_GRAPH, NULL, &res, NULL);
            if (e != CXR_EPERM || res != NULL) rc = e ? e : 1;
          }
        if (rc == 0 && (rc = cxr_conn_call(conn, M_HEAP_USED, NULL, (void **)&u, NULL)) == 0) {
          used[k] = *u;
          cxr_conn_free(conn, u); /* the release rides on the next call */
        }
      }
      if (rc) printf("err %d\n", rc);
      else printf("ok %" PRId64 " %" PRId64 "\n", used[0], used[1]);
    } else if (sscanf(line, "rootlast %ld", &a) == 1) {
      /* A block of N MiB, then the root (args) above it; both shipped as ranges. */
      cxr_heap *hh = cxr_conn_heap(conn);
      char *bigb = cxr_heap_alloc(hh, (size_t)a << 20);
      char *rootb = cxr_heap_alloc(hh, 1 << 20);
      int rc = bigb && rootb ? 0 : CXR_ENOMEM;
      if (rc == 0) {
        cxr_range rg[2] = {{rootb, 16}, {bigb, (size_t)a << 20}};
        cxr_call_opts o;
        cxr_call_opts_init(&o);
        o.ranges = rg;
        o.nranges = 2;
        rc = cxr_conn_call(conn, M_NOOP, rootb, NULL, &o);
      }
      char *hb = (char *)cxr_heap_base(hh);
      if (rc) printf("err %d %ld %ld\n", rc, (long)(bigb - hb), (long)(rootb - hb));
      else printf("ok %ld %ld\n", (long)(bigb - hb), (long)(rootb - hb));
      if (bigb) cxr_heap_free(hh, bigb);
      if (rootb) cxr_heap_free(hh, rootb);
    } else if (sscanf(line, "noop %ld", &a) == 1) {
      cxr_call_opts o;
      cxr_call_opts_init(&o);
      o.deadline_ns = a * 1000000;
      int rc = cxr_conn_call(conn, M_NOOP, NULL, NULL, &o);
      if (rc) printf("err %d\n", rc);
      else printf("ok\n");
    } else if (sscanf(line, "slow %ld %ld", &a, &b) == 2) {
      int64_t *ms = cxr_heap_alloc(cxr_conn_heap(conn), sizeof *ms);
      *ms = a;
      cxr_call_opts o;
      cxr_call_opts_init(&o);
      o.deadline_ns = b * 1000000;
      o.arg_len = sizeof *ms;
      cxr_future *f;
      int64_t t0 = cxr_now_ns();
      int rc = cxr_conn_call_async(conn, M_SLEEP, ms, &f, &o);
      printf("sent\n");
      fflush(stdout);
      if (rc == 0) {
        rc = cxr_future_wait(f, 0, NULL);
        cxr_future_free(f);
      }
      if (rc) printf("err %d %ld\n", rc, (long)((cxr_now_ns() - t0) / 1000000));
      else printf("ok\n");
    } else if (sscanf(line, "latesend %ld %ld", &a, &b) == 2 && a > 0 && a <= 48) {
      /* A spin call whose argument ships a MiB block (the first 8 bytes: spin 10 ms), deadline
       * b ms: against a stopped server, its send cannot finish in time. */
      size_t len = (size_t)a << 20;
      int64_t *blk = cxr_heap_alloc(cxr_conn_heap(conn), len);
      int rc = blk ? 0 : CXR_ENOMEM;
      if (blk) {
        memset(blk, 0, len);
        blk[0] = 10;
        cxr_range rg = {blk, len};
        cxr_call_opts o;
        cxr_call_opts_init(&o);
        o.deadline_ns = b * 1000000;
        o.arg_len = sizeof *blk;
        o.ranges = &rg;
        o.nranges = 1;
        rc = cxr_conn_call(conn, M_SPIN, blk, NULL, &o);
        cxr_heap_free(cxr_conn_heap(conn), blk);
      }
      if (rc) printf("err %d\n", rc);
      else printf("ok\n");
    } else if (sscanf(line, "refused %ld %ld", &a, &b) == 2 && a > 0 && b > 0 && b <= 16) {
      /* a calls whose argument ships a b MiB block, more than the server takes (its
       * CXRPC_RDMA_MSG_MAX): each should end CXR_EFULL; then a no-op call. */
      size_t len = (size_t)b << 20;
      int64_t *blk = cxr_heap_alloc(cxr_conn_heap(conn), len);
      long refused = 0;
      int rc = blk ? 0 : CXR_ENOMEM;
      if (blk) {
        memset(blk, 0, len);
        cxr_range rg = {blk, len};
        cxr_call_opts o;
        cxr_call_opts_init(&o);
        o.deadline_ns = 5000000000;
        o.arg_len = sizeof *blk;
        o.ranges = &rg;
        o.nranges = 1;
        for (long i = 0; i < a; i++)
          refused += cxr_conn_call(conn, M_SPIN, blk, NULL, &o) == CXR_EFULL;
        cxr_heap_free(cxr_conn_heap(conn), blk);
        rc = cxr_conn_call(conn, M_NOOP, NULL, NULL, NULL);
      }
      if (rc) printf("err %d %ld\n", rc, refused);
      else printf("ok %ld\n", refused);
    } else if (strncmp(line, "spincounts", 10) == 0) {
      int64_t k[2];
      int rc = spin_counts_now(k);
      if (rc) printf("err %d\n", rc);
      else printf("ok %lld %lld\n", (long long)k[0], (long long)k[1]);
    } else if (sscanf(line, "spin %ld %ld", &a, &b) == 2) {
      int64_t ms = a;
      cxr_call_opts o;
      cxr_call_opts_init(&o);
      o.deadline_ns = 30000000000;
      o.flags = CXR_CALL_INLINE;
      o.arg_len = sizeof ms;
      cxr_future *f;
      int64_t k[2] = {0, 0};
      int rc = cxr_conn_call_async(conn, M_SPIN, &ms, &f, &o);
      if (rc == 0) {
        usleep((useconds_t)b * 1000);
        /* Cancelled once it runs (up to ~10 s for a slow start): a cancel that overtook its
         * start would skip it, which is another case. */
        for (int i = 0; i < 1000 && (rc = spin_counts_now(k)) == 0 && k[0] < 1; i++)
          usleep(10000);
        if (rc == 0) rc = cxr_future_cancel(f);
        cxr_future_free(f);
      }
      /* up to ~10 s for the handler to stop */
      for (int i = 0; rc == 0 && i < 1000 && (rc = spin_counts_now(k)) == 0 && k[1] < 1; i++)
        usleep(10000);
      if (rc) printf("err %d\n", rc);
      else if (k[1] < 1) printf("err %d\n", CXR_ETIMEDOUT);
      else printf("ok %lld %lld\n", (long long)k[0], (long long)k[1]);
    } else if (sscanf(line, "queued %ld", &a) == 1) {
      int64_t spin_ms = 5000, *counts = NULL;
      cxr_future *spin = NULL;
      sleepers sl;
      cxr_call_opts po = spin_opts(a);
      int rc = sleepers_start(&sl);
      if (rc == 0) rc = cxr_conn_call_async(conn, M_SPIN, &spin_ms, &spin, &po);
      int spun = rc == 0 ? cxr_future_wait(spin, 0, NULL) : rc;
      cxr_future_free(spin);
      rc = sleepers_end(&sl, rc);
      usleep((useconds_t)(a + 300) * 1000); /* a spin that did run has started by now */
      if (rc == 0) rc = cxr_conn_call(conn, M_SPIN_COUNTS, NULL, (void **)&counts, NULL);
      if (rc) printf("err %d\n", rc);
      else printf("ok %d %lld\n", spun, counts ? (long long)counts[0] : -1LL);
      cxr_conn_free(conn, counts);
    } else if (sscanf(line, "cancelmany %ld %ld", &a, &b) == 2 && a > 0 && a <= 200) {
      int64_t spin_ms = b, *before = NULL, *after = NULL;
      cxr_future *sp[200];
      sleepers sl = {{NULL, NULL}, {NULL, NULL}};
      cxr_call_opts po = spin_opts(30000);
      int rc = cxr_conn_call(conn, M_SPIN_COUNTS, NULL, (void **)&before, NULL);
      if (rc == 0) rc = sleepers_start(&sl);
      int n = 0;
      for (; rc == 0 && n < a; n++)
        if ((rc = cxr_conn_call_async(conn, M_SPIN, &spin_ms, &sp[n], &po)) != 0) break;
      for (int i = 0; i < n; i++) { /* at once, while the workers sleep */
        cxr_future_cancel(sp[i]);
        cxr_future_free(sp[i]);
      }
      rc = sleepers_end(&sl, rc);
      usleep((useconds_t)(a * b / 2 + 500) * 1000); /* what did run has started by now */
      if (rc == 0) rc = cxr_conn_call(conn, M_SPIN_COUNTS, NULL, (void **)&after, NULL);
      if (rc) printf("err %d\n", rc);
      else if (before == NULL || after == NULL) printf("err %d\n", CXR_EPROTO);
      else printf("ok %lld\n", (long long)(after[0] - before[0]));
      cxr_conn_free(conn, before);
      cxr_conn_free(conn, after);
    } else if (sscanf(line, "fill %ld %ld", &a, &b) == 2) {
      fill_args fa = {a, b};
      cxr_call_opts co;
      cxr_call_opts_init(&co);
      co.flags = CXR_CALL_INLINE;
      co.arg_len = sizeof fa;
      unsigned char *res = NULL;
      int rc = cxr_conn_call(conn, M_FILL, &fa, (void **)&res, &co);
      long bad = -1;
      for (long i = 0; rc == 0 && res != NULL && i < a && bad < 0; i++)
        if (res[i] != (unsigned char)b) bad = i;
      if (rc) printf("err %d\n", rc);
      else if (res == NULL) printf("err %d\n", CXR_EPROTO);
      else if (bad >= 0) printf("bad %ld\n", bad);
      else printf("ok %p %p\n", (void *)res, cxr_conn_result_range(conn).p);
      cxr_conn_free(conn, res);
    } else if (sscanf(line, "argsback %ld", &a) == 1) {
      unsigned char *b = a > 0 ? cxr_heap_alloc(cxr_conn_heap(conn), (size_t)a) : NULL;
      void **res = NULL;
      int rc = b ? 0 : CXR_ENOMEM;
      for (long i = 0; i < a && b; i++) b[i] = (unsigned char)(i % 251);
      cxr_call_opts co;
      cxr_call_opts_init(&co);
      co.arg_len = (size_t)a;
      if (rc == 0) rc = cxr_conn_call(conn, M_ARGS_BACK, b, (void **)&res, &co);
      long bad = -1;
      for (long i = 0; rc == 0 && i < a && bad < 0; i++)
        if (b[i] != (unsigned char)(i % 251 + 1)) bad = i;
      if (rc) printf("err %d\n", rc);
      else if (res == NULL || *res != (void *)b) printf("bad result\n");
      else if (bad >= 0) printf("bad byte %ld\n", bad);
      else printf("ok\n");
      cxr_conn_free(conn, res);
      if (b) cxr_heap_free(cxr_conn_heap(conn), b);
    } else if ((nf = sscanf(line, "cbclose %ld %ld", &a, &b)) >= 1) {
      int64_t ms = a;
      bool again = nf == 2 && b == 1;
      closing = conn;
      cxr_call_opts co;
      cxr_call_opts_init(&co);
      co.flags = CXR_CALL_INLINE;
      co.arg_len = sizeof ms;
      cxr_future *f = NULL;
      int rc = cxr_conn_call_async(conn, M_SLEEP, &ms, &f, &co);
      if (rc == 0) rc = cxr_future_then(f, again ? call_again : free_own_future, f);
      usleep(100000);
      int64_t t0 = cxr_now_ns();
      cxr_conn_close(conn);
      conn = NULL;
      long took = (long)((cxr_now_ns() - t0) / 1000000);
      if (rc) printf("err %d\n", rc);
      else if (again) printf("ok %d\n", __atomic_load_n(&again_rc, __ATOMIC_SEQ_CST));
      else printf("ok %ld %d\n", took, __atomic_load_n(&callbacks_run, __ATOMIC_SEQ_CST));
    } else if (!strncmp(line, "whoami", 6)) {
      int32_t *pid = NULL;
      int rc = cxr_conn_call(conn, M_WHOAMI, NULL, (void **)&pid, NULL);
      if (rc) printf("err %d\n", rc);
      else printf("ok %d\n", pid ? *pid : -1);
      cxr_conn_free(conn, pid);
    } else {
      printf("err %d\n", CXR_EINVAL);
    }
    fflush(stdout);
  }
  if (conn) cxr_conn_close(conn);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc == 4 && !strcmp(argv[1], "server")) return server(argv[2], argv[3]);
  if (argc == 3 && !strcmp(argv[1], "client")) return client(argv[2]);
  fprintf(stderr, "usage: remote_peer server NAME LISTEN | client TARGET\n");
  return 2;
}

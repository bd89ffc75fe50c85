/* The README's five-minute tour as a program: a Greeter server in one process, a client in
 * another, one call that passes a pointer to a request built in the connection heap.
 *   bazel run //examples/greet -- ada lovelace      (CXRPC_ROOT picks the pod root)
 *   greet --server CHANNEL: only the server, on CHANNEL; prints "ready", stops at SIGTERM
 *   (tests/rpc:greet_race_test races its handler from a client of its own) */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cxrpc/sandbox.h>

#include "examples/greet/greet.cxr.h"

/* A string of the request, loaded once into *out and checked there. The call is not sealed,
 * so the client can rewrite its request after the skeleton validated it: a field read again
 * could by then point anywhere this server maps (another connection's heap: its bytes were
 * copied into the reply). So each pointer and length is read once, must lie in the call's
 * argument range, and only the copy is used. */
static int load_str(cxr_call *call, const cxr_str *field, cxr_str *out) {
  cxr_str s = {__atomic_load_n(&field->ptr, __ATOMIC_RELAXED),
               __atomic_load_n(&field->len, __ATOMIC_RELAXED)};
  cxr_range ar = cxr_call_arg_range(call);
  if (s.len && cxr_range_check(&ar, s.ptr, s.len, 1)) return CXR_EBADPTR;
  *out = s;
  return 0;
}

static int say(cxr_call *call, const greet_Hello *rq, greet_Reply **rs, void *user) {
  (void)user;
  cxr_heap *h = cxr_call_heap(call);          /* results are built in the call's heap */
  char text[256];
  cxr_str name;
  int rc = load_str(call, &rq->name, &name);
  if (rc) return rc;
  /* at most what fits: a length above INT_MAX would turn %.*s into an unbounded read */
  int n = snprintf(text, sizeof text, "hello, %.*s", (int)(name.len < 200 ? name.len : 200),
                   name.ptr);
  /* the tags array, like each string, loaded once and checked before it is read */
  const cxr_str *tags = __atomic_load_n(&rq->tags.items, __ATOMIC_RELAXED);
  uint64_t ntags = __atomic_load_n(&rq->tags.count, __ATOMIC_RELAXED);
  cxr_range ar = cxr_call_arg_range(call);
  if (ntags && (ntags > ar.len / sizeof *tags ||
                cxr_range_check(&ar, tags, ntags * sizeof *tags, _Alignof(cxr_str))))
    return CXR_EBADPTR;
  for (uint64_t i = 0; i < ntags && n > 0 && (size_t)n < sizeof text; i++) {
    cxr_str tag;
    if ((rc = load_str(call, &tags[i], &tag)) != 0) return rc;
    n += snprintf(text + n, sizeof text - (size_t)n, " [%.*s]",
                  (int)(tag.len < 200 ? tag.len : 200), tag.ptr);
  }
  greet_Reply *r = greet_Reply_new(h);
  if (r == NULL) return CXR_ENOMEM;
  rc = cxr_str_setz(h, &r->text, text);
  if (rc) {
    greet_Reply_free(h, r);
    return rc;
  }
  *rs = r;
  return 0;
}

static int serve(const char *name, int ready_fd) {
  cxr_channel_opts o;
  cxr_channel_opts_init(&o);
  o.untrusted = true;                          /* the skeleton validates every request */
  cxr_channel *ch;
  int rc = cxr_channel_open(&ch, name, &o);
  if (rc) {
    fprintf(stderr, "server: cxr_channel_open: %s\n", cxr_strerror(rc));
    return 1;
  }
  static greet_Greeter_server srv = {.handlers = {.Say = say}};
  if ((rc = greet_Greeter_serve(ch, &srv)) != 0) {
    fprintf(stderr, "server: serve: %s\n", cxr_strerror(rc));
    return 1;
  }
  /* Serve on background threads; this thread waits for SIGTERM, then closes the channel
   * so its files go with it. */
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &term, NULL);
  if ((rc = cxr_channel_start(ch)) != 0) {
    fprintf(stderr, "server: start: %s\n", cxr_strerror(rc));
    return 1;
  }
  if (write(ready_fd, "ready\n", 6) != 6) return 1;
  close(ready_fd);
  int sig;
  sigwait(&term, &sig);
  cxr_channel_stop(ch);
  cxr_channel_close(ch);
  return 0;
}

/* The client's side of the tour: one Say on conn. Returns 0 or the CXR_E* code; main stops
 * the server whatever happened here (an early return must not leave it running). */
static int client(cxr_conn *conn, pid_t server, int argc, char **argv) {
  cxr_heap *h = cxr_conn_heap(conn);
  greet_Hello *rq = greet_Hello_new(h);        /* built in place: never serialized */
  if (rq == NULL) {
    fprintf(stderr, "client: greet_Hello_new: %s\n", cxr_strerror(CXR_ENOMEM));
    return CXR_ENOMEM;
  }
  cxr_str_setz(h, &rq->name, argc > 1 ? argv[1] : "world");
  int ntags = argc > 2 ? argc - 2 : 0;
  if (ntags > 0) {
    CXR_VEC_ALLOC(h, rq->tags, (uint64_t)ntags);
    for (int i = 0; i < ntags && rq->tags.items; i++)
      cxr_str_setz(h, &rq->tags.items[i], argv[2 + i]);
  }
  greet_Reply *rs = NULL;
  cxr_call_opts co;
  cxr_call_opts_init(&co);
  co.deadline_ns = 1000000000;                 /* 1 s */
  int rc = greet_Greeter_Say(conn, rq, &rs, &co);
  if (rc == 0) {
    printf("server (pid %d) answered at %p: %.*s\n", (int)server, (void *)rs,
           (int)rs->text.len, rs->text.ptr);
    greet_Reply_free(h, rs);
  } else {
    fprintf(stderr, "client: Say: %s\n", cxr_strerror(rc));
  }
  greet_Hello_free(h, rq);
  return rc;
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "--server")) return serve(argv[2], 1);
  int p[2];
  if (pipe(p) != 0) return 1;
  pid_t server = fork();
  if (server < 0) return 1;
  if (server == 0) {
    close(p[0]);
    _exit(serve("greet", p[1]));
  }
  close(p[1]);
  char c;
  int st;
  if (read(p[0], &c, 1) != 1) { /* it exited before it was ready: reap it */
    fprintf(stderr, "client: the server did not start\n");
    waitpid(server, &st, 0);
    return 1;
  }

  cxr_conn *conn;
  int rc = cxr_connect(&conn, "greet", NULL);
  if (rc == 0) {
    rc = client(conn, server, argc, argv);
    cxr_conn_close(conn);
  } else {
    fprintf(stderr, "client: cxr_connect: %s\n", cxr_strerror(rc));
  }
  kill(server, SIGTERM);
  waitpid(server, &st, 0);
  return rc == 0 ? 0 : 1;
}

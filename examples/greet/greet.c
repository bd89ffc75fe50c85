/* The README's five-minute tour as a program: a Greeter server in one process, a client in
 * another, one call that passes a pointer to a request built in the connection heap.
 *   bazel run //examples/greet -- ada lovelace      (CXRPC_ROOT picks the pod root) */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "examples/greet/greet.cxr.h"

static int say(cxr_call *call, const greet_Hello *rq, greet_Reply **rs, void *user) {
  (void)user;
  cxr_heap *h = cxr_call_heap(call);          /* results are built in the call's heap */
  char text[256];
  int n = snprintf(text, sizeof text, "hello, %.*s", (int)rq->name.len, rq->name.ptr);
  for (uint64_t i = 0; i < rq->tags.count && n > 0 && (size_t)n < sizeof text; i++)
    n += snprintf(text + n, sizeof text - (size_t)n, " [%.*s]", (int)rq->tags.items[i].len,
                  rq->tags.items[i].ptr);
  greet_Reply *r = greet_Reply_new(h);
  if (r == NULL) return CXR_ENOMEM;
  int rc = cxr_str_setz(h, &r->text, text);
  if (rc) {
    greet_Reply_free(h, r);
    return rc;
  }
  *rs = r;
  return 0;
}

static int serve(int ready_fd) {
  cxr_channel_opts o;
  cxr_channel_opts_init(&o);
  o.untrusted = true;                          /* the skeleton validates every request */
  cxr_channel *ch;
  int rc = cxr_channel_open(&ch, "greet", &o);
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
  if (write(ready_fd, "r", 1) != 1) return 1;
  close(ready_fd);
  int sig;
  sigwait(&term, &sig);
  cxr_channel_stop(ch);
  cxr_channel_close(ch);
  return 0;
}

int main(int argc, char **argv) {
  int p[2];
  if (pipe(p) != 0) return 1;
  pid_t server = fork();
  if (server == 0) {
    close(p[0]);
    _exit(serve(p[1]));
  }
  close(p[1]);
  char c;
  if (read(p[0], &c, 1) != 1) {
    fprintf(stderr, "client: the server did not start\n");
    return 1;
  }

  cxr_conn *conn;
  int rc = cxr_connect(&conn, "greet", NULL);
  if (rc == 0) {
    cxr_heap *h = cxr_conn_heap(conn);
    greet_Hello *rq = greet_Hello_new(h);      /* built in place: never serialized */
    if (rq == NULL) return 1;
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
    co.deadline_ns = 1000000000;               /* 1 s */
    rc = greet_Greeter_Say(conn, rq, &rs, &co);
    if (rc == 0) {
      printf("server (pid %d) answered at %p: %.*s\n", (int)server, (void *)rs,
             (int)rs->text.len, rs->text.ptr);
      greet_Reply_free(h, rs);
    } else {
      fprintf(stderr, "client: Say: %s\n", cxr_strerror(rc));
    }
    greet_Hello_free(h, rq);
    cxr_conn_close(conn);
  } else {
    fprintf(stderr, "client: cxr_connect: %s\n", cxr_strerror(rc));
  }
  kill(server, SIGTERM);
  int st;
  waitpid(server, &st, 0);
  return rc == 0 ? 0 : 1;
}

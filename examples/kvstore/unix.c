/* kv over a Unix stream socket: one thread per connection, blocking reads and writes. It
 * serves the same store as the cxrpc server so kv_load --unix measures the transport. */
#include "examples/kvstore/unix.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cxrpc/base.h>

struct kv_unix {
  int fd;
  store *s;
  char path[108];
  pthread_t accept_thread;
};

typedef struct conn_arg {
  int fd;
  store *s;
} conn_arg;

static int read_full(int fd, void *buf, size_t n) {
  for (size_t got = 0; got < n;) {
    ssize_t r = read(fd, (char *)buf + got, n - got);
    if (r <= 0) {
      if (r < 0 && errno == EINTR) continue;
      return -1;
    }
    got += (size_t)r;
  }
  return 0;
}

static int write_full(int fd, const void *buf, size_t n) {
  for (size_t put = 0; put < n;) {
    ssize_t r = write(fd, (const char *)buf + put, n - put);
    if (r <= 0) {
      if (r < 0 && errno == EINTR) continue;
      return -1;
    }
    put += (size_t)r;
  }
  return 0;
}

static void *malloc_ctx(void *ctx, size_t n) {
  (void)ctx;
  return malloc(n);
}

static void *serve_conn(void *arg) {
  conn_arg a = *(conn_arg *)arg;
  free(arg);
  char key[KV_KEY_MAX];
  char *value = malloc(KV_VALUE_MAX);
  kv_wire_req rq;
  while (value != NULL && read_full(a.fd, &rq, sizeof rq) == 0) {
    if (rq.key_len == 0 || rq.key_len > KV_KEY_MAX || rq.value_len > KV_VALUE_MAX) break;
    if (read_full(a.fd, key, rq.key_len) != 0) break;
    if (rq.value_len && read_full(a.fd, value, rq.value_len) != 0) break;
    kv_wire_resp rs = {0, 0, 0};
    kv_value *v = NULL;
    if (rq.op == KV_GET) rs.status = store_get(a.s, key, rq.key_len, malloc_ctx, NULL, &v);
    else if (rq.op == KV_SET) rs.status = store_set(a.s, key, rq.key_len, value, rq.value_len);
    else if (rq.op == KV_DELETE) rs.status = store_del(a.s, key, rq.key_len);
    else rs.status = CXR_ENOMETHOD;
    if (v) {
      rs.found = 1;
      rs.value_len = v->len;
    }
    int bad = write_full(a.fd, &rs, sizeof rs) != 0 || (v && v->len && write_full(a.fd, v->data, v->len) != 0);
    free(v);
    if (bad) break;
  }
  free(value);
  close(a.fd);
  return NULL;
}

static void *accept_loop(void *arg) {
  kv_unix *u = arg;
  for (;;) {
    int fd = accept(u->fd, NULL, NULL);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return NULL; /* the listening socket was shut down */
    }
    conn_arg *a = malloc(sizeof *a);
    pthread_t t;
    if (a == NULL) {
      close(fd);
      continue;
    }
    a->fd = fd;
    a->s = u->s;
    if (pthread_create(&t, NULL, serve_conn, a) != 0) {
      close(fd);
      free(a);
      continue;
    }
    pthread_detach(t);
  }
}

int kv_unix_start(kv_unix **out, const char *path, store *s) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof sa.sun_path) return CXR_ENAMETOOLONG;
  kv_unix *u = calloc(1, sizeof *u);
  if (u == NULL) return CXR_ENOMEM;
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  snprintf(u->path, sizeof u->path, "%s", path);
  u->s = s;
  u->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  unlink(path);
  if (u->fd < 0 || bind(u->fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(u->fd, 64) != 0 ||
      pthread_create(&u->accept_thread, NULL, accept_loop, u) != 0) {
    if (u->fd >= 0) close(u->fd);
    free(u);
    return CXR_EIO;
  }
  *out = u;
  return 0;
}

void kv_unix_stop(kv_unix *u) {
  if (u == NULL) return;
  shutdown(u->fd, SHUT_RDWR);
  pthread_join(u->accept_thread, NULL);
  close(u->fd);
  unlink(u->path);
  free(u);
}

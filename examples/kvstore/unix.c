/* kv over a Unix stream socket: one thread per connection (at most 256 at once), blocking
 * reads and writes. It serves the same store as the cxrpc server so kv_load --unix measures
 * the transport. Stop ends open connections and joins every thread. */
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

#define MAX_CLIENTS 256

struct kv_unix {
  int fd;
  store *s;
  char path[108];
  pthread_t accept_thread;
  pthread_mutex_t lock;      /* guards the client table */
  int client_fd[MAX_CLIENTS];
  pthread_t client_thread[MAX_CLIENTS];
  bool used[MAX_CLIENTS];
  bool done[MAX_CLIENTS];    /* the thread ended: join it, reuse the slot */
};

typedef struct conn_arg {
  int fd;
  store *s;
  kv_unix *u;
  int slot;
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
    void *v = NULL;
    uint32_t vlen = 0;
    if (rq.op == KV_GET) rs.status = store_get(a.s, key, rq.key_len, malloc_ctx, NULL, &v, &vlen);
    else if (rq.op == KV_SET) rs.status = store_set(a.s, key, rq.key_len, value, rq.value_len);
    else if (rq.op == KV_DELETE) rs.status = store_del(a.s, key, rq.key_len);
    else rs.status = CXR_ENOMETHOD;
    if (v) {
      rs.found = 1;
      rs.value_len = vlen;
    }
    int bad = write_full(a.fd, &rs, sizeof rs) != 0 || (v && vlen && write_full(a.fd, v, vlen) != 0);
    free(v);
    if (bad) break;
  }
  free(value);
  pthread_mutex_lock(&a.u->lock);
  close(a.fd); /* under the lock: stop never shuts down a number reused meanwhile */
  a.u->done[a.slot] = true;
  pthread_mutex_unlock(&a.u->lock);
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
    pthread_mutex_lock(&u->lock);
    for (int i = 0; i < MAX_CLIENTS; i++) /* reap connections that ended */
      if (u->used[i] && u->done[i]) {
        pthread_join(u->client_thread[i], NULL);
        u->used[i] = u->done[i] = false;
      }
    int slot = -1;
    for (int i = 0; i < MAX_CLIENTS && slot < 0; i++)
      if (!u->used[i]) slot = i;
    if (a == NULL || slot < 0) {
      pthread_mutex_unlock(&u->lock);
      close(fd);
      free(a);
      continue;
    }
    a->fd = fd;
    a->s = u->s;
    a->u = u;
    a->slot = slot;
    if (pthread_create(&u->client_thread[slot], NULL, serve_conn, a) != 0) {
      pthread_mutex_unlock(&u->lock);
      close(fd);
      free(a);
      continue;
    }
    /* The slot stays used until stop joins the thread (fds close in serve_conn). */
    u->client_fd[slot] = fd;
    u->used[slot] = true;
    pthread_mutex_unlock(&u->lock);
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
  pthread_mutex_init(&u->lock, NULL);
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
  /* End the client connections still open and wait for their threads. */
  pthread_mutex_lock(&u->lock);
  for (int i = 0; i < MAX_CLIENTS; i++)
    if (u->used[i] && !u->done[i]) shutdown(u->client_fd[i], SHUT_RDWR);
  pthread_mutex_unlock(&u->lock);
  for (int i = 0; i < MAX_CLIENTS; i++)
    if (u->used[i]) pthread_join(u->client_thread[i], NULL);
  pthread_mutex_destroy(&u->lock);
  free(u);
}

/* The cxrpcd wire protocol: fixed-size messages on SOCK_SEQPACKET, at most one fd each. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cxrpc/shm.h>

#include "sandbox/internal.h"
#include "shm/env.h"
#include "shm/log.h"

int cxr__msg_send(int sock, const cxr__cxrpcd_msg *m, int fd) {
  if (sock < 0 || !m) return CXR_EINVAL;
  struct iovec iov = {.iov_base = (void *)m, .iov_len = sizeof *m};
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } u;
  memset(&u, 0, sizeof u);
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
  if (fd >= 0) {
    mh.msg_control = u.buf;
    mh.msg_controllen = sizeof u.buf;
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
  }
  ssize_t n;
  do n = sendmsg(sock, &mh, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  if (n != (ssize_t)sizeof *m) return n < 0 ? cxr__from_errno(errno) : CXR_EIO;
  return 0;
}

int cxr__msg_recv(int sock, cxr__cxrpcd_msg *m, int *fd, int64_t timeout_ns) {
  if (sock < 0 || !m) return CXR_EINVAL;
  if (fd) *fd = -1;
  if (timeout_ns >= 0) {
    struct pollfd p = {.fd = sock, .events = POLLIN};
    int ms = (int)(timeout_ns / 1000000) + 1, r;
    do r = poll(&p, 1, ms);
    while (r < 0 && errno == EINTR);
    if (r == 0) return CXR_ETIMEDOUT;
    if (r < 0) return cxr__from_errno(errno);
  }
  struct iovec iov = {.iov_base = m, .iov_len = sizeof *m};
  /* Room for several descriptors: a message carries at most one, but the kernel installs as
   * many as fit the buffer (two fit CMSG_SPACE(sizeof(int))), and every one installed must
   * be closed unless it is the one we keep (those that do not fit, it closes itself). */
  enum { FDS_MAX = 8 };
  union {
    char buf[CMSG_SPACE(FDS_MAX * sizeof(int))];
    struct cmsghdr align;
  } u;
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                      .msg_controllen = sizeof u.buf};
  ssize_t n;
  do n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (n == 0) return CXR_EPEERDEAD;
  if (n < 0) return cxr__from_errno(errno);
  int fds[FDS_MAX], nfds = 0;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS || c->cmsg_len < CMSG_LEN(0))
      continue;
    size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t j = 0; j < k && nfds < FDS_MAX; j++)
      memcpy(&fds[nfds++], CMSG_DATA(c) + j * sizeof(int), sizeof(int));
  }
  int got = nfds == 1 ? fds[0] : -1;
  /* MSG_TRUNC: a longer message was cut to our size; whatever it was, it is not ours. */
  if (n != (ssize_t)sizeof *m || m->magic != CXR__CXRPCD_MAGIC ||
      (mh.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) || nfds > 1) {
    for (int j = 0; j < nfds; j++) close(fds[j]);
    return CXR_EPROTO;
  }
  if (fd) *fd = got;
  else if (got >= 0) close(got);
  return 0;
}

int cxr__cxrpcd_path(const char *explicit_path, char *out, size_t cap) {
  if (!out || cap == 0) return CXR_EINVAL;
  const char *e = getenv("CXRPC_CXRPCD");
  int n;
  if (explicit_path && *explicit_path) {
    n = snprintf(out, cap, "%s", explicit_path);
  } else if (e && *e) {
    n = snprintf(out, cap, "%s", e);
  } else {
    /* the root the process runs with (cxr_init_opts.root wins over $CXRPC_ROOT) */
    const char *root = cxr_root();
    if (!root) return cxr_last_error();
    n = snprintf(out, cap, "%s/cxrpcd.sock", root);
  }
  if (n < 0 || (size_t)n >= cap || (size_t)n >= sizeof(((struct sockaddr_un *)0)->sun_path))
    return CXR_ENAMETOOLONG;
  return 0;
}

/* See internal.h. */
int cxr__connect_within(int s, const struct sockaddr_un *a, int64_t wait_ns) {
  if (wait_ns < 1000000) wait_ns = 1000000;
  struct timeval tv = {.tv_sec = wait_ns / 1000000000, .tv_usec = wait_ns % 1000000000 / 1000};
  if (setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0) return errno;
  int rc = connect(s, (const struct sockaddr *)a, sizeof *a) == 0 ? 0 : errno;
  struct timeval none = {0, 0}; /* sends as before: blocking, unbounded */
  if (rc == 0 && setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof none) != 0) rc = errno;
  return rc;
}

/* Whether the listener on s may be our cxrpcd: 0, or CXR_EPERM (logged). Whoever owns the
 * socket's directory can unlink cxrpcd's socket and bind one of its own there; a server
 * would then hand it its seal tables (REGISTER) and believe its clients enforced, and
 * `cxrpcd run` its program's seccomp listener (ATTACH). So the listener's uid (SO_PEERCRED:
 * the uid that called listen) must be root, our own, or $CXRPC_CXRPCD_UID. */
static int check_listener(int s, const char *path) {
  struct ucred cr;
  socklen_t len = sizeof cr;
  if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0) return cxr__from_errno(errno);
  if (cr.uid == 0 || cr.uid == geteuid()) return 0;
  const char *e = getenv("CXRPC_CXRPCD_UID");
  if (e && *e) {
    uint64_t v; /* refused, not defaulted: it widens whom we trust */
    if (cxr__parse_u64(e, false, &v) != 0 || v != (uid_t)v) {
      CXR_ERR("CXRPC_CXRPCD_UID=%s: expected a uid", e);
      return CXR_EINVAL;
    }
    if (cr.uid == (uid_t)v) return 0;
  }
  CXR_ERR("cxrpcd at %s listens as uid %u, not root, ours (%u) or $CXRPC_CXRPCD_UID:"
          " refused (whoever owns its directory can put a socket there)", path,
          (unsigned)cr.uid, (unsigned)geteuid());
  return CXR_EPERM;
}

/* Waits for the socket to appear and answer until timeout_ns has passed, and for room in
 * its queue as long (at least 2 s when timeout_ns is 0: "do not wait for it to start").
 * A listener of an untrusted uid is refused at once (check_listener). */
int cxr__cxrpcd_connect(const char *path, int64_t timeout_ns) {
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  if (!path || strlen(path) >= sizeof a.sun_path) return CXR_EINVAL;
  strcpy(a.sun_path, path);
  int64_t deadline = cxr_now_ns() + timeout_ns;
  for (;;) {
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (s < 0) return cxr__from_errno(errno);
    int64_t left = deadline - cxr_now_ns();
    int e = cxr__connect_within(s, &a, timeout_ns > 0 ? left : 2000000000ll);
    if (e == 0) {
      int rc = check_listener(s, path);
      if (rc != 0) close(s);
      return rc != 0 ? rc : s;
    }
    close(s);
    if (e == EAGAIN) {
      CXR_WARN("cxrpcd at %s accepts no connection (its queue stayed full)", path);
      return CXR_ETIMEDOUT;
    }
    if ((e != ENOENT && e != ECONNREFUSED && e != EINTR) || cxr_now_ns() >= deadline) {
      CXR_DEBUG("cxrpcd at %s: %s", path, strerror(e));
      return CXR_ENOTCONN;
    }
    usleep(2000);
  }
}

/* Error strings, the per-thread last error, the clock and the logger. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "shm/log.h"

static const char *const messages[] = {
    [0] = "success",
    [-CXR_EINVAL] = "invalid argument",
    [-CXR_ENOMEM] = "out of memory",
    [-CXR_ENOENT] = "no such heap, channel, file or host",
    [-CXR_EEXIST] = "name already in use",
    [-CXR_ENAMETOOLONG] = "name too long",
    [-CXR_EACCES] = "permission denied",
    [-CXR_EBADMAGIC] = "not a cxrpc heap (bad magic)",
    [-CXR_EVERSION] = "unsupported heap layout version",
    [-CXR_ETRUNCATED] = "heap file truncated",
    [-CXR_ERANGE] = "address range outside the window or pod slice",
    [-CXR_EADDRINUSE] = "address range already mapped",
    [-CXR_ETIMEDOUT] = "deadline passed",
    [-CXR_EPEERDEAD] = "peer died",
    [-CXR_EBADPTR] = "bad pointer from peer",
    [-CXR_ENOTSEALED] = "data not sealed",
    [-CXR_EPERM] = "operation not permitted",
    [-CXR_EAGAIN] = "not ready, try again",
    [-CXR_ECANCELED] = "call cancelled",
    [-CXR_ENOSYS] = "not supported here",
    [-CXR_EBUSY] = "busy",
    [-CXR_EPROTO] = "protocol error from peer",
    [-CXR_ECORRUPT] = "shared metadata corrupt",
    [-CXR_ENOMETHOD] = "no such method",
    [-CXR_ECLOSED] = "closed",
    [-CXR_EIO] = "system call failed",
    [-CXR_ENOTCONN] = "not connected",
    [-CXR_EFULL] = "ring, table or budget full",
};

const char *cxr_strerror(int err) {
  if (err > 0 || err < CXR_ERRNO_MIN || messages[-err] == NULL) return "unknown error";
  return messages[-err];
}

static _Thread_local int last_error;

int cxr_last_error(void) { return last_error; }
void cxr__set_error(int err) { last_error = err; }
void *cxr__fail_null(int err) {
  last_error = err;
  return NULL;
}

int cxr__from_errno(int e) {
  switch (e) {
    case 0: return 0;
    case EINVAL: return CXR_EINVAL;
    case ENOMEM: case ENOSPC: return CXR_ENOMEM;
    case ENOENT: case ENOTDIR: return CXR_ENOENT;
    case EEXIST: return CXR_EEXIST;
    case ENAMETOOLONG: return CXR_ENAMETOOLONG;
    case EACCES: case EROFS: return CXR_EACCES;
    case EPERM: return CXR_EPERM;
    case ETIMEDOUT: return CXR_ETIMEDOUT;
    case EAGAIN: return CXR_EAGAIN;
    case EBUSY: return CXR_EBUSY;
    case ENOSYS: case EOPNOTSUPP: return CXR_ENOSYS;
    case EFAULT: return CXR_EBADPTR;
    case ECANCELED: return CXR_ECANCELED;
    case ESRCH: case EPIPE: case ECONNRESET: return CXR_EPEERDEAD;
    case ENOTCONN: case ECONNREFUSED: return CXR_ENOTCONN;
    default: return CXR_EIO;
  }
}

int64_t cxr_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* -1 until first read; the level is one int so reading it racily is harmless. */
static volatile int level = -1;

static int parse_level(const char *s) {
  if (s == NULL || *s == '\0') return CXR_LOG_WARN;
  if (!strcasecmp(s, "error")) return CXR_LOG_ERROR;
  if (!strcasecmp(s, "warn")) return CXR_LOG_WARN;
  if (!strcasecmp(s, "info")) return CXR_LOG_INFO;
  if (!strcasecmp(s, "debug")) return CXR_LOG_DEBUG;
  return CXR_LOG_WARN;
}

int cxr_log_level(void) {
  int l = level;
  if (l < 0) level = l = parse_level(getenv("CXRPC_LOG"));
  return l;
}

void cxr_log_set_level(int l) {
  if (l >= CXR_LOG_ERROR && l <= CXR_LOG_DEBUG) level = l;
}

void cxr__log(int lvl, const char *file, int line, const char *fmt, ...) {
  static const char *const names[] = {"error", "warn", "info", "debug"};
  char buf[512];
  int n = snprintf(buf, sizeof buf, "cxrpc[%d] %s %s:%d: ", (int)getpid(),
                   names[lvl < 0 || lvl > 3 ? 0 : lvl], file, line);
  va_list ap;
  va_start(ap, fmt);
  if (n > 0 && (size_t)n < sizeof buf) vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
  va_end(ap);
  /* One write per line so lines from several processes do not interleave. */
  size_t len = strnlen(buf, sizeof buf - 2);
  buf[len++] = '\n';
  ssize_t w = write(2, buf, len);
  (void)w;
}

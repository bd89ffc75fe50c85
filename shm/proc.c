/* Process identity and liveness from /proc (see proc.h). */
#include "shm/proc.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "shm/log.h"

/* A zombie leader whose process still has threads: its main thread called pthread_exit and
 * the others run on. /proc counts the zombie leader among the threads until the last ends. */
static bool other_threads_run(pid_t pid) {
  char path[64], buf[4096];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  const char *t = strstr(buf, "\nThreads:");
  return t != NULL && strtol(t + 9, NULL, 10) > 1;
}

int cxr__proc_start_time(pid_t pid, uint64_t *start_time) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  /* Only the kernel's "no such process" says it is gone. A thread that may not open files
   * (a sandbox worker's seccomp policy: EPERM), or out of descriptors, cannot tell: taking
   * that for death made such a thread reclaim live holders' memory. */
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENOENT && errno != ESRCH) return CXR_EIO;
    /* /proc may hide a live process (mounted with hidepid=, another user's): kill(2)
     * tells whether it exists. */
    if (kill(pid, 0) == 0 || errno == EPERM) return CXR_EIO;
    return CXR_ENOENT;
  }
  ssize_t n = read(fd, buf, sizeof buf - 1);
  int read_errno = errno;
  close(fd);
  if (n < 0) return read_errno == ESRCH ? CXR_ENOENT : CXR_EIO;
  if (n == 0) return CXR_ENOENT; /* exited between the open and the read */
  buf[n] = '\0';
  /* The command name (field 2) may hold spaces and parentheses: fields resume after the
   * last ')'. Field 3 is the state, field 22 the start time. */
  char *p = strrchr(buf, ')');
  if (p == NULL || p[1] != ' ') return CXR_ENOENT;
  p += 2;
  char state = *p;
  if (state == 'X' || state == 'x') return CXR_ENOENT;
  if (state == 'Z' && !other_threads_run(pid)) return CXR_ENOENT;
  for (int field = 3; field < 22; field++) {
    p = strchr(p, ' ');
    if (p == NULL) return CXR_ENOENT;
    p++;
  }
  unsigned long long st = 0;
  if (sscanf(p, "%llu", &st) != 1) return CXR_ENOENT;
  *start_time = st;
  return 0;
}

uint64_t cxr__host_id(void) {
  static _Atomic uint64_t cached;
  uint64_t h = cached;
  if (h != 0) return h;
  char buf[64] = {0};
  int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t n = read(fd, buf, sizeof buf - 1);
    (void)n;
    close(fd);
  }
  h = 1469598103934665603ull; /* FNV-1a */
  for (const char *c = buf; *c && *c != '\n'; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
  if (h == 0) h = 1;
  cached = h;
  return h;
}

int cxr__proc_self_id(cxr__proc_id *out) {
  if (out == NULL) return CXR_EINVAL;
  memset(out, 0, sizeof *out);
  out->pid = (int32_t)getpid();
  out->host = cxr__host_id();
  if (cxr__proc_start_time(out->pid, &out->start_time) != 0) return CXR_EIO;
  return 0;
}

bool cxr__proc_alive(const cxr__proc_id *id) {
  if (id == NULL || id->pid <= 0) return false;
  if (id->host != cxr__host_id()) return true;
  uint64_t st;
  int rc = cxr__proc_start_time(id->pid, &st);
  if (rc != 0) return rc != CXR_ENOENT; /* cannot tell: never declared dead */
  return st == id->start_time;
}

/* Asking the kernel how a process maps an address range: PROCMAP_QUERY (Linux 6.11+) on
 * an open /proc/PID/maps, one ioctl per VMA (~0.35 us here); older kernels fall back to
 * parsing the maps text. This is how a receiver knows the sender's pages really are
 * read-only, instead of trusting the sender's word. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "sandbox/internal.h"
#include "shm/log.h"

/* From linux/fs.h (6.11); Debian 12's headers predate it. */
struct cxr__procmap_query {
  uint64_t size, query_flags, query_addr;
  uint64_t vma_start, vma_end, vma_flags, vma_page_size, vma_offset, inode;
  uint32_t dev_major, dev_minor, vma_name_size, build_id_size;
  uint64_t vma_name_addr, build_id_addr;
};
#define CXR__PROCMAP_QUERY _IOWR('f', 17, struct cxr__procmap_query)
_Static_assert(CXR__PROCMAP_QUERY == CXR__PROCMAP_QUERY_NR, "thread_policy.c allows this ioctl");
enum { Q_READ = 1, Q_WRITE = 2, Q_EXEC = 4, Q_SHARED = 8 };

typedef struct vma {
  uint64_t start, end, flags, off, dev, ino;
} vma;

/* Fallback: find the VMA containing a in the text of the maps file. */
static int vma_text(int fd, uint64_t a, vma *v) {
  if (lseek(fd, 0, SEEK_SET) < 0) return CXR_EIO;
  FILE *f = fdopen(dup(fd), "r");
  if (!f) return CXR_EIO;
  char line[512];
  int rc = CXR_ENOENT;
  while (fgets(line, sizeof line, f)) {
    unsigned long long s, e, off, ino;
    unsigned maj, min;
    char perm[8];
    if (sscanf(line, "%llx-%llx %7s %llx %x:%x %llu", &s, &e, perm, &off, &maj, &min, &ino) != 7)
      continue;
    if (a < s || a >= e) continue;
    v->start = s, v->end = e, v->off = off, v->ino = ino, v->dev = makedev(maj, min);
    v->flags = (perm[0] == 'r' ? Q_READ : 0) | (perm[1] == 'w' ? Q_WRITE : 0) |
               (perm[2] == 'x' ? Q_EXEC : 0) | (perm[3] == 's' ? Q_SHARED : 0);
    rc = 0;
    break;
  }
  fclose(f);
  return rc;
}

static int vma_at(int fd, uint64_t a, vma *v) {
  static _Atomic int no_query;
  if (!no_query) {
    struct cxr__procmap_query q;
    memset(&q, 0, sizeof q);
    q.size = sizeof q;
    q.query_addr = a;
    if (ioctl(fd, CXR__PROCMAP_QUERY, &q) == 0) {
      v->start = q.vma_start, v->end = q.vma_end, v->flags = q.vma_flags;
      v->off = q.vma_offset, v->ino = q.inode, v->dev = makedev(q.dev_major, q.dev_minor);
      return 0;
    }
    if (errno == ENOENT) return CXR_ENOENT;
    if (errno != ENOTTY && errno != EINVAL) return cxr__from_errno(errno);
    no_query = 1;
    CXR_INFO("no PROCMAP_QUERY on this kernel: parsing /proc/PID/maps instead");
  }
  return vma_text(fd, a, v);
}

int cxr__vma_verify_sealed(int maps_fd, uint64_t a, uint64_t n, uint64_t dev, uint64_t ino,
                           uint64_t off) {
  if (maps_fd < 0 || n == 0 || a + n < a) return CXR_EINVAL;
  uint64_t at = a, end = a + n;
  while (at < end) {
    vma v;
    int rc = vma_at(maps_fd, at, &v);
    if (rc == CXR_ENOENT) return CXR_ENOTSEALED; /* a hole: not the heap */
    if (rc) return rc;
    if (v.start > at || v.end <= at) return CXR_ENOTSEALED;
    if ((v.flags & Q_WRITE) || !(v.flags & Q_SHARED)) return CXR_ENOTSEALED;
    /* The same file at the same offset as our view: not a private copy or another file. */
    if (ino && (v.ino != ino || v.dev != dev || v.off + (at - v.start) != off + (at - a)))
      return CXR_ENOTSEALED;
    at = v.end;
  }
  return 0;
}

int cxr__vma_backing(uint64_t a, uint64_t *dev, uint64_t *ino, uint64_t *off) {
  return cxr__vma_backing_of(0, a, dev, ino, off);
}

int cxr__vma_backing_of(int pid, uint64_t a, uint64_t *dev, uint64_t *ino, uint64_t *off) {
  char path[64];
  if (pid > 0) snprintf(path, sizeof path, "/proc/%d/maps", pid);
  else snprintf(path, sizeof path, "/proc/self/maps");
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return cxr__from_errno(errno);
  vma v;
  int rc = vma_at(fd, a, &v);
  close(fd);
  if (rc) return rc;
  *dev = v.dev, *ino = v.ino, *off = v.off + (a - v.start);
  return 0;
}

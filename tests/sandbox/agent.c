/*
 * The sender side of the seal and attack tests, as a real separate program (so it can run
 * under `cxrpcd run`). It maps the receiver's heap at the same address, attaches the seal
 * table read-only, and obeys agent.h commands: seal, release, and each attack of the
 * attack suite, reporting the syscall's result. A successful attack also writes
 * AGENT_MARK through whatever it gained, so the receiver can see whether its data changed.
 *
 * agent CTL_FD HEAP_FD HEAP_ADDR HEAP_SIZE HEAP_PATH TABLE_FD TABLE_ADDR BATCH
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/falloc.h>

#include <cxrpc/sandbox.h>

#include "tests/sandbox/agent.h"

static int ctl, heap_fd, table_fd;
static uintptr_t heap_addr, table_addr;
static size_t heap_size;
static const char *heap_path;
static cxr_seal_table *tab;


static int store(void *p) {
  *(volatile unsigned char *)p = AGENT_MARK;
  return 0;
}
/* Writes the marker, surviving a fault (sealed page): 0 if written, CXR_EBADPTR if not. */
static int mark(void *p) { return cxr_sandbox_run(store, p); }

static int attack(int kind, uintptr_t p, size_t n, uint64_t *extra) {
  off_t off = (off_t)(p - heap_addr);
  void *q;
  int fd;
  switch (kind) {
    case AT_MPROTECT:
      if (mprotect((void *)p, n, PROT_READ | PROT_WRITE)) return -errno;
      return mark((void *)p);
    case AT_PKEY_MPROTECT:
      if (syscall(SYS_pkey_mprotect, p, n, PROT_READ | PROT_WRITE, -1)) return -errno;
      return mark((void *)p);
    case AT_MMAP_FIXED:
      q = mmap((void *)p, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, heap_fd, off);
      if (q == MAP_FAILED) return -errno;
      return mark(q);
    case AT_MREMAP_ALIAS:
      q = mremap((void *)p, 0, n, MREMAP_MAYMOVE);
      if (q == MAP_FAILED) return -errno;
      if (mprotect(q, n, PROT_READ | PROT_WRITE)) return -errno;
      return mark(q);
    case AT_MREMAP_MOVE:
      q = mremap((void *)p, n, 2 * n, MREMAP_MAYMOVE); /* must move: the next page is taken */
      if (q == MAP_FAILED) return -errno;
      if (mprotect(q, n, PROT_READ | PROT_WRITE)) return -errno;
      return mark(q);
    case AT_MUNMAP_REMAP:
      if (munmap((void *)p, n)) return -errno;
      q = mmap((void *)p, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, heap_fd, off);
      if (q == MAP_FAILED) return -errno;
      return mark(q);
    case AT_REMAP_FILE_PAGES: /* the heap's last page (writable, never sealed here) */
      q = (void *)(heap_addr + heap_size - n);
      if (syscall(SYS_remap_file_pages, q, n, 0, (unsigned long)off / 4096, 0)) return -errno;
      return mark(q);
    case AT_SHMAT_REMAP: { /* replaces our view only: the receiver's bytes stay */
      int id = shmget(IPC_PRIVATE, n, IPC_CREAT | 0600);
      if (id < 0) return -errno;
      q = shmat(id, (void *)p, SHM_REMAP);
      int e = errno;
      shmctl(id, IPC_RMID, NULL);
      return q == (void *)-1 ? -e : mark(q);
    }
    case AT_MADV_REMOVE:
      return madvise((void *)p, n, MADV_REMOVE) ? -errno : 0;
    case AT_PROC_MEM: {
      fd = open("/proc/self/mem", O_RDWR | O_CLOEXEC);
      if (fd < 0) return -errno;
      unsigned char m = AGENT_MARK;
      long w = pwrite(fd, &m, 1, (off_t)p);
      int e = errno;
      close(fd);
      return w == 1 ? 0 : -e;
    }
    case AT_FD_MAP_OUTSIDE:
      q = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, heap_fd, off);
      if (q == MAP_FAILED) return -errno;
      return mark(q);
    case AT_FD_MAP_WINDOW: /* just past the heap: inside the window, not the heap's place */
      q = mmap((void *)(heap_addr + heap_size + 0x100000), n, PROT_READ | PROT_WRITE,
               MAP_SHARED | MAP_FIXED_NOREPLACE, heap_fd, off);
      if (q == MAP_FAILED) return -errno;
      *extra = (uintptr_t)q;
      return mark(q);
    case AT_PWRITE: {
      unsigned char m = AGENT_MARK;
      return pwrite(heap_fd, &m, 1, off) == 1 ? 0 : -errno;
    }
    case AT_OPEN_PATH: {
      fd = open(heap_path, O_RDWR | O_CLOEXEC);
      if (fd < 0) return -errno;
      unsigned char m = AGENT_MARK;
      long w = pwrite(fd, &m, 1, off);
      int e = errno;
      close(fd);
      return w == 1 ? 0 : -e;
    }
    case AT_PROCESS_VM_WRITEV: {
      unsigned char m = AGENT_MARK;
      struct iovec l = {&m, 1}, r = {(void *)p, 1};
      return syscall(SYS_process_vm_writev, getpid(), &l, 1, &r, 1, 0) == 1 ? 0 : -errno;
    }
    case AT_PTRACE_CHILD: {
      pid_t parent = getpid(), c = fork();
      if (c < 0) return -errno;
      if (c == 0) {
        if (ptrace(PTRACE_ATTACH, parent, 0, 0) != 0) _exit(100 + (errno & 0x7f) % 100);
        waitpid(parent, NULL, __WALL);
        long word = ptrace(PTRACE_PEEKDATA, parent, (void *)p, 0);
        word = (word & ~0xffL) | AGENT_MARK;
        long w = ptrace(PTRACE_POKEDATA, parent, (void *)p, (void *)word);
        int e = errno;
        ptrace(PTRACE_DETACH, parent, 0, 0);
        _exit(w == 0 ? 0 : 100 + e % 100);
      }
      int st = 0;
      while (waitpid(c, &st, 0) < 0 && errno == EINTR) {
      }
      int code = WIFEXITED(st) ? WEXITSTATUS(st) : 99;
      return code == 0 ? 0 : -(code - 100);
    }
    case AT_FALLOCATE:
      return fallocate(heap_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, (off_t)n)
                 ? -errno : 0;
    case AT_WRITE_TABLE: {
      if (mprotect((void *)table_addr, 4096, PROT_READ | PROT_WRITE) == 0) return 0;
      int e1 = errno;
      char path[64];
      snprintf(path, sizeof path, "/proc/self/fd/%d", table_fd);
      fd = open(path, O_RDWR | O_CLOEXEC);
      if (fd >= 0) {
        char z[8] = {0};
        long w = pwrite(fd, z, sizeof z, 64);
        close(fd);
        if (w == (long)sizeof z) return 0;
      }
      q = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, table_fd, 0);
      if (q != MAP_FAILED) return 0;
      *extra = (uint64_t)errno;
      return -e1;
    }
    case AT_FTRUNCATE:
      return ftruncate(heap_fd, 0) ? -errno : 0;
  }
  return -EINVAL;
}

int main(int argc, char **argv) {
  if (argc != 9) {
    fprintf(stderr, "usage: agent CTL HEAPFD ADDR SIZE PATH TABLEFD TABLEADDR BATCH\n");
    return 2;
  }
  ctl = atoi(argv[1]);
  heap_fd = atoi(argv[2]);
  heap_addr = strtoull(argv[3], NULL, 0);
  heap_size = strtoull(argv[4], NULL, 0);
  heap_path = argv[5];
  table_fd = atoi(argv[6]);
  table_addr = strtoull(argv[7], NULL, 0);
  signal(SIGPIPE, SIG_IGN);
  void *h = mmap((void *)heap_addr, heap_size, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_FIXED_NOREPLACE, heap_fd, 0);
  if (h != (void *)heap_addr) {
    fprintf(stderr, "agent: cannot map the heap at %#lx: %s\n", (unsigned long)heap_addr,
            strerror(errno));
    return 3;
  }
  cxr_seal_opts so;
  cxr_seal_opts_init(&so);
  so.addr = table_addr;
  so.release_batch = (unsigned)atoi(argv[8]);
  int rc = cxr_seal_table_attach(&tab, table_fd, &so);
  if (rc) {
    fprintf(stderr, "agent: attach: %s\n", cxr_strerror(rc));
    return 4;
  }
  agent_msg m;
  for (;;) {
    long n = read(ctl, &m, sizeof m);
    if (n != (long)sizeof m) return 0;
    cxr_seal_id id;
    m.r = 0;
    switch (m.op) {
      case AG_SEAL:
        m.rc = cxr_seal_table_seal(tab, (void *)(uintptr_t)m.a, m.b, &id);
        m.r = m.rc ? 0 : id;
        break;
      case AG_RELEASE: m.rc = cxr_seal_table_release(tab, m.a); break;
      case AG_FLUSH: m.rc = cxr_seal_table_flush(tab); break;
      case AG_CANCEL: m.rc = cxr_seal_table_cancel(tab, m.a); break;
      case AG_WRITE: m.rc = mark((void *)(uintptr_t)m.a); break;
      case AG_ATTACK: m.rc = attack((int)m.a, m.b, m.c, &m.r); break;
      case AG_MAP: {
        void *q = mmap((void *)(uintptr_t)m.a, m.b, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                       heap_fd, (off_t)(m.a - heap_addr));
        m.rc = q == MAP_FAILED ? -errno : 0;
        break;
      }
      case AG_MAP_TABLE: { /* kept mapped until exit, as a sender keeps its server's table */
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)m.a, (int)m.b);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        void *q = fd < 0 ? MAP_FAILED : mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
        m.rc = q == MAP_FAILED ? -errno : 0;
        if (fd >= 0) close(fd);
        break;
      }
      case AG_EXIT:
        cxr_seal_table_close(tab);
        m.rc = 0;
        if (write(ctl, &m, sizeof m) < 0) return 1;
        return 0;
      default: m.rc = -EINVAL;
    }
    if (write(ctl, &m, sizeof m) != (long)sizeof m) return 1;
  }
}

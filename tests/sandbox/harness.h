// Test harness for the sandbox suites: real shared heaps mapped at the same window address
// in the test (the receiver) and in agent.c (the sender, a separate program, optionally
// under `cxrpcd run`), and a real cxrpcd supervisor process. Every wait is bounded.
#ifndef CXRPC_TESTS_SANDBOX_HARNESS_H
#define CXRPC_TESTS_SANDBOX_HARNESS_H

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <cxrpc/sandbox.h>

extern "C" {
#include "sandbox/internal.h"
#include "tests/sandbox/agent.h"
}

namespace sbx {

inline std::string runfile(const char *rel) {
  const char *src = getenv("TEST_SRCDIR"), *ws = getenv("TEST_WORKSPACE");
  if (src && ws) return std::string(src) + "/" + ws + "/" + rel;
  return rel;
}

// A distinct place in the window for each heap of this process.
inline uintptr_t window_slot() {
  static unsigned next;
  uintptr_t base;
  size_t size;
  cxr__sbx_window(&base, &size);
  uintptr_t slots = size / 4 / 0x40000000ull;  // 1 GiB per process, 16 MiB per heap
  if (slots == 0) slots = 1;
  return base + size / 2 + (uintptr_t)(getpid() % slots) * 0x40000000ull +
         (uintptr_t)(next++ % 64) * 0x1000000ull;
}

struct Heap {
  int fd = -1;
  uintptr_t addr = 0;
  size_t size = 0;
  std::string path;  // by-path name the agent may open
  bool memfd = false;
  unsigned char *p() const { return (unsigned char *)addr; }
};

// A named file on /dev/shm (like shm's heap files) or a sealable memfd, mapped read-write.
inline bool make_heap(Heap *h, size_t size, bool memfd) {
  h->size = size;
  h->addr = window_slot();
  h->memfd = memfd;
  if (memfd) {
    h->fd = memfd_create("cxrpc-test-heap", MFD_ALLOW_SEALING);
  } else {
    // A name no other suite can have (suites run side by side in pid namespaces of their
    // own, so our pid alone is not unique on the shared /dev/shm).
    char name[] = "/dev/shm/cxrpc-sbx-test-XXXXXX.heap";
    h->fd = mkstemps(name, 5);
    h->path = name;
  }
  if (h->fd < 0 || ftruncate(h->fd, (off_t)size) != 0) return false;
  void *m = mmap((void *)h->addr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE,
                 h->fd, 0);
  if (m != (void *)h->addr) return false;
  memset(m, 0x11, size);
  return true;
}

// After every process mapped it: no new writable view, no write(), no shrinking, no holes.
inline int seal_memfd_heap(Heap *h) {
  return fcntl(h->fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE | F_SEAL_SHRINK | F_SEAL_GROW);
}

// A seal table made by hand, as a hostile receiver could make one: a valid header for
// `slots` records in a memfd of exactly the table's size, then `seals` (0: none). *w is the
// maker's writable mapping (made before the seals, as cxr_seal_table_create does), through
// which it can rewrite the header later. The fd, or -1.
inline int fake_table(unsigned slots, unsigned seals, cxr__seal_hdr **w) {
  size_t bytes = cxr__seal_bytes(slots);
  int fd = memfd_create("cxrpc-fake-table", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  void *m = MAP_FAILED;
  if (ftruncate(fd, (off_t)bytes) == 0)
    m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    close(fd);
    return -1;
  }
  cxr__seal_hdr *h = (cxr__seal_hdr *)m;
  h->magic = CXR__SEAL_MAGIC;
  h->version = CXR__SEAL_VERSION;
  h->slots = slots;
  h->bytes = bytes;
  if (seals && fcntl(fd, F_ADD_SEALS, seals) != 0) {
    munmap(m, bytes);
    close(fd);
    return -1;
  }
  *w = h;
  return fd;
}

// Every seal cxr_seal_table_create puts on its memfd.
constexpr unsigned kTableSeals = F_SEAL_FUTURE_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

inline void drop_heap(Heap *h) {
  if (h->addr) munmap((void *)h->addr, h->size);
  if (h->fd >= 0) close(h->fd);
  if (!h->path.empty() && !h->memfd) unlink(h->path.c_str());
  h->fd = -1;
  h->addr = 0;
}

struct Supervisor {
  pid_t pid = -1;
  std::string sock;
};

inline bool start_supervisor(Supervisor *s) {
  // A fresh directory per supervisor: Bazel runs suites side by side in pid namespaces of
  // their own, so a path made of our pid collided with another suite's supervisor (whose
  // answers then made tests fail). /tmp, not TEST_TMPDIR: socket paths must stay short.
  char dir[] = "/tmp/cxrpcd-test-XXXXXX";
  if (mkdtemp(dir) == NULL) return false;
  char path[96];
  snprintf(path, sizeof path, "%s/sock", dir);
  s->sock = path;
  std::string bin = runfile("tools/cxrpcd/cxrpcd");
  s->pid = fork();
  if (s->pid < 0) return false;
  if (s->pid == 0) {
    execl(bin.c_str(), "cxrpcd", "serve", "--socket", path, (char *)NULL);
    _exit(127);
  }
  int c = cxr__cxrpcd_connect(path, 10000000000ll);  // bounded: 10 s
  if (c < 0) return false;
  close(c);
  return true;
}

inline void stop_supervisor(Supervisor *s) {
  if (s->pid <= 0) return;
  kill(s->pid, SIGTERM);
  int st;
  for (int i = 0; i < 500 && waitpid(s->pid, &st, WNOHANG) == 0; i++) usleep(10000);
  if (waitpid(s->pid, &st, WNOHANG) == 0) {
    kill(s->pid, SIGKILL);
    waitpid(s->pid, &st, 0);
  }
  s->pid = -1;
  unlink(s->sock.c_str());
  rmdir(s->sock.substr(0, s->sock.rfind('/')).c_str());
}

inline bool supervisor_stats(const Supervisor &s, uint64_t *allowed, uint64_t *refused) {
  int c = cxr__cxrpcd_connect(s.sock.c_str(), 1000000000ll);
  if (c < 0) return false;
  cxr__cxrpcd_msg m = {};
  m.magic = CXR__CXRPCD_MAGIC;
  m.type = CXR__MSG_STATS;
  bool ok = cxr__msg_send(c, &m, -1) == 0 && cxr__msg_recv(c, &m, NULL, 2000000000ll) == 0;
  close(c);
  *allowed = m.allowed;
  *refused = m.refused;
  return ok;
}

struct Agent {
  pid_t pid = -1;
  int ctl = -1;
  uintptr_t table_addr = 0;
};

// Runs agent.c with the heap and the table's fd; under cxrpcd when sup is given.
inline bool spawn_agent(Agent *a, const Heap &h, cxr_seal_table *t, unsigned batch,
                        const Supervisor *sup) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return false;
  a->table_addr = window_slot();
  int tfd = cxr_seal_table_fd(t);
  std::string bin = runfile("tests/sandbox/agent"), cx = runfile("tools/cxrpcd/cxrpcd");
  std::string path = h.memfd ? "/proc/self/fd/" + std::to_string(h.fd) : h.path;
  char n1[16], n2[16], n3[32], n4[32], n5[16], n6[32], n7[16];
  snprintf(n1, sizeof n1, "%d", sv[1]);
  snprintf(n2, sizeof n2, "%d", h.fd);
  snprintf(n3, sizeof n3, "%#lx", (unsigned long)h.addr);
  snprintf(n4, sizeof n4, "%#lx", (unsigned long)h.size);
  snprintf(n5, sizeof n5, "%d", tfd);
  snprintf(n6, sizeof n6, "%#lx", (unsigned long)a->table_addr);
  snprintf(n7, sizeof n7, "%u", batch);
  a->pid = fork();
  if (a->pid < 0) return false;
  if (a->pid == 0) {
    fcntl(sv[1], F_SETFD, 0);
    fcntl(h.fd, F_SETFD, 0);
    fcntl(tfd, F_SETFD, 0);
    if (sup)
      execl(cx.c_str(), "cxrpcd", "run", "--socket", sup->sock.c_str(), "--", bin.c_str(), n1, n2,
            n3, n4, path.c_str(), n5, n6, n7, (char *)NULL);
    else
      execl(bin.c_str(), "agent", n1, n2, n3, n4, path.c_str(), n5, n6, n7, (char *)NULL);
    _exit(127);
  }
  close(sv[1]);
  a->ctl = sv[0];
  return true;
}

// One command, one reply; false if the agent died or took longer than 10 s.
inline bool agent_call(Agent *a, agent_msg *m) {
  if (write(a->ctl, m, sizeof *m) != (ssize_t)sizeof *m) return false;
  struct pollfd p = {a->ctl, POLLIN, 0};
  if (poll(&p, 1, 10000) != 1) return false;
  return read(a->ctl, m, sizeof *m) == (ssize_t)sizeof *m;
}

inline agent_msg agent_do(Agent *a, uint32_t op, uint64_t x = 0, uint64_t y = 0, uint64_t z = 0) {
  agent_msg m = {};
  m.op = op;
  m.a = x;
  m.b = y;
  m.c = z;
  if (!agent_call(a, &m)) m.rc = -9999;
  return m;
}

inline int stop_agent(Agent *a) {
  if (a->pid <= 0) return -1;
  agent_do(a, AG_EXIT);
  close(a->ctl);
  int st = 0;
  for (int i = 0; i < 500 && waitpid(a->pid, &st, WNOHANG) == 0; i++) usleep(10000);
  if (waitpid(a->pid, &st, WNOHANG) == 0) {
    kill(a->pid, SIGKILL);
    waitpid(a->pid, &st, 0);
  }
  a->pid = -1;
  return st;
}

// Whether every byte of [p, p + n) still holds v, read inside the fault sandbox (a page the
// sender punched or truncated away must not crash the test). -1 if the read faulted.
struct ReadArgs {
  const unsigned char *p;
  size_t n;
  unsigned char v;
};
inline int read_all(void *x) {
  ReadArgs *r = (ReadArgs *)x;
  for (size_t i = 0; i < r->n; i++)
    if (((volatile const unsigned char *)r->p)[i] != r->v) return 1;
  return 0;
}
inline int unchanged(const void *p, size_t n, unsigned char v) {
  ReadArgs r = {(const unsigned char *)p, n, v};
  int rc = cxr_sandbox_run(read_all, &r);
  return rc == 0 ? 1 : rc == 1 ? 0 : -1;
}

}  // namespace sbx
#endif

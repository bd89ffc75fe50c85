/*
 * The supervisor loop. One thread, poll(2) over: the listening socket, client connections
 * (launchers attaching a notify fd, receivers registering seal tables), the notify fds, and
 * the pidfds of the processes registrations name (a registration goes once its process has).
 * Each notification is decided from the syscall's scalar arguments and the registered
 * tables (which this process maps read-only itself, so it reads the same records the
 * receiver writes), then answered CONTINUE or EPERM. Single-threaded on purpose: decisions
 * are serialized with registrations.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <seccomp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/kcmp.h>
#include <linux/seccomp.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "sandbox/internal.h"
#include "shm/log.h"
#include "tools/cxrpcd/supervisor.h"

/* Room for several users, and a bound per user (uid) so that one cannot take it all: a
 * uid gets at most a quarter of the clients, of the supervised processes and of the
 * registrations. */
#define MAX_CLIENTS 1024
#define MAX_PROCS 1024
/* Descriptors kept besides those of clients (one each), processes (two each) and
 * registrations (one each: a pidfd of the process they name): the
 * thread cache's pidfds, standard streams, the listening socket and those a request opens
 * for a moment (a received fd, /proc files, pidfds). The tables are cut to what
 * RLIMIT_NOFILE leaves (main raises it to the hard limit): at 1024, the full tables needed
 * about 3100, and past the limit accept4 failed with the listening socket still readable
 * (the loop span) and /proc opens and pidfd_open failed (attaches and registrations
 * refused with CXR_EPERM). */
#define FD_RESERVE 96
#define MAX_REGS 1024
/* Registrations: a registrant uid (SO_PEERCRED) holds at most a quarter of them, as for
 * clients. For one supervised pid, a registrant uid holds at most REGS_PER_PID, whose tables
 * together are at most two of the largest (2^21 records), and all registrants together at
 * most PID_SHARES times that: each of the pid's decisions walks all its tables, at about a
 * nanosecond a record, so a decision stays within about 15 ms. One process used to fill the
 * whole table with one table of its own registered 1024 times (everyone else's then
 * CXR_EFULL), or make each of its decisions walk 2^27 records (~150 ms, cxrpcd answering no
 * one meanwhile). The pid's bound used to be one for all registrants: one user (any server
 * the process took tables from) could take it all and have every other server's
 * registration for that process refused; now it takes at most a quarter, as elsewhere. A
 * table (dev, ino) already registered for the pid by another connection is taken again: an
 * entry per (pid, table, connection), each counted in its own registrant's bounds, of which
 * decisions walk the table once (reg.walked) and the pid's bound in all counts it once. It
 * used to be refused (CXR_EEXIST) to every later registrant: a user who got hold of a
 * server's table registered it first, and the process's protection then ended with that
 * user's connection while the server's registration had been refused. */
#define REGS_PER_PID 64
#define PID_TABLE_BYTES (2 * cxr__seal_bytes(CXR_SEAL_SLOTS_MAX))
#define PID_SHARES 4
/* A client's time to send its request: launchers and registrants send as soon as they
 * connect. Only a connection that holds a registration stays open without one. */
#define IDLE_NS 1000000000ll

typedef struct proc {
  int64_t pid;
  uid_t uid;
  int pidfd; /* the attached process itself: its pid stops counting once it is gone */
  int nfd;
  uintptr_t wbase;
  size_t wsize;
} proc;

typedef struct reg {
  int64_t pid;
  void *mem;
  size_t bytes;
  cxr_range heap;
  uint64_t heap_dev, heap_ino; /* the heap file, as the sender maps it (0: unknown) */
  int owner; /* the receiver's connection: the registration ends with it */
  uid_t uid; /* the registrant's */
  uint64_t dev, ino; /* the table file */
  int pidfd; /* the process it names: the registration ends with it (see drop_gone_regs) */
  bool walked; /* the one entry of its (pid, table) whose table decisions walk */
} reg;

typedef struct client {
  int fd;
  uid_t uid;
  int holds;        /* registrations it owns (each lasts while this connection does) */
  int64_t deadline; /* its next request, or it is closed (unless it holds one) */
} client;

typedef struct sup {
  int lfd;
  client clients[MAX_CLIENTS];
  int nclients;
  proc procs[MAX_PROCS];
  int nprocs;
  reg regs[MAX_REGS];
  int nregs;
  struct pollfd rpf[MAX_REGS]; /* drop_gone_regs' poll: the pidfds of regs[ridx[k]] */
  int ridx[MAX_REGS];
  struct { int64_t tid, tgid; int pidfd; } tcache[64]; /* used if tid > 0 */
  unsigned tnext;
  uint64_t allowed, refused;
  int max_clients, max_procs, max_regs; /* what the fd limit allows */
  int clients_per_uid, procs_per_uid, regs_per_uid;
  int64_t accept_after; /* no accepting before (after EMFILE or ENFILE) */
  uint64_t regs_failed;  /* drop_gone_regs' polls failed in a row */
  int64_t regs_after;    /* the loop leaves the registrations' pidfds out until then */
} sup;

static int64_t read_status_field(int64_t pid, const char *field) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%lld/status", (long long)pid);
  FILE *f = fopen(path, "re");
  if (!f) return -1;
  int64_t v = -1;
  size_t fl = strlen(field);
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, field, fl) && line[fl] == ':') {
      v = strtoll(line + fl + 1, NULL, 10);
      break;
    }
  fclose(f);
  return v;
}

#ifndef PIDFD_THREAD
#define PIDFD_THREAD O_EXCL
#endif

/* Whether the process (or thread) behind pidfd has exited (a pidfd polls readable then): 1,
 * 0, or a negative CXR_E* when poll fails (ENOMEM: it allocates; a zero timeout never gives
 * EINTR). A failure says nothing: each caller takes it the way that grants nothing. */
static int exited(int pidfd) {
  struct pollfd p = {.fd = pidfd, .events = POLLIN};
  int n = poll(&p, 1, 0);
  return n < 0 ? cxr__from_errno(errno) : n;
}

/* Exited, or cannot tell: for the callers for which a live process grants something (a
 * cached answer, counting as supervised, a registration taken). */
static bool gone(int pidfd) { return exited(pidfd) != 0; }

/* Alive, or cannot tell: for a place a live process holds (its attach). */
static bool maybe_alive(int pidfd) { return exited(pidfd) != 1; }

/* The process of thread tid. A cached answer holds while the thread it was read for lives
 * (a pidfd of that thread): once it exits its tid can go to a thread of another process,
 * which the cache used to decide with the first process's tables (a raise over its own
 * seal let through). Without thread pidfds (before Linux 6.9) nothing is cached. */
static int64_t tgid_of(sup *s, int64_t tid) {
  for (unsigned i = 0; i < 64; i++) {
    if (s->tcache[i].tid != tid) continue;
    if (!gone(s->tcache[i].pidfd)) return s->tcache[i].tgid;
    close(s->tcache[i].pidfd);
    s->tcache[i].tid = 0;
    break;
  }
  int pfd = (int)syscall(SYS_pidfd_open, (pid_t)tid, PIDFD_THREAD);
  int64_t g = read_status_field(tid, "Tgid");
  if (g <= 0 || pfd < 0 || gone(pfd)) { /* not cached: it may not have been this thread's */
    if (pfd >= 0) close(pfd);
    return g > 0 ? g : tid;
  }
  unsigned k = s->tnext++ % 64;
  if (s->tcache[k].tid > 0) close(s->tcache[k].pidfd);
  s->tcache[k].tid = tid;
  s->tcache[k].tgid = g;
  s->tcache[k].pidfd = pfd;
  return g;
}

/* A process is supervised if it, or an ancestor, is one we launched (the filter and its
 * listener are inherited across fork and exec and cannot be removed). An attached process
 * that exited no longer counts: its listener lives on while a descendant does, and its pid
 * could be reused by anyone. */
static bool supervised(sup *s, int64_t pid) {
  for (int depth = 0; pid > 1 && depth < 64; depth++) {
    for (int i = 0; i < s->nprocs; i++)
      if (s->procs[i].pid == pid && !gone(s->procs[i].pidfd)) return true;
    pid = read_status_field(pid, "PPid");
  }
  return false;
}

static void drop_proc(sup *s, int i) {
  close(s->procs[i].nfd);
  close(s->procs[i].pidfd);
  s->procs[i] = s->procs[--s->nprocs];
}

/* Whether fd is a seccomp user-notification listener. Any other descriptor polls readable
 * for good and fails every receive (ENOTTY): accepted, it made its sender count as
 * supervised with no filter at all, and kept this loop spinning. The name alone could be
 * imitated by nothing else (anon inodes are the kernel's), and the ioctl answers ENOENT
 * for an unknown id only on a real listener. */
static bool is_listener(int fd) {
  char path[64], name[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(path, name, sizeof name - 1);
  if (n <= 0) return false;
  name[n] = '\0';
  if (strcmp(name, "anon_inode:seccomp notify") != 0) return false;
  uint64_t bogus = UINT64_MAX;
  return ioctl(fd, SECCOMP_IOCTL_NOTIF_ID_VALID, &bogus) != 0 && errno == ENOENT;
}

/* Before entry r goes: another entry of its (pid, table), if any, becomes the walked one
 * (the table still counts in decisions for as long as any registrant holds it). */
static void hand_on_walk(sup *s, int r) {
  const reg *g = &s->regs[r];
  if (!g->walked) return;
  for (int q = 0; q < s->nregs; q++)
    if (q != r && s->regs[q].pid == g->pid && s->regs[q].dev == g->dev &&
        s->regs[q].ino == g->ino) {
      s->regs[q].walked = true;
      return;
    }
}

/* Its owner's count goes down with it: a connection whose registrations all ended is an idle
 * one again (closed once 1 s has passed since its last request, the first its uid gives
 * up). The count used to be a flag set for good, so such a connection was never closed and
 * held one of its uid's places. */
static void drop_reg(sup *s, int r) {
  for (int i = 0; i < s->nclients; i++)
    if (s->clients[i].fd == s->regs[r].owner) s->clients[i].holds--;
  hand_on_walk(s, r);
  munmap(s->regs[r].mem, s->regs[r].bytes);
  close(s->regs[r].pidfd);
  s->regs[r] = s->regs[--s->nregs];
}

/* Registrations whose process has ended (pid >= 0: only those naming pid). A registration
 * names a pid, and used to last while its registrant's connection did: once the process
 * exited, the next one given its pid (any user's) was decided with the old one's tables
 * (its raises and unmaps refused wherever they said) and found its pid's places taken.
 * One poll over their pidfds: each REGISTER used to poll them one at a time (up to 1024
 * syscalls a request). If it fails, every one is kept and asked again next time: a failed
 * poll used to count as an exit, dropping the registration (and so its refusals) of a live
 * process. */
static void drop_gone_regs(sup *s, int64_t pid) {
  nfds_t n = 0;
  for (int r = 0; r < s->nregs; r++)
    if (pid < 0 || s->regs[r].pid == pid) {
      s->rpf[n] = (struct pollfd){.fd = s->regs[r].pidfd, .events = POLLIN};
      s->ridx[n++] = r;
    }
  if (n == 0) return;
  if (poll(s->rpf, n, 0) < 0) {
    uint64_t k = ++s->regs_failed;
    if (cxr__log_due(k))
      CXR_WARN("cxrpcd: cannot tell whether %lu registrations' processes have exited (%s);"
               " kept (%llu failures in a row)", (unsigned long)n, strerror(errno),
               (unsigned long long)k);
    /* The ready pidfd stays ready: the loop called again at once, a busy spin that warned
     * each pass for as long as poll failed. It leaves the pidfds out for 10 ms, doubling
     * to 1 s; a gone process's registration only lingers that much longer. */
    s->regs_after = cxr_now_ns() + (k > 7 ? 1000000000ll : 10000000ll << (k - 1));
    return;
  }
  /* Only a poll over all of them ends a run of failures: one over a single pid's (a
   * notification's) needs no memory of the kernel's and succeeds while the full one fails,
   * which reset the back-off and the warnings' pace at every notification (a review). */
  if (pid < 0) s->regs_failed = 0;
  /* Downwards: drop_reg moves the last entry into the freed place, one already seen. */
  for (nfds_t k = n; k-- > 0;)
    if (s->rpf[k].revents) drop_reg(s, s->ridx[k]);
}

static void drop_client(sup *s, int i) {
  int fd = s->clients[i].fd;
  for (int r = 0; r < s->nregs;)
    if (s->regs[r].owner == fd) drop_reg(s, r);
    else r++;
  close(fd);
  s->clients[i] = s->clients[--s->nclients];
}

/* Client sockets do not block (accept4): a client that does not read its replies fills its
 * socket, and a blocking send would stop the supervisor, so every supervised process's
 * notified syscalls, until it read. Such a send fails instead and the client is dropped. */
static int reply(int fd, int status) {
  cxr__cxrpcd_msg m = {.magic = CXR__CXRPCD_MAGIC, .type = CXR__MSG_REPLY, .status = status};
  return cxr__msg_send(fd, &m, -1);
}

static int on_attach(sup *s, int cfd, const cxr__cxrpcd_msg *m, int fd) {
  struct ucred cr;
  socklen_t len = sizeof cr;
  if (fd < 0) return CXR_EPROTO;
  if (getsockopt(cfd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0 || cr.pid != m->pid)
    return CXR_EPERM; /* only a process may attach itself */
  if (!is_listener(fd)) return CXR_EINVAL;
  /* A listener proves a filter somewhere, not in the sender: a process with none could
   * pass one its filtered child made. Which filter it is, cxrpcd cannot read (see
   * docs/sandbox.md: a filter of the sender's own making passes). */
  if (read_status_field(m->pid, "Seccomp") != 2) return CXR_EPERM;
  if (m->size == 0 || m->base + m->size < m->base) return CXR_EINVAL;
  /* One entry per listener. A filtered process's children inherit its listener, and each
   * attached it under its own pid: one notification then made every such entry readable,
   * one receive took it and each other one waited out receive()'s 50 ms timer, so 40
   * children stalled cxrpcd (every supervised syscall, every client) 2 s per notification.
   * A listener already held is refused while its process lives; once that process is gone
   * (its children keep the listener), the entry passes to the new process. Without kcmp
   * (CONFIG_KCMP off) nothing matches, as before. */
  int same = -1;
  for (int i = 0; i < s->nprocs && same < 0; i++)
    if (syscall(SYS_kcmp, getpid(), getpid(), KCMP_FILE, fd, s->procs[i].nfd) == 0) same = i;
  int mine = 0;
  for (int i = 0; i < s->nprocs; i++) {
    if (s->procs[i].pid == m->pid && maybe_alive(s->procs[i].pidfd)) return CXR_EBUSY;
    mine += s->procs[i].uid == cr.uid;
  }
  if (same >= 0 && maybe_alive(s->procs[same].pidfd)) return CXR_EBUSY;
  if (same < 0 && s->nprocs == s->max_procs) return CXR_EFULL;
  if (mine >= s->procs_per_uid && (same < 0 || s->procs[same].uid != cr.uid)) return CXR_EFULL;
  int pidfd = (int)syscall(SYS_pidfd_open, (pid_t)m->pid, 0);
  if (pidfd < 0) return CXR_EPERM;
  if (same >= 0) { /* the caller closes fd: the entry keeps the copy it has */
    proc *p = &s->procs[same];
    close(p->pidfd);
    *p = (proc){m->pid, cr.uid, pidfd, p->nfd, (uintptr_t)m->base, (size_t)m->size};
    CXR_INFO("cxrpcd: supervising pid %lld (its ancestor's listener)", (long long)m->pid);
    return 1;
  }
  s->procs[s->nprocs++] = (proc){m->pid, cr.uid, pidfd, fd, (uintptr_t)m->base, (size_t)m->size};
  CXR_INFO("cxrpcd: supervising pid %lld (window %#llx+%#llx)", (long long)m->pid,
           (unsigned long long)m->base, (unsigned long long)m->size);
  return 0;
}

/* Whether process pid maps the file (dev, ino) (as /proc/<pid>/maps shows it). */
static bool maps_file(int64_t pid, dev_t dev, ino_t ino) {
  char path[64], line[512];
  snprintf(path, sizeof path, "/proc/%lld/maps", (long long)pid);
  FILE *f = fopen(path, "re");
  if (!f) return false;
  bool found = false;
  while (!found && fgets(line, sizeof line, f)) {
    unsigned maj, mnr;
    unsigned long long i;
    if (sscanf(line, "%*x-%*x %*s %*x %x:%x %llu", &maj, &mnr, &i) == 3)
      found = maj == major(dev) && mnr == minor(dev) && i == (unsigned long long)ino;
    if (!strchr(line, '\n')) /* a path longer than the line: skip the rest */
      for (int c; (c = fgetc(f)) != EOF && c != '\n';) continue;
  }
  fclose(f);
  return found;
}

/* Whether uid, on connection cfd, may register for pid the table st describes: 0,
 * CXR_EEXIST (this connection registered that table for pid) or CXR_EFULL (a bound is
 * reached: see REGS_PER_PID). *shared: another connection registered it for pid (its
 * decisions walk it already, so the pid's bound in all is not asked). */
static int reg_room(const sup *s, int cfd, uid_t uid, int64_t pid, const struct stat *st,
                    bool *shared) {
  int by_uid = 0, by_pid = 0, by_both = 0;
  size_t pid_bytes = (size_t)st->st_size, both_bytes = (size_t)st->st_size;
  *shared = false;
  for (int r = 0; r < s->nregs; r++) {
    const reg *g = &s->regs[r];
    by_uid += g->uid == uid;
    if (g->pid != pid) continue;
    if (g->dev == (uint64_t)st->st_dev && g->ino == (uint64_t)st->st_ino) {
      if (g->owner == cfd) return CXR_EEXIST;
      *shared = true;
    }
    by_pid += g->walked;
    pid_bytes += g->walked ? g->bytes : 0;
    if (g->uid != uid) continue;
    by_both++;
    both_bytes += g->bytes;
  }
  if (by_uid >= s->regs_per_uid || by_both >= REGS_PER_PID || both_bytes > PID_TABLE_BYTES)
    return CXR_EFULL;
  if (!*shared &&
      (by_pid >= PID_SHARES * REGS_PER_PID || pid_bytes > PID_SHARES * PID_TABLE_BYTES))
    return CXR_EFULL;
  return 0;
}

/* Registers table fd for m->pid, the process pidfd names (taken before any check, and
 * alive after them: every check was then of that process, not of one given its pid). */
static int add_reg(sup *s, int cfd, const cxr__cxrpcd_msg *m, int fd, int pidfd) {
  struct ucred cr;
  socklen_t len = sizeof cr;
  if (getsockopt(cfd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0) return CXR_EPERM;
  if (!supervised(s, m->pid)) return CXR_EPERM;
  if (s->nregs == s->max_regs) return CXR_EFULL;
  /* Sealed first: the registrant could otherwise shrink the file under our mapping, and
   * our next decision would die of SIGBUS walking it (and every supervised raise after it
   * fail with ENOSYS). Sealed, the size read below is the file's for good. */
  int rc = cxr__seal_fd_sealed(fd);
  if (rc) return rc;
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size <= 0 || st.st_size > (1 << 26)) return CXR_ECORRUPT;
  bool shared;
  rc = reg_room(s, cfd, cr.uid, m->pid, &st, &shared);
  if (rc) return rc;
  /* The sender took this table: it maps it (rpc's client maps its server's table before
   * its first sealed call, which is when the server registers). Anyone who could reach the
   * socket used to register a table of its own for any supervised pid, and cxrpcd then
   * refused that process's raises and unmaps wherever the table's records said. */
  if (!maps_file(m->pid, st.st_dev, st.st_ino) || gone(pidfd)) return CXR_EPERM;
  void *mem = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
  if (mem == MAP_FAILED) return cxr__from_errno(errno);
  /* Each decision checks the header again (cxr__seal_overlaps_active), reading it once. */
  rc = cxr__seal_hdr_ok(mem, (size_t)st.st_size, NULL);
  if (rc) {
    munmap(mem, (size_t)st.st_size);
    return rc;
  }
  uint64_t dev = 0, ino = 0, off = 0;
  if (m->size && cxr__vma_backing_of((int)m->pid, m->base, &dev, &ino, &off) != 0) dev = ino = 0;
  s->regs[s->nregs++] = (reg){m->pid, mem, (size_t)st.st_size,
                              {(const void *)(uintptr_t)m->base, (size_t)m->size}, dev, ino, cfd,
                              cr.uid, (uint64_t)st.st_dev, (uint64_t)st.st_ino, pidfd,
                              !shared};
  CXR_INFO("cxrpcd: seal table registered for pid %lld", (long long)m->pid);
  return 0;
}

static int on_register(sup *s, int cfd, const cxr__cxrpcd_msg *m, int fd) {
  if (fd < 0) return CXR_EPROTO;
  drop_gone_regs(s, -1); /* their places are free */
  int pidfd = (int)syscall(SYS_pidfd_open, (pid_t)m->pid, 0);
  if (pidfd < 0) return CXR_EPERM;
  int rc = add_reg(s, cfd, m, fd, pidfd);
  if (rc) close(pidfd);
  return rc;
}

static void on_client(sup *s, int i) {
  cxr__cxrpcd_msg m;
  int fd = -1, cfd = s->clients[i].fd;
  int rc = cxr__msg_recv(cfd, &m, &fd, 0);
  if (rc) {
    drop_client(s, i);
    return;
  }
  int sent;
  switch (m.type) {
    case CXR__MSG_ATTACH:
      rc = on_attach(s, cfd, &m, fd);
      if (rc == 0) fd = -1; /* kept */
      if (rc == 1) rc = 0;  /* taken over an entry that keeps its own copy */
      sent = reply(cfd, rc);
      break;
    case CXR__MSG_REGISTER:
      rc = on_register(s, cfd, &m, fd);
      if (rc == 0) s->clients[i].holds++;
      sent = reply(cfd, rc);
      break;
    case CXR__MSG_STATS: {
      cxr__cxrpcd_msg r = {.magic = CXR__CXRPCD_MAGIC, .type = CXR__MSG_REPLY,
                           .allowed = s->allowed, .refused = s->refused};
      sent = cxr__msg_send(cfd, &r, -1);
      break;
    }
    default:
      sent = reply(cfd, CXR_EPROTO);
  }
  if (fd >= 0) close(fd);
  if (sent != 0) {
    CXR_WARN("cxrpcd: a client does not read its replies (%s); dropping it", cxr_strerror(sent));
    drop_client(s, i);
    return;
  }
  s->clients[i].deadline = cxr_now_ns() + IDLE_NS;
}

/* The number of uid's connections, and in *oldest its oldest that holds no registration
 * (-1: none). */
static int count_of(const sup *s, uid_t uid, int *oldest) {
  int n = 0;
  *oldest = -1;
  for (int i = 0; i < s->nclients; i++) {
    if (s->clients[i].uid != uid) continue;
    n++;
    if (!s->clients[i].holds &&
        (*oldest < 0 || s->clients[i].deadline < s->clients[*oldest].deadline))
      *oldest = i;
  }
  return n;
}

/* Whether to poll again after the main poll failed `times` in a row with err (and waited
 * 10 ms). Only ENOMEM gets here (the other errors are ours to avoid): serve used to end at
 * the first, and with it every supervised process's raises failed for good; a shortage
 * that lasts 5 s still ends it, as a supervised thread waits for our answer meanwhile. */
static bool poll_failure(unsigned times, int err) {
  if (err != ENOMEM || times > 500) {
    CXR_ERR("cxrpcd: poll failed %u times in a row (%s); stopping", times, strerror(err));
    return false;
  }
  if (cxr__log_due(times))
    CXR_WARN("cxrpcd: poll failed (%s); trying again (%u in a row)", strerror(err), times);
  struct timespec nap = {0, 10000000};
  nanosleep(&nap, NULL);
  return true;
}

/* A new connection. A uid at its bound gives up its own oldest connection that holds no
 * registration (a fresh client of a user is served; a user who opens many waits only on
 * itself), else the new one is closed. When every one holds, those whose processes ended
 * are dropped first (the loop drops them when their pidfds are ready before its poll; a
 * process that ended since is seen on a later pass). */
static void on_accept(sup *s, int c) {
  struct ucred cr;
  socklen_t len = sizeof cr;
  if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0) {
    close(c);
    return;
  }
  int oldest, n = count_of(s, cr.uid, &oldest);
  if (n >= s->clients_per_uid && oldest < 0) {
    drop_gone_regs(s, -1);
    n = count_of(s, cr.uid, &oldest);
  }
  if (n >= s->clients_per_uid) {
    if (oldest < 0) {
      close(c);
      return;
    }
    drop_client(s, oldest);
  }
  s->clients[s->nclients++] = (client){c, cr.uid, 0, cxr_now_ns() + IDLE_NS};
}

/* Whether fd has something to read (or its peer hung up) now. */
static bool readable(int fd) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  return poll(&p, 1, 0) == 1;
}

/* Closes the clients whose time ran out; the poll timeout until the next one runs out. A
 * client whose request is waiting is not closed: it sent in time, and only our being busy
 * (a long decision) kept it unread; the loop's poll serves it next. */
static int expire(sup *s) {
  int64_t now = cxr_now_ns(), next = now + 200000000ll;
  for (int i = s->nclients - 1; i >= 0; i--) {
    if (s->clients[i].holds) continue;
    if (s->clients[i].deadline > now) {
      if (s->clients[i].deadline < next) next = s->clients[i].deadline;
    } else if (!readable(s->clients[i].fd)) { /* if readable, poll returns at once */
      drop_client(s, i);
    }
  }
  return (int)((next - now) / 1000000) + 1;
}

/* Whether descriptor fd of process tgid is a heap file registered for it. Looked up with
 * pidfd_getfd: another thread of the caller can dup2 a different file into that number
 * after we look (see the attack table), so this narrows, not closes, the alias row. */
static bool fd_names_heap(sup *s, int64_t tgid, int fd) {
  bool any = false;
  for (int r = 0; r < s->nregs; r++)
    if (s->regs[r].pid == tgid && s->regs[r].heap_ino) any = true;
  if (!any || fd < 0) return false;
  int pfd = (int)syscall(SYS_pidfd_open, (pid_t)tgid, 0);
  if (pfd < 0) return false;
  int mine = (int)syscall(SYS_pidfd_getfd, pfd, fd, 0);
  close(pfd);
  if (mine < 0) return false;
  struct stat st;
  bool heap = false;
  if (fstat(mine, &st) == 0)
    for (int r = 0; r < s->nregs && !heap; r++)
      heap = s->regs[r].pid == tgid && s->regs[r].heap_ino == (uint64_t)st.st_ino &&
             s->regs[r].heap_dev == (uint64_t)st.st_dev;
  close(mine);
  return heap;
}

static void on_alarm(int sig) { (void)sig; }

/* Receives the notification poll announced. The receive blocks while none is pending, and
 * another holder of the listener (its sender can keep a copy) can take the one we were
 * woken for: a timer interrupts the wait so the loop never stops. 0, or the errno. */
static int receive(int nfd, struct seccomp_notif *req) {
  static const struct itimerval arm = {.it_value = {.tv_usec = 50000}}, off = {{0, 0}, {0, 0}};
  memset(req, 0, sizeof *req);
  setitimer(ITIMER_REAL, &arm, NULL);
  int rc = ioctl(nfd, SECCOMP_IOCTL_NOTIF_RECV, req) == 0 ? 0 : errno;
  setitimer(ITIMER_REAL, &off, NULL);
  return rc;
}

static void on_notify(sup *s, int pi, struct seccomp_notif *req,
                      struct seccomp_notif_resp *resp) {
  proc *p = &s->procs[pi];
  int e = receive(p->nfd, req);
  if (e == ENOENT) return; /* the caller died meanwhile */
  if (e) {
    /* Only a listener someone else also reads does this (EINTR: it took ours). */
    CXR_WARN("cxrpcd: pid %lld: cannot receive (%s); no longer supervised", (long long)p->pid,
             strerror(e));
    drop_proc(s, pi); /* the loop walks the entries downwards: the moved one was seen */
    return;
  }
  int64_t tgid = tgid_of(s, req->pid);
  drop_gone_regs(s, tgid); /* a process that had its pid before */
  const void *tables[MAX_REGS];
  size_t bytes[MAX_REGS];
  cxr_range heaps[MAX_REGS];
  size_t nt = 0, nh = 0;
  for (int r = 0; r < s->nregs; r++) {
    if (s->regs[r].pid != tgid) continue;
    if (s->regs[r].walked) { /* a table several registrants hold is walked once */
      tables[nt] = s->regs[r].mem;
      bytes[nt++] = s->regs[r].bytes;
    }
    if (s->regs[r].heap.len) heaps[nh++] = s->regs[r].heap;
  }
  cxr__policy_view v = {p->wbase, p->wsize, tables, bytes, nt, heaps, nh, false};
  if (req->data.nr == SYS_mmap && (req->data.args[3] & MAP_SHARED) &&
      !(req->data.args[3] & MAP_ANONYMOUS))
    v.fd_is_heap = fd_names_heap(s, tgid, (int)req->data.args[4]);
  uint64_t args[6];
  for (int k = 0; k < 6; k++) args[k] = req->data.args[k];
  int err = cxr__policy_decide(&v, req->data.nr, args);
  memset(resp, 0, sizeof *resp);
  resp->id = req->id;
  if (err) {
    resp->error = -err;
    s->refused++;
    CXR_DEBUG("cxrpcd: refused syscall %d(%#llx, %#llx, %#llx) from %lld", req->data.nr,
              (unsigned long long)args[0], (unsigned long long)args[1],
              (unsigned long long)args[2], (long long)req->pid);
  } else {
    resp->flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
    s->allowed++;
  }
  seccomp_notify_respond(p->nfd, resp);
}

/* The uid files show whose owner this user namespace does not map (the kernel's overflow
 * uid), or -1 in the initial namespace (uid_map "0 0 4294967295"), where that uid is a real
 * user's like any other. */
static long long unmapped_uid(void) {
  unsigned long long in = 1, out = 1, count = 0;
  FILE *f = fopen("/proc/self/uid_map", "re");
  int n = f ? fscanf(f, "%llu %llu %llu", &in, &out, &count) : 0;
  if (f) fclose(f);
  if (n == 3 && in == 0 && out == 0 && count == 4294967295ull) return -1;
  long long uid = 65534; /* the kernel's default when the sysctl cannot be read */
  if ((f = fopen("/proc/sys/fs/overflowuid", "re")) != NULL) {
    if (fscanf(f, "%lld", &uid) != 1) uid = 65534;
    fclose(f);
  }
  return uid;
}

/* Whether what stands at `what` (st: its lstat) is root's or ours: 0, or CXR_EPERM (said on
 * stderr). In a user namespace that maps no root (a rootless container, Bazel's sandbox run
 * by a user) what the host's root owns shows as the overflow uid, as does what any other
 * user outside owns: its owner cannot be known from inside, so it passes with a warning
 * rather than making cxrpcd unusable there. */
static int owner_ok(const char *kind, const char *what, const struct stat *st) {
  if (st->st_uid == 0 || st->st_uid == geteuid()) return 0;
  static long long unmapped = -2;
  if (unmapped == -2) unmapped = unmapped_uid();
  if (unmapped >= 0 && st->st_uid == (uid_t)unmapped) {
    fprintf(stderr, "cxrpcd: warning: the %s %s belongs to a user outside this user namespace"
            " (uid %u here), whom cxrpcd cannot check\n", kind, what, (unsigned)st->st_uid);
    return 0;
  }
  fprintf(stderr, "cxrpcd: the %s %s belongs to uid %u (neither root nor ours), who could"
          " replace the socket or a folder on its path; not starting\n", kind, what,
          (unsigned)st->st_uid);
  return CXR_EPERM;
}

/* Whether directory dir (st: its lstat) is one only we (or root) decide the entries of: 0,
 * or CXR_EPERM (said on stderr). Its owner, or anyone who may write to it without the
 * sticky bit, can rename or unlink what stands in it and put something else there. */
static int dir_is_ours(const char *dir, const struct stat *st) {
  int rc = owner_ok("folder", dir, st);
  if (rc == 0 && (st->st_mode & (S_IWGRP | S_IWOTH)) && !(st->st_mode & S_ISVTX)) {
    fprintf(stderr, "cxrpcd: the folder %s is writable by others without the sticky bit"
            " (mode %04o); not starting\n", dir, (unsigned)(st->st_mode & 07777));
    return CXR_EPERM;
  }
  return rc;
}

/* The absolute path of the socket's directory, in dir (PATH_MAX bytes): 0 or CXR_E*. */
static int folder_of(const char *path, char *dir) {
  char cwd[PATH_MAX] = "";
  if (path[0] != '/' && !getcwd(cwd, sizeof cwd)) return cxr__from_errno(errno);
  if (snprintf(dir, PATH_MAX, "%s%s%s", cwd, cwd[0] ? "/" : "", path) >= PATH_MAX)
    return CXR_ENAMETOOLONG;
  *strrchr(dir, '/') = '\0'; /* "/s": "" (the walk checks "/" first) */
  return 0;
}

/* Puts the symlink walk[0..end) names in its place, as the kernel's walk does: its target
 * (from the folder it stands in, walk[0..start), if relative), then the rest of walk. */
static int follow(char *walk, size_t start, size_t end) {
  char link[PATH_MAX], target[PATH_MAX], rest[PATH_MAX];
  snprintf(link, sizeof link, "%.*s", (int)end, walk);
  ssize_t n = readlink(link, target, sizeof target - 1);
  if (n < 0) return cxr__from_errno(errno);
  target[n] = '\0';
  snprintf(rest, sizeof rest, "%s", walk + end);
  walk[target[0] == '/' ? 0 : start] = '\0';
  size_t used = strlen(walk);
  int len = snprintf(walk + used, PATH_MAX - used, "%s%s", target, rest);
  return len < 0 || (size_t)len >= PATH_MAX - used ? CXR_ENAMETOOLONG : 0;
}

/* Checks "/" and then each folder walk names, from the top (dir_is_ours): 0, a CXR_E*, or
 * 1 when walk[*start..*end) is a symlink (the folders above it passed). */
static int check_walk(char *walk, size_t *start, size_t *end) {
  struct stat st;
  int rc = lstat("/", &st) == 0 ? dir_is_ours("/", &st) : cxr__from_errno(errno);
  for (size_t at = 0; rc == 0; at = *end) {
    *start = at + strspn(walk + at, "/");
    *end = *start + strcspn(walk + *start, "/");
    if (*end == *start) return 0;
    char saved = walk[*end];
    walk[*end] = '\0';
    if (lstat(walk, &st) != 0) {
      fprintf(stderr, "cxrpcd: cannot check the folder %s: %s\n", walk, strerror(errno));
      rc = cxr__from_errno(errno);
    } else {
      /* A symlink's owner may re-point it even in a sticky folder (/tmp): it must be root's
       * or ours like the folders (a review found another user's link in /tmp passed). */
      if (S_ISLNK(st.st_mode)) rc = owner_ok("symlink", walk, &st) == 0 ? 1 : CXR_EPERM;
      else rc = S_ISDIR(st.st_mode) ? dir_is_ours(walk, &st) : CXR_ENOENT;
    }
    walk[*end] = saved;
  }
  return rc;
}

/* Whether the socket's directory, and every one above it up to "/", is one only we (or
 * root) decide what stands in (dir_is_ours): 0, or a CXR_E* (said on stderr). Clients check
 * the listener's uid (SO_PEERCRED: root, theirs or $CXRPC_CXRPCD_UID), but our socket would
 * still be gone. Only the socket's own directory used to be checked: the owner of one above
 * it could rename it away and put one of its own at its name. A symlink on the way is
 * followed as the kernel does (the walk starts again at "/" with its target in its place, at
 * most 40 times): the folder it stands in passed, and so must those its target names. */
static int check_dir(const char *path) {
  char walk[PATH_MAX];
  size_t start = 0, end = 0;
  int rc = folder_of(path, walk);
  for (int links = 0; rc == 0 && (rc = check_walk(walk, &start, &end)) == 1; links++) {
    if (links == 40) {
      fprintf(stderr, "cxrpcd: too many symlinks on the path of %s\n", path);
      return cxr__from_errno(ELOOP);
    }
    rc = follow(walk, start, end);
  }
  return rc;
}

/* Makes way for our socket at path: 0 if nothing is there or what is there is a socket no
 * one listens on (left by a cxrpcd that died). Another cxrpcd answering there keeps it:
 * unlinking its socket left it serving its supervised processes unreachable (their later
 * registrations reached us, and we refused them: not ours). */
static int claim_path(const struct sockaddr_un *a) {
  struct stat st;
  if (lstat(a->sun_path, &st) != 0) return errno == ENOENT ? 0 : cxr__from_errno(errno);
  if (!S_ISSOCK(st.st_mode)) {
    fprintf(stderr, "cxrpcd: %s exists and is not a socket\n", a->sun_path);
    return CXR_EEXIST;
  }
  int c = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (c < 0) return cxr__from_errno(errno);
  /* Bounded: a cxrpcd with a full client table accepts no one and its queue fills, and a
   * plain connect waited for good. A queue that stays full (EAGAIN) is one that is served. */
  int rc = cxr__connect_within(c, a, 2000000000ll);
  close(c);
  if (rc == 0 || rc == EAGAIN) {
    fprintf(stderr, "cxrpcd: another cxrpcd serves on %s; not starting\n", a->sun_path);
    return CXR_EBUSY;
  }
  if (rc != ECONNREFUSED) {
    fprintf(stderr, "cxrpcd: cannot tell whether %s is in use: %s\n", a->sun_path, strerror(rc));
    return cxr__from_errno(rc);
  }
  return unlink(a->sun_path) == 0 || errno == ENOENT ? 0 : cxr__from_errno(errno);
}

/* Binds the socket so that every user may connect (0666): cxrpcd serves them all, bounded
 * per uid, and checks each request's sender itself (SO_PEERCRED). Bound under the caller's
 * umask (022: 0755), it took connections from its own uid only (EACCES for everyone else).
 * Set through the umask, not a chmod after the bind, which would follow whatever another
 * user put at the path meanwhile. Who reaches the socket is the directory's to say, and whom
 * it reaches is not: check_dir refuses a directory others could replace the socket in, and
 * clients refuse a listener of an untrusted uid (cxr__cxrpcd_connect). */
static int bind_for_all(int fd, const struct sockaddr_un *a) {
  mode_t old = umask(0111);
  int rc = bind(fd, (const struct sockaddr *)a, sizeof *a);
  umask(old);
  return rc;
}

/* Whether any of pf[0..n) polled ready. The loop polls the registrations' pidfds so that
 * those of exited processes go (their mappings and pidfds, and their connections' places)
 * soon after the exit: they used to go only when a request asked (drop_gone_regs' callers),
 * lingering while no one registered, attached from a full uid or was notified for the pid.
 * Which ones ended is asked again (drop_gone_regs): the handlers above move entries. */
static bool any_revents(const struct pollfd *pf, int n) {
  for (int i = 0; i < n; i++)
    if (pf[i].revents) return true;
  return false;
}

/* Shortens the loop's poll timeout *ms to end by time t (ns), if t is to come. */
static void wake_by(int64_t t, int64_t now, int *ms) {
  if (t <= now) return;
  int wait = (int)((t - now) / 1000000) + 1;
  if (wait < *ms) *ms = wait;
}

static int share(int n) { return n / 4 > 1 ? n / 4 : 1; }

/* Cuts the tables to the descriptors RLIMIT_NOFILE leaves (see FD_RESERVE): a quarter
 * each for clients and registrations, half for processes (two each); a uid's share stays
 * a quarter of each. */
static void size_tables(sup *s) {
  struct rlimit rl;
  long room = MAX_CLIENTS + 2l * MAX_PROCS + MAX_REGS;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    room = (long)rl.rlim_cur - FD_RESERVE;
  long q = room / 4;
  if (q < 4) q = 4; /* a few, even at a limit this low */
  s->max_clients = q < MAX_CLIENTS ? (int)q : MAX_CLIENTS;
  s->max_procs = q < MAX_PROCS ? (int)q : MAX_PROCS;
  s->max_regs = q < MAX_REGS ? (int)q : MAX_REGS;
  s->clients_per_uid = share(s->max_clients);
  s->procs_per_uid = share(s->max_procs);
  s->regs_per_uid = share(s->max_regs);
  if (s->max_clients < MAX_CLIENTS || s->max_procs < MAX_PROCS)
    CXR_WARN("cxrpcd: RLIMIT_NOFILE %llu allows %d clients, %d processes and %d registrations"
             " (of %d, %d and %d)", (unsigned long long)rl.rlim_cur, s->max_clients,
             s->max_procs, s->max_regs, MAX_CLIENTS, MAX_PROCS, MAX_REGS);
}

int cxrpcd_serve(const char *path, volatile sig_atomic_t *stop) {
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  if (!path || strlen(path) >= sizeof a.sun_path) return CXR_EINVAL;
  strcpy(a.sun_path, path);
  int rc = check_dir(path);
  if (rc == 0) rc = claim_path(&a);
  if (rc) return rc;
  sup *s = calloc(1, sizeof *s);
  if (!s) return CXR_ENOMEM;
  size_tables(s);
  s->lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (s->lfd < 0 || bind_for_all(s->lfd, &a) != 0 || listen(s->lfd, 64) != 0) {
    rc = cxr__from_errno(errno);
    CXR_ERR("cxrpcd: cannot listen on %s: %s", path, strerror(errno));
    if (s->lfd >= 0) close(s->lfd);
    free(s);
    return rc;
  }
  /* For receive()'s timer: interrupts, never restarts, never kills. */
  struct sigaction sa = {.sa_handler = on_alarm};
  sigaction(SIGALRM, &sa, NULL);
  struct seccomp_notif *req = NULL;
  struct seccomp_notif_resp *resp = NULL;
  if (seccomp_notify_alloc(&req, &resp) != 0) {
    close(s->lfd);
    free(s);
    return CXR_ENOMEM;
  }
  static struct pollfd pf[1 + MAX_CLIENTS + MAX_PROCS + MAX_REGS];
  unsigned poll_failed = 0; /* polls failed in a row (ENOMEM: the kernel's memory) */
  while (!*stop) {
    int n = 0, ms = expire(s);
    int64_t now = cxr_now_ns(); /* one read: a pause must not end between test and wake */
    /* A full table leaves new connections in the backlog until a client goes. */
    bool accepting = s->nclients < s->max_clients && now >= s->accept_after;
    if (!accepting) wake_by(s->accept_after, now, &ms);
    pf[n++] = (struct pollfd){.fd = accepting ? s->lfd : -1, .events = POLLIN};
    for (int i = 0; i < s->nclients; i++)
      pf[n++] = (struct pollfd){.fd = s->clients[i].fd, .events = POLLIN};
    for (int i = 0; i < s->nprocs; i++)
      pf[n++] = (struct pollfd){.fd = s->procs[i].nfd, .events = POLLIN};
    int first_reg = n;
    if (now >= s->regs_after)
      for (int i = 0; i < s->nregs; i++)
        pf[n++] = (struct pollfd){.fd = s->regs[i].pidfd, .events = POLLIN};
    else
      wake_by(s->regs_after, now, &ms);
    int r = poll(pf, (nfds_t)n, ms);
    if (r < 0 && errno != EINTR && !poll_failure(++poll_failed, errno)) break;
    if (r >= 0) poll_failed = 0;
    if (r <= 0) continue;
    /* Notifications first: a supervised thread is blocked until we answer. */
    int nc = s->nclients;
    for (int i = s->nprocs - 1; i >= 0; i--) {
      short ev = pf[1 + nc + i].revents;
      if (ev & POLLIN) on_notify(s, i, req, resp);
      else if (ev & (POLLHUP | POLLERR | POLLNVAL)) { /* every supervised task exited */
        CXR_INFO("cxrpcd: pid %lld and its children are gone", (long long)s->procs[i].pid);
        drop_proc(s, i);
      }
    }
    for (int i = nc - 1; i >= 0; i--)
      if (pf[1 + i].revents) on_client(s, i);
    if (any_revents(pf + first_reg, n - first_reg)) drop_gone_regs(s, -1);
    if (pf[0].revents & POLLIN) {
      int c = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK); /* see reply() */
      if (c >= 0) {
        on_accept(s, c);
      } else if (errno == EMFILE || errno == ENFILE) {
        /* The connection stays queued and the socket readable: polling it again at once
         * only spins. Wait for descriptors to come free (clients expire within 1 s). */
        CXR_WARN("cxrpcd: cannot accept (%s); pausing 100 ms", strerror(errno));
        s->accept_after = cxr_now_ns() + 100000000ll;
      }
    }
  }
  while (s->nclients) drop_client(s, 0);
  while (s->nprocs) drop_proc(s, 0);
  for (unsigned i = 0; i < 64; i++)
    if (s->tcache[i].tid > 0) close(s->tcache[i].pidfd);
  close(s->lfd);
  unlink(path);
  seccomp_notify_free(req, resp);
  free(s);
  return 0;
}

int cxrpcd_run(const char *path, char **argv) {
  if (!path || !argv || !argv[0]) return CXR_EINVAL;
  uintptr_t wbase;
  size_t wsize;
  cxr__sbx_window(&wbase, &wsize);
  int s = cxr__cxrpcd_connect(path, 5000000000ll);
  if (s < 0) {
    fprintf(stderr, "cxrpcd run: no supervisor at %s (%s)\n", path, cxr_strerror(s));
    return s;
  }
  int nfd = cxr__enforce_filter_load(wbase, wsize);
  if (nfd < 0) {
    fprintf(stderr, "cxrpcd run: cannot install the seccomp filter (%s)\n", cxr_strerror(nfd));
    return nfd;
  }
  cxr__cxrpcd_msg m = {.magic = CXR__CXRPCD_MAGIC, .type = CXR__MSG_ATTACH, .pid = getpid(),
                       .base = wbase, .size = wsize};
  int rc = cxr__msg_send(s, &m, nfd);
  if (!rc) rc = cxr__msg_recv(s, &m, NULL, 5000000000ll);
  if (!rc) rc = m.type == CXR__MSG_REPLY ? m.status : CXR_EPROTO;
  close(nfd);
  close(s);
  if (rc) {
    fprintf(stderr, "cxrpcd run: the supervisor refused: %s\n", cxr_strerror(rc));
    return rc;
  }
  setenv("CXRPC_ENFORCED", "1", 1); /* tells the program (and its children) it is supervised */
  execvp(argv[0], argv);
  fprintf(stderr, "cxrpcd run: cannot exec %s: %s\n", argv[0], strerror(errno));
  return CXR_ENOENT;
}

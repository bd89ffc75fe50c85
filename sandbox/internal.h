/* Private to sandbox/ and tools/cxrpcd: the shared seal-table layout, the window, the
 * enforcement policy and the supervisor's wire protocol. Not a public header. */
#ifndef CXRPC_SANDBOX_INTERNAL_H
#define CXRPC_SANDBOX_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cxrpc/sandbox.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CXR__PAGE 4096u

#ifdef __cplusplus
#define CXR__ATOMIC(T) T /* C++ (tests) never touches these fields directly */
#else
#include <stdatomic.h>
#define CXR__ATOMIC(T) _Atomic T
#endif

/* ---- the address window (same parsing and defaults as shm's cxr_init) ---- */
/* $CXRPC_WINDOW ("0xLO-0xHI", cxr__parse_window) or [0x6000_0000_0000, 0x7000_0000_0000);
 * a bad one is warned about and the default used. */
int cxr__sbx_window(uintptr_t *base, size_t *size);
/* Fault containment's set-up: the process's SIGSEGV/SIGBUS handlers (once) and this thread's
 * alternate signal stack. cxr_sandbox_run does it on first use; cxr_sandbox_restrict_thread
 * does it before its filter forbids sigaction. 0 or CXR_EIO/CXR_ENOMEM. */
int cxr__sandbox_prepare(void);

/* ---- the seal table in shared memory (written only by the receiver) ---- */
#define CXR__SEAL_MAGIC 0x4c41455352584321ull /* "!CXRSEAL" */
#define CXR__SEAL_VERSION 1u

enum { CXR__SEAL_FREE = 0, CXR__SEAL_CLAIM = 1, CXR__SEAL_ACTIVE = 2, CXR__SEAL_DONE = 3 };

/* state word: generation << 8 | state. The generation is the sender's, from the seal id. */
typedef struct cxr__seal_rec {
  CXR__ATOMIC(uint64_t) state;
  CXR__ATOMIC(uint64_t) addr;
  CXR__ATOMIC(uint64_t) len;
  uint64_t pad;
} cxr__seal_rec;

typedef struct cxr__seal_hdr {
  uint64_t magic;
  uint32_t version;
  uint32_t slots;
  uint64_t bytes;
  uint64_t pad[5];
} cxr__seal_hdr;

static inline size_t cxr__seal_bytes(unsigned slots) {
  size_t b = sizeof(cxr__seal_hdr) + (size_t)slots * sizeof(cxr__seal_rec);
  return (b + CXR__PAGE - 1) & ~(size_t)(CXR__PAGE - 1);
}
static inline cxr__seal_rec *cxr__seal_recs(const void *hdr) {
  return (cxr__seal_rec *)((char *)hdr + sizeof(cxr__seal_hdr));
}
/* Validates a mapped table header against `bytes`, the size of the mapping (the supervisor
 * and the sender read bytes the receiver can rewrite at any time): each field is read once,
 * and on 0 *slots (may be NULL) is the checked slot count, the only one to use after. */
int cxr__seal_hdr_ok(const void *mem, size_t bytes, uint32_t *slots);
/* 0 if the table file fd carries every seal cxr_seal_table_create puts on it (above all
 * F_SEAL_SHRINK: a reader maps the table for as long as it holds it, and a file shrunk
 * under a mapping makes each access to the lost pages fault); CXR_ENOTSEALED if not (also
 * for a file that cannot be sealed), or another CXR_E* if fcntl fails. */
int cxr__seal_fd_sealed(int fd);
/* Receiver: every record back to free and the peer (and cxrpcd registration) dropped, for
 * the next tenant of a connection slot. */
int cxr__seal_table_reset(cxr_seal_table *t);

/* true if an active (or being-claimed) record of the table overlaps [a, a + n). */
bool cxr__seal_overlaps_active(const void *mem, size_t bytes, uint64_t a, uint64_t n);

/* ---- verification of the sender's pages (PROCMAP_QUERY on /proc/PID/maps) ---- */
/* _IOWR('f', 17, struct procmap_query) (104 bytes), from linux/fs.h 6.11 */
#define CXR__PROCMAP_QUERY_NR 0xc0686611u
/* 0 if every page of [a, a + n) is mapped shared and not writable in the process whose
 * maps file is `maps_fd`, backed by (dev, ino) at file offset `off` for a (checked when
 * ino != 0); CXR_ENOTSEALED if not; CXR_ENOSYS if the kernel has no PROCMAP_QUERY. */
int cxr__vma_verify_sealed(int maps_fd, uint64_t a, uint64_t n, uint64_t dev, uint64_t ino,
                           uint64_t off);
/* The backing (dev, ino, file offset of a) of our own mapping at a. */
int cxr__vma_backing(uint64_t a, uint64_t *dev, uint64_t *ino, uint64_t *off);
/* The same for process pid (0: ourselves). */
int cxr__vma_backing_of(int pid, uint64_t a, uint64_t *dev, uint64_t *ino, uint64_t *off);

/* ---- the enforcement policy (cxrpcd decides with this) ---- */
typedef struct cxr__policy_view {
  uintptr_t wbase;
  size_t wsize;
  /* tables registered for the calling process */
  const void *const *tables;
  const size_t *table_bytes;
  size_t ntables;
  /* heaps registered for the calling process (shared mappings only at their own offsets) */
  const cxr_range *heaps;
  size_t nheaps;
  /* for a shared file mmap: the supervisor found the fd to name a registered heap file
   * (looked up with pidfd_getfd; a racing dup2 can fool it, see tests/sandbox/README.md) */
  bool fd_is_heap;
} cxr__policy_view;

/* 0 to let the syscall run, or a positive errno (EPERM) to refuse it. `nr` is the x86-64
 * syscall number, args its six arguments. */
int cxr__policy_decide(const cxr__policy_view *v, int nr, const uint64_t args[6]);

/* ---- the launcher's seccomp filter ---- */
/* Loads on the calling process (all threads) the filter that notifies the supervisor, and
 * returns the notification fd (>= 0) or a negative CXR_E*. */
int cxr__enforce_filter_load(uintptr_t wbase, size_t wsize);
/* Same rules, exported as BPF text (for tests and docs). */
int cxr__enforce_filter_rules(uintptr_t wbase, size_t wsize, void *scmp_ctx);

/* ---- cxrpcd wire protocol (SOCK_SEQPACKET on a Unix socket) ---- */
#define CXR__CXRPCD_MAGIC 0x4458435250524358ull
enum {
  CXR__MSG_ATTACH = 1,    /* launcher -> supervisor, with the notify fd: pid, window */
  CXR__MSG_REGISTER = 2,  /* receiver -> supervisor, with the table memfd: pid, heap */
  CXR__MSG_REPLY = 3,     /* supervisor -> client: status (0 or CXR_E*) */
  CXR__MSG_STATS = 4,     /* anyone -> supervisor: decisions so far */
};
typedef struct cxr__cxrpcd_msg {
  uint64_t magic;
  uint32_t type;
  int32_t status;
  int64_t pid;
  uint64_t base, size;        /* ATTACH: window; REGISTER: heap */
  uint64_t allowed, refused;  /* STATS reply */
} cxr__cxrpcd_msg;

/* Sends/receives one message with at most one fd. 0 or a negative CXR_E*. */
int cxr__msg_send(int sock, const cxr__cxrpcd_msg *m, int fd);
int cxr__msg_recv(int sock, cxr__cxrpcd_msg *m, int *fd, int64_t timeout_ns);
/* The supervisor's socket path: explicit, else $CXRPC_CXRPCD, else cxrpcd.sock in the
 * process's pod root (cxr_root(): cxr_init_opts.root, $CXRPC_ROOT, /dev/shm/cxrpc). */
int cxr__cxrpcd_path(const char *explicit_path, char *out, size_t cap);
int cxr__cxrpcd_connect(const char *path, int64_t timeout_ns);
/* A connect that waits for room in a full accept queue at most wait_ns (SO_SNDTIMEO bounds
 * that wait for Unix sockets; a non-blocking connect cannot be polled for it, it fails with
 * EAGAIN at once). A cxrpcd whose client table is full accepts no one, and its queue fills:
 * a plain connect then waited for good (cxrpcd checks its path that way too). 0, or the
 * errno (EAGAIN: the wait ran out). */
struct sockaddr_un;
int cxr__connect_within(int s, const struct sockaddr_un *a, int64_t wait_ns);

#ifdef __cplusplus
}
#endif
#endif

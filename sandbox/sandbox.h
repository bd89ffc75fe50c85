/*
 * cxrpc/sandbox.h: seals, releases, fault containment, range checks, memory domains and
 * seccomp policies for sandbox threads.
 *
 * This layer knows regions and processes, not connections: the rpc layer owns one seal
 * table per connection and wraps it (cxr_conn_seal, cxr_conn_release,
 * cxr_call_check_sealed). Everything here is usable on its own with any shared memory.
 *
 * Seals. The sender makes the pages holding a call's arguments read-only
 * (cxr_seal_table_seal) and names the seal in the call (a cxr_seal_id). A seal record
 * (address, length, state) lives in a seal table: a sealed memfd the receiver maps
 * read-write and the sender can only map read-only (the kernel refuses any writable
 * mapping or write() of it after the receiver seals the file). The receiver checks the seal
 * before it trusts the data (cxr_seal_table_check: records it as active, then asks the
 * kernel whether the sender's pages really are read-only: CXR_ENOTSEALED if not), and
 * marks it done (cxr_seal_table_done). Only then does the sender's release
 * (cxr_seal_table_release) restore write access; releases are batched (threshold
 * release_batch) so the permission changes are amortized.
 *
 * Modes. Cooperative (default): the library seals with mprotect; protects against bugs, not
 * against a sender that calls mprotect itself. Enforced: the sender runs under
 * `cxrpcd run -- PROGRAM`; a seccomp filter sends every raise of permissions, remap, unmap
 * or fixed mapping inside the address window to the cxrpcd supervisor, which refuses
 * (EPERM) any that touches an active seal. The receiver registers the table with the
 * supervisor (cxr_seal_table_enforce). See docs/sandbox.md and the attack table in
 * tests/sandbox/README.md for what is and is not closed.
 *
 * Sandboxes. cxr_sandbox_run runs a function so that SIGSEGV/SIGBUS inside it becomes
 * CXR_EBADPTR (per-thread flag, sigsetjmp/siglongjmp on an alternate signal stack);
 * cxr_range_check is what validators and handlers call before following a peer's pointer;
 * cxr_domain_* uses protection keys where the CPU has them (detected at run time);
 * cxr_sandbox_restrict_thread puts a worker thread under a seccomp allow-list.
 *
 * Thread safety: a seal table handle may be used from many threads. cxr_sandbox_run is
 * per-thread and may nest.
 */
#ifndef CXRPC_SANDBOX_H
#define CXRPC_SANDBOX_H

#include <cxrpc/base.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A byte range [p, p + len). (Also declared by <cxrpc/rpc.h>; both use this guard.) */
#ifndef CXR_RANGE_DEFINED
#define CXR_RANGE_DEFINED
typedef struct cxr_range {
  const void *p;
  size_t len;
} cxr_range;
#endif

/* ---- seal tables ---- */

typedef struct cxr_seal_table cxr_seal_table;  /* one process's handle on a shared table */
/* A seal's name in a call descriptor: generation << 20 | slot. Never 0 (generations start
 * at 1), so 0 can mean "not sealed". */
typedef uint32_t cxr_seal_id;
#define CXR_SEAL_SLOTS_MAX (1u << 20)

typedef struct cxr_seal_opts {
  unsigned slots;          /* records in the table (seals in flight); default 1024, at most
                              CXR_SEAL_SLOTS_MAX */
  unsigned release_batch;  /* releases gathered before write access comes back in one
                              sweep; default 1024; 1 = every release at once; at most
                              CXR_SEAL_SLOTS_MAX */
  uintptr_t addr;          /* where to map the table (MAP_FIXED_NOREPLACE); 0 = anywhere.
                              A sender under cxrpcd must map it inside the window. */
} cxr_seal_opts;
void cxr_seal_opts_init(cxr_seal_opts *o);

/* Receiver: a new table in a sealed memfd, mapped read-write. */
int cxr_seal_table_create(cxr_seal_table **t, const cxr_seal_opts *o);
/* The table's memfd, to pass to the sender (SCM_RIGHTS or inheritance). Owned by t. */
int cxr_seal_table_fd(const cxr_seal_table *t);
/* Sender: maps the table read-only from the receiver's fd (dup'ed; the caller keeps fd). */
int cxr_seal_table_attach(cxr_seal_table **t, int fd, const cxr_seal_opts *o);
/* Unmaps; a sender first sweeps pending releases (seals never released stay read-only). */
void cxr_seal_table_close(cxr_seal_table *t);

/* Receiver: the sender's process and the heap its arguments must lie in. Without a peer
 * the check cannot ask the kernel about the sender's pages and trusts the claim. */
int cxr_seal_table_set_peer(cxr_seal_table *t, int sender_pid, const void *heap_base,
                            size_t heap_size);
/* Receiver, enforced mode: registers the table with the cxrpcd supervisor at `socket`
 * (NULL: $CXRPC_CXRPCD or <root>/cxrpcd.sock) for the peer set above. Returns CXR_EPERM if
 * the supervisor does not supervise that process or listens as a uid not root's, ours or
 * $CXRPC_CXRPCD_UID's, CXR_ENOTCONN if none answers. The registration lasts until the
 * table is closed. */
int cxr_seal_table_enforce(cxr_seal_table *t, const char *socket);
bool cxr_seal_table_enforced(const cxr_seal_table *t);

/* Sender: makes [p, p + len) (p page-aligned, len rounded up to pages) read-only and
 * reserves a record for it. CXR_EBUSY if it overlaps a seal still in force; CXR_EFULL if
 * every slot is in use. */
int cxr_seal_table_seal(cxr_seal_table *t, const void *p, size_t len, cxr_seal_id *id);
/* Sender: the receiver is done; write access comes back at the next batch sweep (at once
 * if release_batch is 1). CXR_EPERM while the receiver has not marked it (or a late
 * check of an earlier seal of its slot) done;
 * CXR_EAGAIN if the receiver has not checked it yet (see cancel). Pages released but not
 * yet swept stay read-only: call cxr_seal_table_flush before writing them again. */
int cxr_seal_table_release(cxr_seal_table *t, cxr_seal_id id);
/* Sender: restores write access to every released page now. */
int cxr_seal_table_flush(cxr_seal_table *t);
/* Sender: ends a seal the receiver never checked (the call failed or was cancelled before
 * it arrived). CXR_EPERM if the receiver holds it (or its slot, under an earlier seal's
 * id) as active, unless the peer is dead (cxr_seal_table_peer_dead). Write access comes
 * back at once. */
int cxr_seal_table_cancel(cxr_seal_table *t, cxr_seal_id id);
/* Sender: the receiver died; every seal may be released. */
void cxr_seal_table_peer_dead(cxr_seal_table *t);
/* Sender: the page range a seal covers (for the call descriptor). */
int cxr_seal_table_range(const cxr_seal_table *t, cxr_seal_id id, cxr_range *out);

/* Receiver: [p, p + len) is claimed sealed under `id`. Records the seal as active, then
 * verifies it: within the peer's heap (CXR_EBADPTR if not), the sender's pages read-only
 * and shared with ours (CXR_ENOTSEALED if not), the slot not already active (CXR_EBUSY).
 * Returns 0 when the data can be trusted until cxr_seal_table_done. */
int cxr_seal_table_check(cxr_seal_table *t, cxr_seal_id id, const void *p, size_t len);
/* Receiver: finished with the data; the sender may release. */
int cxr_seal_table_done(cxr_seal_table *t, cxr_seal_id id);

typedef struct cxr_seal_stats {
  uint64_t seals, releases, sweeps, mprotects, checks, not_sealed;
  unsigned live, pending;
} cxr_seal_stats;
int cxr_seal_table_stats(const cxr_seal_table *t, cxr_seal_stats *out);

/* ---- fault containment ---- */

/* Runs fn(arg) on this thread so that a SIGSEGV or SIGBUS inside it ends it with
 * CXR_EBADPTR instead of killing the process; otherwise returns fn's result. Faults outside
 * a sandbox go to the handler that was there before (or kill as usual). fn must not hold
 * locks or own resources across the faulting access: it is abandoned (siglongjmp). */
int cxr_sandbox_run(int (*fn)(void *arg), void *arg);
/* The address of the last contained fault on this thread (for logs). */
void *cxr_sandbox_fault_addr(void);
/* Contained faults in this process so far. */
uint64_t cxr_sandbox_faults(void);

/* ---- range checks (validators and handlers call these before following a pointer) ---- */

/* 0 if [p, p + len) lies inside r and p is a multiple of align (0 or 1: any);
 * CXR_EBADPTR otherwise (NULL, overflow, outside, misaligned). */
int cxr_range_check(const cxr_range *r, const void *p, size_t len, size_t align);

/* ---- memory domains (protection keys where the CPU has them) ---- */

/* true if pkey_alloc works here (checked once). */
bool cxr_domain_supported(void);
/* Puts [p, p + len) (page-aligned) in the private domain: inside cxr_sandbox_run it can
 * be neither read nor written (a fault, contained as CXR_EBADPTR). CXR_ENOSYS without
 * pkeys: then only cxr_range_check keeps handlers out of private memory. */
int cxr_domain_protect(void *p, size_t len);

/* ---- seccomp policy for sandbox worker threads ---- */

/* Puts the calling thread (only it) under an allow-list: memory allocation, futexes,
 * clocks, read/write on descriptors it already has, signals, exit. Everything else (open,
 * socket, exec, mprotect, fork, ptrace, ...) fails with EPERM. Irreversible. */
int cxr_sandbox_restrict_thread(void);

#ifdef __cplusplus
}
#endif
#endif

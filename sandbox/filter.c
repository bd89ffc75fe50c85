/*
 * The launcher's seccomp filter (enforced mode). BPF sees only scalars, so rules test the
 * first argument against aligned power-of-two blocks covering the window (plus a 4 GiB
 * guard below it, and any length over 4 GiB, for ranges that start below and reach in);
 * the supervisor then decides exactly with the policy in policy.c. Lowering permissions
 * (sealing) is never sent: it stays a direct ~0.5 us call.
 *
 * Refused here outright, without a round trip: ptrace, process_vm_writev, remap_file_pages
 * and shmat(SHM_REMAP). Shared file
 * mappings outside the window go to the supervisor too, which refuses those of a
 * registered heap file (the library's own, such as the pod registry, pass).
 */
#include <errno.h>
#include <seccomp.h>
#include <sys/mman.h>
#include <sys/shm.h>

#include "sandbox/internal.h"
#include "shm/log.h"

#define GUARD (1ull << 32)
#define BIG (1ull << 32)

/* Calls fn for each aligned power-of-two block of [lo, hi). */
static int for_blocks(uint64_t lo, uint64_t hi, int (*fn)(void *, uint64_t, uint64_t), void *u) {
  while (lo < hi) {
    uint64_t sz = lo ? (lo & -lo) : (1ull << 62);
    while (sz > hi - lo) sz >>= 1;
    int rc = fn(u, lo, sz);
    if (rc) return rc;
    lo += sz;
  }
  return 0;
}

typedef struct rule_ctx {
  scmp_filter_ctx c;
  int nr;
  int extra_arg; /* -1 none */
  uint64_t extra_mask, extra_val;
  unsigned arg; /* which argument holds the address */
} rule_ctx;

static int add_block(void *u, uint64_t base, uint64_t sz) {
  rule_ctx *r = u;
  struct scmp_arg_cmp addr = SCMP_CMP(r->arg, SCMP_CMP_MASKED_EQ, ~(sz - 1), base);
  if (r->extra_arg < 0) return seccomp_rule_add(r->c, SCMP_ACT_NOTIFY, r->nr, 1, addr);
  struct scmp_arg_cmp x = SCMP_CMP((unsigned)r->extra_arg, SCMP_CMP_MASKED_EQ, r->extra_mask,
                                   r->extra_val);
  return seccomp_rule_add(r->c, SCMP_ACT_NOTIFY, r->nr, 2, addr, x);
}

/* NOTIFY for syscall nr when argument `arg` lies in [lo, hi) (and the extra test holds). */
static int notify_in(scmp_filter_ctx c, int nr, unsigned arg, uint64_t lo, uint64_t hi,
                     int extra_arg, uint64_t mask, uint64_t val) {
  rule_ctx r = {c, nr, extra_arg, mask, val, arg};
  return for_blocks(lo, hi, add_block, &r);
}

int cxr__enforce_filter_rules(uintptr_t wbase, size_t wsize, void *ctx) {
  scmp_filter_ctx c = ctx;
  uint64_t lo = wbase, hi = wbase + wsize, glo = wbase > GUARD ? wbase - GUARD : 0;
  int rc = 0;
#define TRY(x) \
  if ((rc = (x)) != 0) return rc
  /* Raises of permissions: write or exec bit set, addressed in the window or guard. */
  int raises[] = {SCMP_SYS(mprotect), SCMP_SYS(pkey_mprotect)};
  for (int i = 0; i < 2; i++) {
    TRY(notify_in(c, raises[i], 0, glo, hi, 2, PROT_WRITE, PROT_WRITE));
    TRY(notify_in(c, raises[i], 0, glo, hi, 2, PROT_EXEC, PROT_EXEC));
    TRY(seccomp_rule_add(c, SCMP_ACT_NOTIFY, raises[i], 2, SCMP_A1(SCMP_CMP_GT, BIG),
                         SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_WRITE, PROT_WRITE)));
    TRY(seccomp_rule_add(c, SCMP_ACT_NOTIFY, raises[i], 2, SCMP_A1(SCMP_CMP_GT, BIG),
                         SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_EXEC, PROT_EXEC)));
  }
  /* Unmaps, advice (MADV_REMOVE punches holes in the shared file) and remaps. */
  int ranged[] = {SCMP_SYS(munmap), SCMP_SYS(madvise), SCMP_SYS(mremap)};
  for (int i = 0; i < 3; i++) {
    TRY(notify_in(c, ranged[i], 0, glo, hi, -1, 0, 0));
    TRY(seccomp_rule_add(c, SCMP_ACT_NOTIFY, ranged[i], 1, SCMP_A1(SCMP_CMP_GT, BIG)));
  }
  TRY(notify_in(c, SCMP_SYS(mremap), 4, lo, hi, -1, 0, 0)); /* MREMAP_FIXED into the window */
  /* mmap: anything addressed in the window; fixed mappings from the guard or of huge
   * length that could reach it; shared file mappings outside it (is it a heap file?). */
  const uint64_t S = MAP_SHARED, F = MAP_FIXED, A = MAP_ANONYMOUS;
  TRY(notify_in(c, SCMP_SYS(mmap), 0, lo, hi, -1, 0, 0));
  TRY(notify_in(c, SCMP_SYS(mmap), 0, glo, lo, 3, S | F, F));         /* private fixed */
  TRY(notify_in(c, SCMP_SYS(mmap), 0, glo, lo, 3, S | A | F, S | A | F)); /* shared anon */
  TRY(seccomp_rule_add(c, SCMP_ACT_NOTIFY, SCMP_SYS(mmap), 2, SCMP_A1(SCMP_CMP_GT, BIG),
                       SCMP_A3(SCMP_CMP_MASKED_EQ, S | F, F)));
  TRY(seccomp_rule_add(c, SCMP_ACT_NOTIFY, SCMP_SYS(mmap), 2, SCMP_A1(SCMP_CMP_GT, BIG),
                       SCMP_A3(SCMP_CMP_MASKED_EQ, S | A | F, S | A | F)));
  TRY(seccomp_rule_add(c, SCMP_ACT_NOTIFY, SCMP_SYS(mmap), 2, SCMP_A0(SCMP_CMP_LT, lo),
                       SCMP_A3(SCMP_CMP_MASKED_EQ, S | A, S)));
  TRY(seccomp_rule_add(c, SCMP_ACT_NOTIFY, SCMP_SYS(mmap), 2, SCMP_A0(SCMP_CMP_GE, hi),
                       SCMP_A3(SCMP_CMP_MASKED_EQ, S | A, S)));
  /* Remaps the library never makes, refused outright: remap_file_pages points a writable
   * page of a shared mapping at any offset of its file (the sealed page's, say), and
   * shmat(SHM_REMAP) replaces a mapping in place. */
  TRY(seccomp_rule_add(c, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(remap_file_pages), 0));
  TRY(seccomp_rule_add(c, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(shmat), 1,
                       SCMP_A2(SCMP_CMP_MASKED_EQ, SHM_REMAP, SHM_REMAP)));
  /* Writing another process's (or, through a child, our own) memory. */
  TRY(seccomp_rule_add(c, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ptrace), 0));
  TRY(seccomp_rule_add(c, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(process_vm_writev), 0));
#undef TRY
  return 0;
}

int cxr__enforce_filter_load(uintptr_t wbase, size_t wsize) {
  if (wsize == 0 || wbase + wsize < wbase) return CXR_EINVAL;
  scmp_filter_ctx c = seccomp_init(SCMP_ACT_ALLOW);
  if (!c) return CXR_ENOMEM;
  int rc = cxr__enforce_filter_rules(wbase, wsize, c);
  if (rc == 0) rc = seccomp_load(c);
  int fd = rc == 0 ? seccomp_notify_fd(c) : -1;
  seccomp_release(c);
  if (rc) {
    CXR_ERR("seccomp filter: %d", rc);
    return rc == -ENOSYS || rc == -EOPNOTSUPP ? CXR_ENOSYS : CXR_EIO;
  }
  return fd >= 0 ? fd : CXR_EIO;
}

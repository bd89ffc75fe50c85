/*
 * The seccomp allow-list for sandbox worker threads: what a handler needs (allocate
 * memory, wait on futexes, read clocks, read and write descriptors it already holds,
 * signals, exit) and nothing that reaches new resources or changes protections. The
 * default is EPERM, not a kill, so a hostile handler's attempt is an error the server
 * survives. Loaded without TSYNC: only the calling thread is restricted.
 */
#include <errno.h>
#include <seccomp.h>
#include <sys/mman.h>

#include "sandbox/internal.h"
#include "shm/log.h"

static const int allowed[] = {
    SCMP_SYS(read), SCMP_SYS(write), SCMP_SYS(readv), SCMP_SYS(writev), SCMP_SYS(pread64),
    SCMP_SYS(pwrite64), SCMP_SYS(preadv), SCMP_SYS(pwritev), SCMP_SYS(close), SCMP_SYS(lseek),
    SCMP_SYS(fstat), SCMP_SYS(newfstatat), SCMP_SYS(futex), SCMP_SYS(set_robust_list),
    SCMP_SYS(get_robust_list), SCMP_SYS(clock_gettime), SCMP_SYS(clock_getres),
    SCMP_SYS(clock_nanosleep), SCMP_SYS(nanosleep), SCMP_SYS(gettimeofday), SCMP_SYS(time),
    SCMP_SYS(sched_yield), SCMP_SYS(sched_getaffinity), SCMP_SYS(getcpu), SCMP_SYS(getpid),
    SCMP_SYS(gettid), SCMP_SYS(getppid), SCMP_SYS(getuid), SCMP_SYS(geteuid),
    SCMP_SYS(getgid), SCMP_SYS(getegid), SCMP_SYS(getrandom), SCMP_SYS(rseq),
    SCMP_SYS(restart_syscall), SCMP_SYS(exit), SCMP_SYS(exit_group), SCMP_SYS(rt_sigreturn),
    SCMP_SYS(rt_sigprocmask), SCMP_SYS(sigaltstack), SCMP_SYS(tgkill), SCMP_SYS(tkill),
    SCMP_SYS(brk), SCMP_SYS(munmap), SCMP_SYS(madvise), SCMP_SYS(mremap),
    SCMP_SYS(membarrier), SCMP_SYS(poll), SCMP_SYS(ppoll), SCMP_SYS(epoll_wait),
    SCMP_SYS(epoll_pwait), SCMP_SYS(select), SCMP_SYS(pselect6), SCMP_SYS(sched_getparam),
    SCMP_SYS(sched_getscheduler),
};

int cxr_sandbox_restrict_thread(void) {
  /* What the sandbox sets up once per process (fault handlers, the protection-key probe)
   * or per thread (the alternate signal stack) needs system calls this policy forbids:
   * done first, or a restricted thread that is the first to use them would fail for the
   * whole process (sigaction refused: every cxr_sandbox_run CXR_EIO). */
  int prep = cxr__sandbox_prepare();
  if (prep) return prep;
  (void)cxr_domain_supported();
  scmp_filter_ctx c = seccomp_init(SCMP_ACT_ERRNO(EPERM));
  if (!c) return CXR_ENOMEM;
  int rc = 0;
  for (size_t i = 0; i < sizeof allowed / sizeof allowed[0] && !rc; i++)
    rc = seccomp_rule_add(c, SCMP_ACT_ALLOW, allowed[i], 0);
  /* The one ioctl a worker needs: asking the kernel about a sealer's pages (vma.c). */
  if (!rc)
    rc = seccomp_rule_add(c, SCMP_ACT_ALLOW, SCMP_SYS(ioctl), 1,
                          SCMP_A1(SCMP_CMP_EQ, (uint64_t)CXR__PROCMAP_QUERY_NR));
  /* Memory, but never executable: no new code. */
  if (!rc)
    rc = seccomp_rule_add(c, SCMP_ACT_ALLOW, SCMP_SYS(mmap), 1,
                          SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_EXEC, 0));
  if (!rc) rc = seccomp_attr_set(c, SCMP_FLTATR_CTL_TSYNC, 0);
  if (!rc) rc = seccomp_load(c);
  seccomp_release(c);
  if (rc) {
    CXR_ERR("sandbox thread policy: %d", rc);
    return CXR_EIO;
  }
  return 0;
}

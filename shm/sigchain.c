/* Fault handlers in front of earlier ones: see sigchain.h. */
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shm/sigchain.h"

int cxr__sig_install(int sig, void (*fn)(int, siginfo_t *, void *), struct sigaction *old) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = fn;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  return sigaction(sig, &sa, old);
}

void cxr__sig_chain(const struct sigaction *old, int sig, siginfo_t *info, void *uc) {
  if ((old->sa_flags & SA_SIGINFO) && old->sa_sigaction) {
    old->sa_sigaction(sig, info, uc);
    return;
  }
  if (old->sa_handler != SIG_DFL && old->sa_handler != SIG_IGN) {
    old->sa_handler(sig);
    return;
  }
  /* The default action (an ignored fault would be retried for good). A thread whose
   * seccomp policy refuses rt_sigaction (a sandbox worker) cannot restore it, and would
   * fault again for good: it ends the process, as the default action would have. */
  if (signal(sig, SIG_DFL) == SIG_ERR) {
    static const char msg[] = "cxrpc: fatal fault, and the default action cannot be restored\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    syscall(SYS_exit_group, 128 + sig);
  }
  if (info->si_code <= 0) raise(sig);
}

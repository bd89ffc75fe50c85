/* Private (shm/ and sandbox/): installing a fault handler in front of the one already there,
 * and handing it the faults the new one does not take. The sandbox's fault containment and
 * shm's SIGBUS guard both sit in front of whatever was installed before them (a sanitizer's
 * handler, UCX's, the application's, or the default action). */
#ifndef CXRPC_SHM_SIGCHAIN_H
#define CXRPC_SHM_SIGCHAIN_H

#include <signal.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Installs fn for sig (SA_SIGINFO, on the alternate stack when the thread has one, and
 * SA_NODEFER so that a handler can leave by siglongjmp without a mask syscall); the handler
 * found there goes to *old. 0, or -1 with errno. */
int cxr__sig_install(int sig, void (*fn)(int, siginfo_t *, void *), struct sigaction *old);

/* Hands a fault to the handler `old` (from cxr__sig_install). If that was the default action,
 * restores it: the faulting access comes again and kills as usual (a signal sent with kill
 * is raised again). Async-signal-safe. */
void cxr__sig_chain(const struct sigaction *old, int sig, siginfo_t *info, void *uc);

#ifdef __cplusplus
}
#endif
#endif

/*
 * Fault containment: a SIGSEGV or SIGBUS raised while this thread runs inside
 * cxr_sandbox_run jumps back to its entry, which returns CXR_EBADPTR. The handler runs on
 * an alternate signal stack (a fault may come from an exhausted stack) and with SA_NODEFER,
 * so the jump needs no signal-mask syscall: entering and leaving costs a sigsetjmp and two
 * thread-local stores. Faults outside a sandbox go to the previous handler (a sanitizer's,
 * or the default action, which kills as usual).
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sandbox/domain.h"
#include "sandbox/internal.h"
#include "shm/log.h"
#include "shm/sigchain.h"

#define ALTSTACK_BYTES (64 * 1024)

typedef struct frame {
  sigjmp_buf jb;
  struct frame *prev;
  uint32_t pkru; /* protection-key rights to restore on the way out */
} frame;

static _Thread_local frame *cur;
static _Thread_local void *last_fault;
static _Thread_local bool altstack_done;
static _Atomic uint64_t nfaults;
static struct sigaction old_segv, old_bus;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_key_t altstack_key;
static int install_rc;

static void on_fault(int sig, siginfo_t *info, void *uc) {
  frame *f = cur;
  if (!f) {
    cxr__sig_chain(sig == SIGSEGV ? &old_segv : &old_bus, sig, info, uc);
    return;
  }
  last_fault = info->si_addr;
  atomic_fetch_add_explicit(&nfaults, 1, memory_order_relaxed);
  cur = f->prev;
  cxr__domain_leave(f->pkru);
  siglongjmp(f->jb, 1);
}

static void altstack_free(void *p) {
  stack_t off = {.ss_flags = SS_DISABLE};
  stack_t now;
  if (sigaltstack(NULL, &now) == 0 && now.ss_sp == p) sigaltstack(&off, NULL);
  free(p);
}

static void install(void) {
  if (pthread_key_create(&altstack_key, altstack_free) != 0) {
    install_rc = CXR_ENOMEM;
    return;
  }
  if (cxr__sig_install(SIGSEGV, on_fault, &old_segv) != 0 ||
      cxr__sig_install(SIGBUS, on_fault, &old_bus) != 0)
    install_rc = CXR_EIO;
}

/* Gives this thread an alternate signal stack unless it has one (sanitizers do). */
static void ensure_altstack(void) {
  altstack_done = true;
  stack_t now;
  if (sigaltstack(NULL, &now) == 0 && !(now.ss_flags & SS_DISABLE)) return;
  void *mem = malloc(ALTSTACK_BYTES);
  if (!mem) return; /* containment still works for faults that leave stack to spare */
  stack_t st = {.ss_sp = mem, .ss_size = ALTSTACK_BYTES};
  if (sigaltstack(&st, NULL) != 0) {
    free(mem);
    return;
  }
  pthread_setspecific(altstack_key, mem);
}

int cxr__sandbox_prepare(void) {
  pthread_once(&once, install);
  if (install_rc) return install_rc;
  if (!altstack_done) ensure_altstack();
  return 0;
}

int cxr_sandbox_run(int (*fn)(void *arg), void *arg) {
  if (!fn) return CXR_EINVAL;
  int rc = cxr__sandbox_prepare();
  if (rc) return rc;
  frame f;
  f.prev = cur;
  f.pkru = cxr__domain_enter();
  if (sigsetjmp(f.jb, 0)) {
    /* on_fault restored cur and the rights. A sanitizer's signal wrapper may have blocked
     * the signal around our handler (ignoring SA_NODEFER) and never got to unblock it. */
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGSEGV);
    sigaddset(&s, SIGBUS);
    pthread_sigmask(SIG_UNBLOCK, &s, NULL);
    return CXR_EBADPTR;
  }
  cur = &f;
  atomic_signal_fence(memory_order_seq_cst);
  rc = fn(arg);
  atomic_signal_fence(memory_order_seq_cst);
  cur = f.prev;
  cxr__domain_leave(f.pkru);
  return rc;
}

void *cxr_sandbox_fault_addr(void) { return last_fault; }
uint64_t cxr_sandbox_faults(void) { return atomic_load(&nfaults); }

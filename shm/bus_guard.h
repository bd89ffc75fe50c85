/* Private (shm/ and rpc/): survives heap files that another process shrank.
 *
 * Every process that maps a heap can truncate its file (it opens it for writing): a page
 * past the new end then raises SIGBUS in every process that touches it. A server touches
 * each client's connection heap (rings, arguments, results), so one client could kill it.
 * With the guard installed, such a fault inside a heap the owner asked it to watch (rpc:
 * its channels' control and connection heaps) is repaired instead: the page is replaced,
 * in this process only, by a private zero page, and the access goes on.
 * The heap is damaged from then on (this process no longer sees what the others see): the
 * owner finds out with cxr__bus_damaged and stops using it (rpc takes the connection back
 * and gives the slot a fresh heap). Faults elsewhere (other heaps: a client's view of its
 * server's heaps, a process's own), and other kinds of SIGBUS (a memory error on a DAX
 * device), go to the handler that was there before. Two threads faulting on one page at
 * once may each map a zero page there, the second dropping what the first wrote: the heap
 * is damaged either way. A repaired page loses a protection key the heap had. */
#ifndef CXRPC_SHM_BUS_GUARD_H
#define CXRPC_SHM_BUS_GUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Installs the SIGBUS handler (once per process; the handler found there is kept and gets
 * every fault the guard does not repair). 0, or CXR_EIO. An application that installs its
 * own SIGBUS handler afterwards replaces the guard. */
int cxr__bus_guard_install(void);

/* Watches (on) or stops watching the heap at [base, base + size) (whole 2 MiB units of the
 * window). Stop once the heap is closed: closing a shrunk heap touches its pages too. */
void cxr__bus_guard_watch(const void *base, size_t size, bool on);

/* Pages repaired in this process so far: a change says it is time to call cxr__bus_damaged. */
uint64_t cxr__bus_repairs(void);

/* For each of the n ranges [base[i], base[i] + size[i]), whether this process holds repaired
 * pages in it (from /proc/self/maps: private anonymous pages where a heap was mapped).
 * 0, or an error (CXR_EIO: the maps could not be read; nothing is reported damaged). */
int cxr__bus_damaged(const uintptr_t *base, const size_t *size, size_t n, bool *damaged);

#ifdef __cplusplus
}
#endif
#endif

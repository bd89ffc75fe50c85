/*
 * The enforcement policy cxrpcd applies to every syscall the launcher's filter sends it.
 * Inputs are the syscall's scalar arguments (no pointers: nothing the caller can change
 * after the decision) and the seal tables the receivers registered for the caller.
 *
 *  - a raise of permissions (PROT_WRITE or PROT_EXEC), munmap or madvise that touches an
 *    active seal: EPERM; elsewhere allowed (these are the library's own releases);
 *  - mremap of anything inside the window, or to a fixed address inside it: always EPERM
 *    (the library never remaps, and mremap(old, 0, ...) would make a second mapping);
 *  - mmap inside the window over an active seal: EPERM; a shared mapping that overlaps a
 *    registered heap but not at that heap's own file offset (an alias): EPERM; otherwise
 *    allowed (the library maps heaps and tables there);
 *  - a shared file mapping outside the window: EPERM if its fd names a registered heap file
 *    (a second view of the heap the filter does not watch), else allowed (the registry).
 */
#include <errno.h>
#include <sys/mman.h>
#include <sys/syscall.h>

#include "sandbox/internal.h"

static uint64_t pages(uint64_t n) { return (n + CXR__PAGE - 1) & ~(uint64_t)(CXR__PAGE - 1); }

static bool overlaps(uint64_t a, uint64_t n, uint64_t lo, uint64_t len) {
  uint64_t e = a + n < a ? UINT64_MAX : a + n;
  return a < lo + len && lo < e;
}

static bool touches_active(const cxr__policy_view *v, uint64_t a, uint64_t n) {
  for (size_t i = 0; i < v->ntables; i++)
    if (cxr__seal_overlaps_active(v->tables[i], v->table_bytes[i], a, n)) return true;
  return false;
}

int cxr__policy_decide(const cxr__policy_view *v, int nr, const uint64_t a[6]) {
  if (!v || !a) return EPERM;
  uint64_t n;
  switch (nr) {
    case SYS_mprotect:
    case SYS_pkey_mprotect:
      if (!(a[2] & (PROT_WRITE | PROT_EXEC))) return 0;
      n = pages(a[1]);
      if (!overlaps(a[0], n, v->wbase, v->wsize)) return 0;
      return touches_active(v, a[0], n) ? EPERM : 0;
    case SYS_munmap:
    case SYS_madvise:
      n = pages(a[1]);
      if (!overlaps(a[0], n, v->wbase, v->wsize)) return 0;
      return touches_active(v, a[0], n) ? EPERM : 0;
    case SYS_mremap:
      if (overlaps(a[0], a[1] ? pages(a[1]) : CXR__PAGE, v->wbase, v->wsize)) return EPERM;
      if ((a[3] & MREMAP_FIXED) && overlaps(a[4], pages(a[2]), v->wbase, v->wsize)) return EPERM;
      return 0;
    case SYS_mmap:
      n = pages(a[1]);
      if (!overlaps(a[0], n, v->wbase, v->wsize)) /* only shared file mappings come here */
        return ((a[3] & MAP_SHARED) && !(a[3] & MAP_ANONYMOUS) && v->fd_is_heap) ? EPERM : 0;
      if (touches_active(v, a[0], n)) return EPERM;
      if ((a[3] & MAP_SHARED) && !(a[3] & MAP_ANONYMOUS)) {
        for (size_t i = 0; i < v->nheaps; i++) {
          uint64_t hb = (uintptr_t)v->heaps[i].p, hn = v->heaps[i].len;
          if (!overlaps(a[0], n, hb, hn)) continue;
          if (a[0] < hb || a[0] + n > hb + hn || a[0] - hb != a[5]) return EPERM;
        }
      }
      return 0;
    case SYS_ptrace:
    case SYS_process_vm_writev:
      return EPERM;
    default:
      return 0;
  }
}

/* The heap lock word of a heap and a live holder's identity for it, for call_test (whose
 * rpc/internal.h cannot be compiled beside shm/layout.h: both name a cxr__slot). */
#include "tests/rpc/lock_word.h"

#include "shm/layout.h"
#include "shm/proc.h"

uint64_t *test_heap_lock_word(cxr_heap *h) { return &((cxr__hdr *)cxr_heap_base(h))->lock.word; }

uint64_t test_live_lock_word(void) {
  cxr__proc_id me;
  return cxr__proc_self_id(&me) == 0 ? cxr__plock_id(me.pid, me.start_time) : 0;
}

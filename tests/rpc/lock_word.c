/* Where a heap's lock word lies, for call_test (whose rpc/internal.h cannot be compiled
 * beside shm/layout.h: both name a cxr__slot). */
#include "tests/rpc/lock_word.h"

#include "shm/layout.h"

uint64_t *test_heap_lock_word(cxr_heap *h) { return &((cxr__hdr *)cxr_heap_base(h))->lock.word; }

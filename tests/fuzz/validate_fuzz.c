/* libFuzzer target over the generated validators: the input becomes a block of memory
 * (words tagged 0xC0DE in their top 16 bits become pointers into the block), read as an
 * Everything, a Tree or an Inner and validated against the block. Whatever the validator
 * accepts must then be safe for every trusted walk: ranges (inside the block), equal,
 * copy into a heap, protobuf-c conversion and back (and the result validates). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/idl/everything.cxr.h"

#define BLOCK (64u << 10)

static uint64_t block[BLOCK / 8];
static cxr_heap *heap;

static void setup(void) {
  if (heap) return;
  /* a root of our own (under the test's temporary folder when run as a test) */
  const char *t = getenv("TEST_TMPDIR");
  if (!getenv("CXRPC_ROOT") && t) setenv("CXRPC_ROOT", t, 1);
  if (cxr_init(NULL) != 0) abort();
  char name[64];
  snprintf(name, sizeof name, "fuzz-validate-%d", (int)getpid());
  if (cxr_heap_create(&heap, name, 64u << 20, NULL) != 0) abort();
  cxr_heap_unlink(name);  /* gone from the registry when the fuzzer ends */
}

static void check_ranges(cxr_ranges *rs, size_t n) {
  for (size_t i = 0; i < rs->count; i++) {
    uintptr_t p = (uintptr_t)rs->items[i].p;
    if (p < (uintptr_t)block || rs->items[i].len > (uintptr_t)block + n - p) abort();
  }
}

#define WALKS(T, PB)                                                                 \
  do {                                                                             \
    const T *m = (const T *)block;                                                 \
    if (T##_validate(m, &r, &lim) != 0) break;                                     \
    cxr_ranges rs;                                                                 \
    cxr_ranges_init(&rs);                                                          \
    if (T##_ranges(m, &rs) == 0) check_ranges(&rs, n);                             \
    cxr_ranges_free(&rs);                                                          \
    if (!T##_equal(m, m)) abort();                                                 \
    T *c = NULL;                                                                   \
    if (T##_copy(heap, m, &c) == 0) {                                              \
      if (!T##_equal(m, c)) abort();                                               \
      T##_free(heap, c);                                                           \
    }                                                                              \
    PB *pb = NULL;                                                                 \
    if (T##_to_pb(m, &pb) == 0) {                                                  \
      T *back = NULL;                                                              \
      if (T##_from_pb(heap, pb, &back) == 0) {                                     \
        cxr_range hr = {cxr_heap_base(heap), cxr_heap_size(heap)};                 \
        if (T##_validate(back, &hr, NULL) != 0) abort();                           \
        T##_free(heap, back);                                                      \
      }                                                                            \
      T##_pb_free(pb);                                                             \
    }                                                                              \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  setup();
  if (size < 2) return 0;
  unsigned which = data[0] % 3;
  uint8_t depth = data[1];
  data += 2, size -= 2;
  size_t n = size > BLOCK ? BLOCK : size;
  n &= ~(size_t)7;
  if (n == 0) return 0;
  memcpy(block, data, n);
  for (size_t i = 0; i < n / 8; i++)
    if ((block[i] >> 48) == 0xC0DE) block[i] = (uintptr_t)block + (block[i] & 0xFFFF) % n;
  cxr_range r = {block, n};
  cxr_limits lim;
  cxr_limits_init(&lim);
  lim.max_depth = 1 + depth % 80;
  switch (which) {
    case 0: WALKS(cxrtest_Everything, Cxrtest__Everything); break;
    case 1: WALKS(cxrtest_open_Tree, Cxrtest__Open__Tree); break;
    default: WALKS(cxrtest_Everything_Inner, Cxrtest__Everything__Inner); break;
  }
  return 0;
}

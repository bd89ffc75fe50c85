#ifndef CXRPC_TESTS_RPC_LOCK_WORD_H
#define CXRPC_TESTS_RPC_LOCK_WORD_H
#include <stdint.h>

#include <cxrpc/shm.h>

#ifdef __cplusplus
extern "C" {
#endif
/* Where h's lock word lies in the header every holder can write. */
uint64_t *test_heap_lock_word(cxr_heap *h);
#ifdef __cplusplus
}
#endif
#endif

/* Private: numbers from CXRPC_* environment variables, read one way by every layer. Before
 * this each reader had its own strtoul; some ignored trailing junk ("12x" became 12), some
 * took garbage as 0, and bad values were dropped, clamped or refused without a word. */
#ifndef CXRPC_SHM_ENV_H
#define CXRPC_SHM_ENV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* s, whole, as a number: decimal, or hexadecimal after 0x; no sign, no spaces; with units,
 * one k, M or G (either case) after the digits multiplies by 2^10, 2^20 or 2^30. 0, or
 * CXR_EINVAL (empty, garbage, trailing junk, a sign, past 2^64 - 1) with *out untouched. */
int cxr__parse_u64(const char *s, bool units, uint64_t *out);

/* $name as a number in [min, max]. Unset or empty: *out = dflt, 0. Valid: the value, 0.
 * Anything else (garbage, trailing junk, negative, overflow, out of range): *out = dflt,
 * one warning naming the variable, its value and the default used (once per distinct bad
 * setting: some readers run per connection), and CXR_EINVAL. Never a silent 0. */
int cxr__env_u64(const char *name, uint64_t dflt, uint64_t min, uint64_t max, uint64_t *out);

/* The same for a size in bytes: the number may end in k, M or G. */
int cxr__env_bytes(const char *name, uint64_t dflt, uint64_t min, uint64_t max,
                   uint64_t *out);

/* Whether [base, base + size) can be the address window: not empty, both ends 2 MiB
 * aligned (CXR__WINDOW_ALIGN, the registry's ranges), within user space. One check for a
 * window from $CXRPC_WINDOW (cxr__parse_window) and from cxr_init's options. */
#define CXR__WINDOW_ALIGN (2ull << 20)
bool cxr__window_ok(uint64_t base, uint64_t size);

/* An address window "LO-HI" (each a number as above, in practice 0x...): both ends 2 MiB
 * aligned, LO < HI <= 0x800000000000 (user space). 0 with *base, *size set, or CXR_EINVAL
 * with them untouched. shm's cxr_init and sandbox's launcher both read $CXRPC_WINDOW so. */
int cxr__parse_window(const char *s, uintptr_t *base, size_t *size);

#ifdef __cplusplus
}
#endif
#endif

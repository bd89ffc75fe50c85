/* Private: protection-key rights around sandboxed code (sandbox/domain.c). */
#ifndef CXRPC_SANDBOX_DOMAIN_H
#define CXRPC_SANDBOX_DOMAIN_H
#include <stdint.h>
/* Denies the private domain if one exists; returns the rights to restore (cheap no-op
 * without pkeys). */
uint32_t cxr__domain_enter(void);
void cxr__domain_leave(uint32_t saved);
#endif

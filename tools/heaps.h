/* `cxrpcctl heaps`: the heaps of this pod's registry with address, size, use, holders and
 * lease state; `--reap` recovers heaps whose holders died. */
#ifndef CXRPC_TOOLS_HEAPS_H
#define CXRPC_TOOLS_HEAPS_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* argv[0] is "heaps". Returns the exit status: 0, 1 when the registry cannot be read,
 * 2 for bad usage. */
int cxr__ctl_heaps(int argc, char **argv, FILE *out);

#ifdef __cplusplus
}
#endif
#endif

/* `cxrpcctl channels`: the rpc channels of this pod, read from their shared control blocks. */
#ifndef CXRPC_TOOLS_CHANNELS_H
#define CXRPC_TOOLS_CHANNELS_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* argv[0] is "channels". Exit status: 0, 1 when the registry cannot be read, 2 bad usage. */
int cxr__ctl_channels(int argc, char **argv, FILE *out);

#ifdef __cplusplus
}
#endif
#endif

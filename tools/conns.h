/* `cxrpcctl conns [CHANNEL] [--all]`: connections with their shared-memory counters. */
#ifndef CXRPC_TOOLS_CONNS_H
#define CXRPC_TOOLS_CONNS_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* argv[0] is "conns". Exit status: 0, 1 when a channel cannot be read, 2 bad usage. */
int cxr__ctl_conns(int argc, char **argv, FILE *out);

#ifdef __cplusplus
}
#endif
#endif

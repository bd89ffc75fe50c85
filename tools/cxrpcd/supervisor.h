/* cxrpcd's supervisor: the notify fds of launched processes, the seal tables receivers
 * registered, and the decisions (sandbox/policy.c). */
#ifndef CXRPC_TOOLS_CXRPCD_SUPERVISOR_H
#define CXRPC_TOOLS_CXRPCD_SUPERVISOR_H
#include <stdatomic.h>
/* Serves on the Unix socket at path until *stop becomes nonzero. 0 or a negative CXR_E*. */
int cxrpcd_serve(const char *path, volatile sig_atomic_t *stop);
/* Installs the filter, hands its notify fd to the supervisor at path, then execs argv. */
int cxrpcd_run(const char *path, char **argv);
#endif

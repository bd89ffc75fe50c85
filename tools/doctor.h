/* `cxrpcctl doctor`: what this machine offers cxrpc across racks and in the pod. */
#ifndef CXRPC_TOOLS_DOCTOR_H
#define CXRPC_TOOLS_DOCTOR_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Prints the report to out ("key: value" lines, stable keys). Returns the exit status:
 * 0 (a machine without RDMA, pkeys or DAX is a valid machine: those are reported, not
 * errors), 2 for bad usage. */
int cxr__doctor(int argc, char **argv, FILE *out);

#ifdef __cplusplus
}
#endif
#endif

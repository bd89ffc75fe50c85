/*
 * cxrpc/base.h: what every layer shares: error codes, the last-error slot, logging and
 * the clock. Included by every other public header; you rarely include it directly.
 *
 * Error convention: functions return int, 0 on success or a negative CXR_E* code.
 * Functions that return a pointer return NULL on failure and leave the code in
 * cxr_last_error() (a per-thread slot), never a silent NULL.
 */
#ifndef CXRPC_BASE_H
#define CXRPC_BASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum cxr_error {
  CXR_OK = 0,
  CXR_EINVAL = -1,        /* an argument is invalid (NULL, out of range, bad flags) */
  CXR_ENOMEM = -2,        /* a heap or the process is out of memory */
  CXR_ENOENT = -3,        /* no such heap, channel, file or host */
  CXR_EEXIST = -4,        /* the name is already used */
  CXR_ENAMETOOLONG = -5,  /* a name is longer than CXR_NAME_MAX */
  CXR_EACCES = -6,        /* file permissions forbid it (root folder, heap, channel) */
  CXR_EBADMAGIC = -7,     /* a heap file is not a cxrpc heap */
  CXR_EVERSION = -8,      /* a heap file has a layout version this build cannot read */
  CXR_ETRUNCATED = -9,    /* a heap file is shorter than its header says */
  CXR_ERANGE = -10,       /* an address range lies outside the window or this pod's slice */
  CXR_EADDRINUSE = -11,   /* the address range is already mapped by something else */
  CXR_ETIMEDOUT = -12,    /* the deadline passed */
  CXR_EPEERDEAD = -13,    /* the peer process or host died or went away */
  CXR_EBADPTR = -14,      /* a pointer is outside the allowed memory, or faulted */
  CXR_ENOTSEALED = -15,   /* data claimed sealed is not */
  CXR_EPERM = -16,        /* the operation is not permitted (seal not done, policy) */
  CXR_EAGAIN = -17,       /* not ready yet: try again */
  CXR_ECANCELED = -18,    /* the call was cancelled */
  CXR_ENOSYS = -19,       /* not supported on this machine or build */
  CXR_EBUSY = -20,        /* the object is in use */
  CXR_EPROTO = -21,       /* a peer broke the protocol (malformed descriptor, bad id) */
  CXR_ECORRUPT = -22,     /* shared metadata failed a consistency check */
  CXR_ENOMETHOD = -23,    /* the server has no handler for that method id */
  CXR_ECLOSED = -24,      /* the object was closed or stopped */
  CXR_EIO = -25,          /* an operating-system call failed unexpectedly (see log) */
  CXR_ENOTCONN = -26,     /* the transport is not connected (link down) */
  CXR_EFULL = -27,        /* a ring, table or budget is full */
  CXR_ERRNO_MIN = -27
};

/* A short English sentence for a CXR_E* code (or "unknown error"). Never NULL. */
const char *cxr_strerror(int err);
/* The code left by the last call on this thread that returned NULL or false. */
int cxr_last_error(void);

/* Nanoseconds of CLOCK_MONOTONIC: the clock for every deadline in cxrpc. */
int64_t cxr_now_ns(void);

enum cxr_log_level { CXR_LOG_ERROR = 0, CXR_LOG_WARN, CXR_LOG_INFO, CXR_LOG_DEBUG };
/* The level in force: CXRPC_LOG=error|warn|info|debug, read once; default warn. */
int cxr_log_level(void);
void cxr_log_set_level(int level);

#define CXR_NAME_MAX 63   /* longest heap or channel name, without the final NUL */

#ifdef __cplusplus
}
#endif
#endif

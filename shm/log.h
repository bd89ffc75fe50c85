/* Private: logging and error helpers shared by all layers (not installed as public). */
#ifndef CXRPC_LOG_H
#define CXRPC_LOG_H

#include <cxrpc/base.h>

#ifdef __cplusplus
extern "C" {
#endif

void cxr__log(int level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Off the hot path: the level check is one load and a compare. */
#define CXR_LOG(level, ...)                                          \
  do {                                                               \
    if ((level) <= cxr_log_level()) cxr__log((level), __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
#define CXR_ERR(...) CXR_LOG(CXR_LOG_ERROR, __VA_ARGS__)
#define CXR_WARN(...) CXR_LOG(CXR_LOG_WARN, __VA_ARGS__)
#define CXR_INFO(...) CXR_LOG(CXR_LOG_INFO, __VA_ARGS__)
#define CXR_DEBUG(...) CXR_LOG(CXR_LOG_DEBUG, __VA_ARGS__)

/* Whether the n-th occurrence (counted from 1) of something a peer can make happen at
 * will is logged: the 1st, 2nd, 4th, 8th..., so that a flood does not flood the log and
 * the count shown says how many there were. */
static inline bool cxr__log_due(uint64_t n) { return (n & (n - 1)) == 0; }

/* Sets this thread's last error and returns NULL: `return cxr__fail_null(CXR_EINVAL);` */
void *cxr__fail_null(int err);
void cxr__set_error(int err);

/* Maps an errno value to the nearest CXR_E* code. */
int cxr__from_errno(int e);

#ifdef __cplusplus
}
#endif
#endif

/* Private: an engine opened with UCX settings of its own (not installed). C and C++. */
#ifndef CXRPC_RDMA_OPEN_UCX_H
#define CXRPC_RDMA_OPEN_UCX_H

#include <cxrpc/rdma.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cxr_rdma_open, with `kv` (NULL, or "KEY", "VALUE", ... ending at a NULL key) given to
 * ucp_config_modify after UCX has read the environment: settings for this engine alone.
 * Setting UCX_* in the environment around an open reached every engine opened meanwhile, and
 * setenv may move environ under a getenv on another thread (engines' progress threads call
 * getenv). A key UCX does not know itself goes to each transport under the transport's own
 * field name, without the environment's prefix: "RCVBUF", not "TCP_RCVBUF" (which UCX 1.13
 * takes, then warns matches nothing; 17dc32d). CXR_EINVAL when UCX refuses a key. */
int cxr__rdma_open_ucx(cxr_rdma **r, const cxr_rdma_opts *o, const char *const *kv);

#ifdef __cplusplus
}
#endif

#endif

/*
 * The multi-host harness: network namespaces joined by one software switch (a bridge in
 * its own namespace), each node on 10.77.0.(i+1)/24 through a veth named "cx0", no route
 * out. A pod = nodes that share one CXRPC_ROOT; another rack = a node with its own root,
 * reached only over UCX with UCX_TLS=tcp, UCX_NET_DEVICES=cx0.
 *
 * Names are unique per process and tag ("cxr-<pid>-<tag>-<i>"); cxrt_net_up first sweeps
 * what dead creators left behind, and cxrt_net_down (also run at exit) deletes ours.
 * Needs root and no Bazel sandbox (tags = ["no-sandbox"]).
 */
#ifndef CXRPC_TESTS_NETNS_H
#define CXRPC_TESTS_NETNS_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CXRT_NET_MAX 8

typedef struct cxrt_net {
  int n;
  char sw[64];
  char ns[CXRT_NET_MAX][64];
  char ip[CXRT_NET_MAX][20];
} cxrt_net;

/* Creates n nodes (1..CXRT_NET_MAX) and the switch. 0 or -1 (message on stderr). */
int cxrt_net_up(cxrt_net *net, const char *tag, int n);
/* Takes node i's link down or up again (ip link set cx0 down|up). */
int cxrt_net_link(const cxrt_net *net, int i, bool up);
/* Deletes the namespaces (their veths go with them). Idempotent. */
void cxrt_net_down(cxrt_net *net);
/* Deletes namespaces named cxr-<pid>-* whose creator is dead. */
void cxrt_net_sweep(void);
/* True when this process may create namespaces (root, not sandboxed). */
bool cxrt_net_available(void);

#ifdef __cplusplus
}
#endif
#endif

/* RDMA device discovery through rdma-core: devices, ports, on-demand paging, DC. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <infiniband/verbs.h>
#include <infiniband/mlx5dv.h>

#include "rdma/internal.h"

static const char *port_state(enum ibv_port_state s) {
  switch (s) {
    case IBV_PORT_DOWN: return "down";
    case IBV_PORT_INIT: return "init";
    case IBV_PORT_ARMED: return "armed";
    case IBV_PORT_ACTIVE: return "active";
    case IBV_PORT_ACTIVE_DEFER: return "active-defer";
    default: return "unknown";
  }
}

static void fill(struct ibv_device *dev, cxr_rdma_dev_info *o) {
  memset(o, 0, sizeof *o);
  snprintf(o->name, sizeof o->name, "%s", ibv_get_device_name(dev));
  snprintf(o->transport, sizeof o->transport, "%s",
           dev->transport_type == IBV_TRANSPORT_IB ? "ib"
           : dev->transport_type == IBV_TRANSPORT_IWARP ? "iwarp" : "other");
  struct ibv_context *ctx = ibv_open_device(dev);
  if (ctx == NULL) return;
  struct ibv_device_attr_ex ax;
  memset(&ax, 0, sizeof ax);
  if (ibv_query_device_ex(ctx, NULL, &ax) == 0) {
    o->odp = (ax.odp_caps.general_caps & IBV_ODP_SUPPORT) != 0 &&
             (ax.odp_caps.per_transport_caps.rc_odp_caps & IBV_ODP_SUPPORT_SEND) != 0;
    unsigned n = ax.orig_attr.phys_port_cnt;
    o->nports = n > 4 ? 4 : n;
    for (unsigned p = 1; p <= o->nports; p++) {
      struct ibv_port_attr pa;
      cxr_rdma_port_info *pi = &o->ports[p - 1];
      pi->num = p;
      if (ibv_query_port(ctx, (uint8_t)p, &pa) != 0) continue;
      snprintf(pi->state, sizeof pi->state, "%s", port_state(pa.state));
      snprintf(pi->link_layer, sizeof pi->link_layer, "%s",
               pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand");
      pi->gids = (unsigned)pa.gid_tbl_len;
      pi->pkeys = (unsigned)pa.pkey_tbl_len;
    }
  }
  if (mlx5dv_is_supported(dev)) {
    struct mlx5dv_context mc = {.comp_mask = MLX5DV_CONTEXT_MASK_DC_ODP_CAPS};
    if (mlx5dv_query_device(ctx, &mc) == 0) o->dc = true;  /* mlx5 devices offer DCT/DCI */
  }
  ibv_close_device(ctx);
}

int cxr_rdma_devices(cxr_rdma_dev_info *out, size_t max, size_t *n, char *why, size_t whylen) {
  if (n == NULL || (max && out == NULL)) return CXR_EINVAL;
  *n = 0;
  if (why && whylen) why[0] = '\0';
  int num = 0;
  errno = 0;
  struct ibv_device **list = ibv_get_device_list(&num);
  if (list == NULL || num == 0) {
    int e = errno;
    if (why && whylen)
      snprintf(why, whylen, "%s", e ? strerror(e) : "no RDMA device present");
    if (list) ibv_free_device_list(list);
    return 0;
  }
  for (int i = 0; i < num; i++)
    if ((size_t)i < max) fill(list[i], &out[i]);
  *n = (size_t)num;
  ibv_free_device_list(list);
  return 0;
}

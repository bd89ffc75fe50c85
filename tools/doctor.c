/* `cxrpcctl doctor`: RDMA devices and ports (rdma-core), on-demand paging and DC, the UCX
 * transports this process would use, memory protection keys, DAX, and the settings that
 * steer them. Degrades gracefully: every missing feature is one line saying so. */
#include "tools/doctor.h"

#include <errno.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucp/api/ucp.h>

#include <cxrpc/rdma.h>

static void devices(FILE *out) {
  cxr_rdma_dev_info d[8];
  size_t n = 0;
  char why[128] = "";
  int rc = cxr_rdma_devices(d, 8, &n, why, sizeof why);
  if (rc != 0) {
    fprintf(out, "rdma.devices: error (%s)\n", cxr_strerror(rc));
    return;
  }
  fprintf(out, "rdma.devices: %zu", n);
  if (n == 0) fprintf(out, " (%s)", why[0] ? why : "none");
  fprintf(out, "\n");
  bool odp = n > 0, dc = n > 0;
  for (size_t i = 0; i < n && i < 8; i++) {
    fprintf(out, "rdma.device: %s transport=%s odp=%s dc=%s ports=%u\n", d[i].name,
            d[i].transport, d[i].odp ? "yes" : "no", d[i].dc ? "yes" : "no", d[i].nports);
    for (unsigned p = 0; p < d[i].nports; p++)
      fprintf(out, "rdma.port: %s/%u state=%s link=%s gids=%u pkeys=%u\n", d[i].name,
              d[i].ports[p].num, d[i].ports[p].state, d[i].ports[p].link_layer,
              d[i].ports[p].gids, d[i].ports[p].pkeys);
    odp &= d[i].odp;
    dc &= d[i].dc;
  }
  fprintf(out, "rdma.odp: %s\n", n == 0 ? "n/a (no device)" : odp ? "yes" : "no");
  fprintf(out, "rdma.dc: %s\n", n == 0 ? "n/a (no device)" : dc ? "yes" : "no");
  /* What CXR_RDMA_PIN_AUTO resolves to here. */
  fprintf(out, "rdma.pinning: %s\n",
          n == 0 ? "never (no RDMA device: UCX runs over TCP or shared memory)"
          : odp ? "never (on-demand paging)" : "budgeted (registration cache + bounce buffers)");
}

static void ucx(FILE *out) {
  fprintf(out, "ucx.version: %s\n", ucp_get_version_string());
  ucp_config_t *cfg = NULL;
  if (ucp_config_read(NULL, NULL, &cfg) != UCS_OK) {
    fprintf(out, "ucx.transports: error (cannot read UCX configuration)\n");
    return;
  }
  ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                    .features = UCP_FEATURE_AM | UCP_FEATURE_RMA | UCP_FEATURE_AMO64};
  ucp_context_h ctx = NULL;
  ucs_status_t st = ucp_init(&p, cfg, &ctx);
  ucp_config_release(cfg);
  if (st != UCS_OK) {
    fprintf(out, "ucx.transports: none (%s; check UCX_TLS / UCX_NET_DEVICES)\n",
            ucs_status_string(st));
    return;
  }
  /* UCX prints its resources as "#      resource N  :  md M  dev D  flags -- tl/dev". */
  char *buf = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&buf, &len);
  if (m != NULL) {
    ucp_context_print_info(ctx, m);
    fclose(m);
  }
  fprintf(out, "ucx.transports:");
  int count = 0;
  for (char *line = buf ? strtok(buf, "\n") : NULL; line; line = strtok(NULL, "\n")) {
    if (strstr(line, "resource") == NULL) continue;
    char *dash = strstr(line, "-- ");
    if (dash == NULL) continue;
    fprintf(out, " %s", dash + 3);
    count++;
  }
  fprintf(out, "%s\n", count ? "" : " none");
  free(buf);
  ucp_cleanup(ctx);
}

/* The settings that choose transports and pinning: printed whatever UCX made of them, so a
 * report whose transports are "none" shows the setting that caused it. */
static void env(FILE *out) {
  const char *vars[] = {"UCX_TLS", "UCX_NET_DEVICES", "UCX_MEM_MALLOC_HOOKS",
                        "CXRPC_RDMA_PIN", "CXRPC_RDMA_PIN_BUDGET"};
  for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
    const char *v = getenv(vars[i]);
    fprintf(out, "env.%s: %s\n", vars[i], v ? v : "(unset)");
  }
}

static void pkeys(FILE *out) {
  int k = pkey_alloc(0, 0);
  if (k < 0) {
    int e = errno;
    fprintf(out, "pkeys: no (pkey_alloc: %s; sandboxes fall back to validation only)\n",
            strerror(e));
    return;
  }
  pkey_free(k);
  fprintf(out, "pkeys: yes\n");
}

static void dax(FILE *out) {
  glob_t g;
  int devs = 0;
  if (glob("/dev/dax*", 0, NULL, &g) == 0) devs += (int)g.gl_pathc, globfree(&g);
  if (glob("/dev/pmem*", 0, NULL, &g) == 0) devs += (int)g.gl_pathc, globfree(&g);
  int mounts = 0;
  FILE *f = fopen("/proc/mounts", "re");
  char line[512];
  while (f && fgets(line, sizeof line, f))
    if (strstr(line, "dax") != NULL) mounts++;
  if (f) fclose(f);
  if (devs == 0 && mounts == 0)
    fprintf(out, "dax: no (no /dev/dax*, /dev/pmem* or dax mount; heaps use tmpfs pages)\n");
  else
    fprintf(out, "dax: yes (%d devices, %d dax mounts)\n", devs, mounts);
}

int cxr__doctor(int argc, char **argv, FILE *out) {
  if (argc > 1 && strcmp(argv[1], "-h") && strcmp(argv[1], "--help")) {
    fprintf(out, "usage: cxrpcctl doctor\n");
    return 2;
  }
  if (argc > 1) {
    fprintf(out, "usage: cxrpcctl doctor\n  reports RDMA devices and ports, on-demand paging "
                 "and DC, UCX transports, pkeys and DAX\n");
    return 0;
  }
  devices(out);
  ucx(out);
  env(out);
  pkeys(out);
  dax(out);
  return 0;
}

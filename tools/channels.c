/* `cxrpcctl channels`: one line per channel: server, liveness, permissions, connections,
 * the ready pool, and connect/disconnect/reclaim totals. Never disturbs the server (the
 * counters live in the channel's control heap); listing the registry sweeps it, as every
 * registry listing does (heaps marked for removal that nobody holds, stray files). */
#include "tools/channels.h"

#include <stdlib.h>
#include <string.h>

#include <cxrpc/rpc.h>

static void age(char *buf, size_t n, int64_t ns) {
  double s = ns / 1e9;
  if (s < 120) snprintf(buf, n, "%.1fs", s);
  else if (s < 7200) snprintf(buf, n, "%.0fm", s / 60);
  else snprintf(buf, n, "%.1fh", s / 3600);
}

int cxr__ctl_channels(int argc, char **argv, FILE *out) {
  if (argc > 1) {
    fprintf(stderr, "usage: cxrpcctl channels\n");
    return 2;
  }
  (void)argv;
  size_t n = 0;
  int rc = cxr_channel_list(NULL, 0, &n);
  if (rc != 0) {
    fprintf(stderr, "cxrpcctl: cannot read the registry: %s\n", cxr_strerror(rc));
    return 1;
  }
  cxr_channel_info *ci = calloc(n + 1, sizeof *ci);
  if (ci == NULL) return 1;
  size_t m = 0;
  if ((rc = cxr_channel_list(ci, n + 1, &m)) != 0) {
    fprintf(stderr, "cxrpcctl: cannot read the registry: %s\n", cxr_strerror(rc));
    free(ci);
    return 1;
  }
  if (m > n + 1) m = n + 1;
  fprintf(out, "%-24s %8s %-6s %5s %9s %5s %7s %9s %9s %9s %8s\n", "CHANNEL", "SERVER", "STATE",
          "MODE", "CONNS/MAX", "READY", "WORKERS", "CONNECTS", "CLOSED", "RECLAIMED", "AGE");
  for (size_t i = 0; i < m; i++) {
    char conns[32], a[16];
    snprintf(conns, sizeof conns, "%u/%u", ci[i].connected, ci[i].max_conns);
    age(a, sizeof a, ci[i].age_ns);
    const char *state = !ci[i].open ? "closed" : ci[i].server_alive ? "open" : "dead";
    fprintf(out, "%-24s %8d %-6s %5o %9s %5u %7u %9llu %9llu %9llu %8s\n", ci[i].name,
            ci[i].server_pid, state, ci[i].mode, conns, ci[i].ready, ci[i].workers,
            (unsigned long long)ci[i].connects, (unsigned long long)ci[i].disconnects,
            (unsigned long long)ci[i].reclaimed, a);
  }
  if (m == 0) fprintf(out, "(no channels in %s)\n", cxr_root());
  free(ci);
  return 0;
}

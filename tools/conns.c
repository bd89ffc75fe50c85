/* `cxrpcctl conns [CHANNEL] [--all]`: one line per connection of one channel (or of every
 * channel): client, liveness, age, and the counters both sides keep in shared memory:
 * calls, errors, timeouts, cancels, requests the server did not run (expired or cancelled
 * while queued), calls in flight, bytes each way, malformed requests, late answers. --all
 * also lists the ready pool. */
#include "tools/conns.h"

#include <stdlib.h>
#include <string.h>

#include <cxrpc/rpc.h>

static void human(char *buf, size_t n, uint64_t v) {
  if (v < 10000) snprintf(buf, n, "%llu", (unsigned long long)v);
  else if (v < 10000000) snprintf(buf, n, "%.1fK", v / 1e3);
  else if (v < 10000000000ull) snprintf(buf, n, "%.1fM", v / 1e6);
  else snprintf(buf, n, "%.1fG", v / 1e9);
}

static int show(const char *name, bool all, bool header, FILE *out) {
  size_t n = 0;
  int rc = cxr_channel_inspect(name, NULL, NULL, 0, &n);
  if (rc != 0) {
    fprintf(stderr, "cxrpcctl: channel %s: %s\n", name, cxr_strerror(rc));
    return 1;
  }
  cxr_conn_info *ci = calloc(n + 4, sizeof *ci);
  if (ci == NULL) return 1;
  size_t m = 0;
  if ((rc = cxr_channel_inspect(name, NULL, ci, n + 4, &m)) != 0) {
    free(ci);
    fprintf(stderr, "cxrpcctl: channel %s: %s\n", name, cxr_strerror(rc));
    return 1;
  }
  if (m > n + 4) m = n + 4;
  if (header)
    fprintf(out, "%-20s %4s %-9s %7s %-5s %7s %8s %6s %6s %6s %6s %6s %8s %8s %5s %5s\n",
            "CHANNEL", "SLOT", "STATE", "CLIENT", "ALIVE", "AGE", "CALLS", "ERRORS", "TMOUT",
            "CANCEL", "NOTRUN", "INFLT", "BYTESIN", "BYTESOUT", "BAD", "LATE");
  for (size_t i = 0; i < m; i++) {
    const cxr_conn_info *c = &ci[i];
    if (!all && strcmp(c->state, "ready") == 0) continue;
    char calls[16], bin[16], bout[16], a[16];
    human(calls, sizeof calls, c->calls);
    human(bin, sizeof bin, c->bytes_in);
    human(bout, sizeof bout, c->bytes_out);
    snprintf(a, sizeof a, "%.1fs", c->age_ns / 1e9);
    fprintf(out, "%-20s %4u %-9s %7d %-5s %7s %8s %6llu %6llu %6llu %6llu %6llu %8s %8s %5llu %5llu\n",
            name, c->slot, c->state, c->client_pid, c->client_pid ? (c->client_alive ? "yes" : "NO") : "-",
            strcmp(c->state, "connected") == 0 ? a : "-", calls,
            (unsigned long long)(c->errors + c->client_errors), (unsigned long long)c->timeouts,
            (unsigned long long)c->cancels, (unsigned long long)(c->expired + c->cancelled),
            (unsigned long long)c->inflight, bin, bout,
            (unsigned long long)c->malformed, (unsigned long long)c->late);
  }
  free(ci);
  return 0;
}

int cxr__ctl_conns(int argc, char **argv, FILE *out) {
  const char *name = NULL;
  bool all = false;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--all") == 0) all = true;
    else if (argv[i][0] != '-' && name == NULL) name = argv[i];
    else {
      fprintf(stderr, "usage: cxrpcctl conns [CHANNEL] [--all]\n");
      return 2;
    }
  }
  if (name != NULL) return show(name, all, true, out);
  size_t n = 0;
  int rc = cxr_channel_list(NULL, 0, &n);
  if (rc != 0) {
    fprintf(stderr, "cxrpcctl: cannot read the registry: %s\n", cxr_strerror(rc));
    return 1;
  }
  cxr_channel_info *ch = calloc(n + 1, sizeof *ch);
  if (ch == NULL) return 1;
  size_t m = 0;
  cxr_channel_list(ch, n + 1, &m);
  if (m > n + 1) m = n + 1;
  int status = 0;
  for (size_t i = 0; i < m; i++) status |= show(ch[i].name, all, i == 0, out);
  if (m == 0) fprintf(out, "(no channels in %s)\n", cxr_root());
  free(ch);
  return status;
}

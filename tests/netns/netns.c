/* The multi-host harness (see netns.h): namespaces, a bridge, veths; cleanup at start and
 * at exit. Runs `ip` (iproute2), the tool every admin would use. */
#include "tests/netns/netns.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static int run(const char *fmt, ...) {
  char cmd[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  char full[560];
  snprintf(full, sizeof full, "%s >/dev/null 2>&1", cmd);
  int st = system(full);
  if (st != 0) fprintf(stderr, "netns: failed (%d): %s\n", st, cmd);
  return st == 0 ? 0 : -1;
}

static void del_ns(const char *name) {
  char cmd[400];
  snprintf(cmd, sizeof cmd, "ip netns del %s >/dev/null 2>&1", name);
  int rc = system(cmd);
  (void)rc;
}

void cxrt_net_sweep(void) {
  DIR *d = opendir("/var/run/netns");
  if (d == NULL) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    int pid = 0;
    if (sscanf(e->d_name, "cxr-%d-", &pid) != 1 || pid <= 0) continue;
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;  /* creator alive */
    del_ns(e->d_name);
  }
  closedir(d);
}

/* Nets of this process, deleted at exit even when a test fails. */
static cxrt_net *live[16];

static void at_exit(void) {
  for (int i = 0; i < 16; i++)
    if (live[i]) cxrt_net_down(live[i]);
}

bool cxrt_net_available(void) {
  if (geteuid() != 0) return false;
  char name[64];
  snprintf(name, sizeof name, "cxr-%d-probe", (int)getpid());
  char cmd[256];
  /* Adding is not enough: inside a bare chroot the namespace file is created but cannot be
   * bind-mounted ("/" is not a mount point), and only entering it fails. */
  snprintf(cmd, sizeof cmd, "ip netns add %s >/dev/null 2>&1 && ip -n %s link set lo up >/dev/null 2>&1",
           name, name);
  bool ok = system(cmd) == 0;
  del_ns(name);  /* also when only the add succeeded */
  return ok;
}

int cxrt_net_up(cxrt_net *net, const char *tag, int n) {
  static bool hooked;
  if (!hooked) {
    atexit(at_exit);
    hooked = true;
  }
  memset(net, 0, sizeof *net);
  if (n < 1 || n > CXRT_NET_MAX || tag == NULL) return -1;
  cxrt_net_sweep();
  int pid = (int)getpid();
  char t[13];
  snprintf(t, sizeof t, "%s", tag);  /* names stay short; pid + tag keep them unique */
  tag = t;
  snprintf(net->sw, sizeof net->sw, "cxr-%d-%s-sw", pid, tag);
  del_ns(net->sw);
  for (int i = 0; i < 16; i++)
    if (!live[i]) {
      live[i] = net;
      break;
    }
  if (run("ip netns add %s", net->sw) || run("ip -n %s link add br0 type bridge", net->sw) ||
      run("ip -n %s link set br0 up", net->sw))
    goto fail;
  for (int i = 0; i < n; i++) {
    snprintf(net->ns[i], sizeof net->ns[i], "cxr-%d-%s-%d", pid, tag, i);
    snprintf(net->ip[i], sizeof net->ip[i], "10.77.0.%d", (i + 1) & 0xff);
    del_ns(net->ns[i]);
    net->n = i + 1;
    if (run("ip netns add %s", net->ns[i]) ||
        run("ip -n %s link add p%d type veth peer name cx0 netns %s", net->sw, i, net->ns[i]) ||
        run("ip -n %s link set p%d master br0", net->sw, i) ||
        run("ip -n %s link set p%d up", net->sw, i) ||
        run("ip -n %s addr add %s/24 dev cx0", net->ns[i], net->ip[i]) ||
        run("ip -n %s link set cx0 up", net->ns[i]) ||
        run("ip -n %s link set lo up", net->ns[i]))
      goto fail;
  }
  /* The kernel reports a new link "up" asynchronously (linkwatch may wait a second), and
   * UCX ignores a device that is not up yet: wait, bounded, until every node's is. */
  for (int i = 0; i < n; i++) {
    char cmd[200];
    snprintf(cmd, sizeof cmd, "ip -n %s -o link show cx0 | grep -q 'state UP'", net->ns[i]);
    int tries = 0;
    while (system(cmd) != 0 && ++tries < 100) usleep(50000);
    if (tries >= 100) fprintf(stderr, "netns: %s: cx0 not up after 5 s\n", net->ns[i]);
  }
  return 0;
fail:
  cxrt_net_down(net);
  return -1;
}

int cxrt_net_link(const cxrt_net *net, int i, bool up) {
  if (i < 0 || i >= net->n) return -1;
  return run("ip -n %s link set cx0 %s", net->ns[i], up ? "up" : "down");
}

void cxrt_net_down(cxrt_net *net) {
  for (int i = 0; i < net->n; i++) del_ns(net->ns[i]);
  if (net->sw[0]) del_ns(net->sw);
  net->n = 0;
  net->sw[0] = '\0';
  for (int i = 0; i < 16; i++)
    if (live[i] == net) live[i] = NULL;
}

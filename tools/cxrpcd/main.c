/*
 * cxrpcd: the optional trusted supervisor of enforced mode.
 *
 *   cxrpcd serve [--socket PATH]              supervise (until SIGTERM/SIGINT); exits 1 if
 *                                             another cxrpcd answers at PATH, or if PATH's
 *                                             folder, or one above it, is another user's
 *                                             (not root's) or writable by others without
 *                                             the sticky bit
 *   cxrpcd run [--socket PATH] -- PROGRAM ... run PROGRAM under the enforcement filter
 *   cxrpcd stats [--socket PATH]              decisions so far (allowed, refused)
 *
 * PATH defaults to $CXRPC_CXRPCD, else cxrpcd.sock in the pod root ($CXRPC_ROOT, default
 * /dev/shm/cxrpc). The address window comes
 * from $CXRPC_WINDOW as everywhere in cxrpc. See docs/sandbox.md.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "sandbox/internal.h"
#include "tools/cxrpcd/supervisor.h"

static volatile sig_atomic_t stop;
static void on_signal(int sig) { (void)sig; stop = 1; }

static int usage(void) {
  fprintf(stderr, "usage: cxrpcd serve|stats [--socket PATH]\n"
                  "       cxrpcd run [--socket PATH] -- PROGRAM [ARGS...]\n");
  return 2;
}

int main(int argc, char **argv) {
  if (argc < 2) return usage();
  const char *sock = NULL;
  int i = 2;
  if (i < argc && !strcmp(argv[i], "--socket")) {
    if (i + 1 >= argc || argv[i + 1][0] == '\0') return usage(); /* not the default, silently */
    sock = argv[i + 1], i += 2;
  }
  char path[108];
  int rc = cxr__cxrpcd_path(sock, path, sizeof path);
  if (rc != 0) {
    fprintf(stderr, "cxrpcd: no socket path: %s\n", cxr_strerror(rc));
    return 2;
  }
  if (!strcmp(argv[1], "serve")) {
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* Full tables need about 4200 descriptors; the soft limit is often 1024 (serve cuts
     * its tables to what the limit leaves, so a low hard limit makes it serve fewer). */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
      rl.rlim_cur = rl.rlim_max;
      setrlimit(RLIMIT_NOFILE, &rl);
    }
    return cxrpcd_serve(path, &stop) == 0 ? 0 : 1;
  }
  if (!strcmp(argv[1], "run")) {
    if (i < argc && !strcmp(argv[i], "--")) i++;
    if (i >= argc) return usage();
    cxrpcd_run(path, argv + i);
    return 127;
  }
  if (!strcmp(argv[1], "stats")) {
    int s = cxr__cxrpcd_connect(path, 0);
    if (s < 0) return fprintf(stderr, "cxrpcd: no supervisor at %s\n", path), 1;
    cxr__cxrpcd_msg m = {.magic = CXR__CXRPCD_MAGIC, .type = CXR__MSG_STATS};
    if (cxr__msg_send(s, &m, -1) || cxr__msg_recv(s, &m, NULL, 2000000000ll)) return 1;
    printf("allowed %llu refused %llu\n", (unsigned long long)m.allowed,
           (unsigned long long)m.refused);
    return 0;
  }
  return usage();
}

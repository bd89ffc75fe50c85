/* cxrpcctl: inspect a running pod from outside. One subcommand per file; add yours to the
 * table below (and its library to the cxrpcctl deps in tools/BUILD). */
#include <stdio.h>
#include <string.h>

#include "tools/channels.h"
#include "tools/conns.h"
#include "tools/doctor.h"
#include "tools/heaps.h"

typedef struct subcommand {
  const char *name;
  const char *help;
  int (*run)(int argc, char **argv, FILE *out);
} subcommand;

static const subcommand commands[] = {
    {"heaps", "heaps of this pod: address, size, use, holders, leases [--reap]", cxr__ctl_heaps},
    {"channels", "rpc channels: server, state, permissions, connections, ready pool", cxr__ctl_channels},
    {"conns", "connections with their counters [CHANNEL] [--all: also the ready pool]", cxr__ctl_conns},
    {"doctor", "what this machine offers: RDMA devices, UCX transports, pkeys, DAX", cxr__doctor},
};

static int usage(FILE *f) {
  fprintf(f, "usage: cxrpcctl COMMAND [ARGS]\n");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].help);
  return 2;
}

int main(int argc, char **argv) {
  if (argc < 2) return usage(stderr);
  if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
    usage(stdout);
    return 0;
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1, stdout);
  fprintf(stderr, "cxrpcctl: unknown command '%s'\n", argv[1]);
  return usage(stderr);
}

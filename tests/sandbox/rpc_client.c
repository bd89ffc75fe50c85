/*
 * A client for rpc_enforce_test, run under `cxrpcd run`: makes a sealed asynchronous call,
 * then on "attack" from stdin tries to unseal its argument page while the server holds
 * it, and reports each step on stdout.  rpc_client CHANNEL
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <cxrpc/seal.h>

static int store(void *p) {
  *(volatile char *)p = 1;
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  setenv("CXRPC_SEAL_BATCH", "1", 1);
  cxr_conn *c;
  int rc = cxr_connect(&c, argv[1], NULL);
  if (rc) {
    printf("connect %d\n", rc);
    return 1;
  }
  unsigned char *a = cxr_heap_alloc_pages(cxr_conn_heap(c), 4096);
  if (!a) return 1;
  memset(a, 0x5a, 4096);
  cxr_call_opts o;
  cxr_call_opts_init(&o);
  o.flags = CXR_CALL_SEAL;
  o.arg_len = 4096;
  o.deadline_ns = 20000000000ll;
  cxr_future *f = NULL;
  rc = cxr_conn_call_async(c, 1, a, &f, &o);
  printf("called %d\n", rc);
  fflush(stdout);
  char line[64];
  if (!fgets(line, sizeof line, stdin)) return 1;
  int r1 = mprotect(a, 4096, PROT_READ | PROT_WRITE) ? -errno : 0;
  void *m = mremap(a, 0, 4096, MREMAP_MAYMOVE);
  int r2 = m == MAP_FAILED ? -errno : 0;
  int r3 = cxr_sandbox_run(store, a);
  printf("attack %d %d %d\n", r1, r2, r3);
  fflush(stdout);
  void *res = NULL;
  rc = f ? cxr_future_wait(f, 20000000000ll, &res) : -1;
  printf("done %d\n", rc);
  cxr_future_free(f); /* releases the seal: the supervisor lets this raise through */
  printf("write %d\n", cxr_sandbox_run(store, a));
  fflush(stdout);
  cxr_conn_close(c);
  return 0;
}

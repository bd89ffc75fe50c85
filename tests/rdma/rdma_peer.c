/* A real peer process for the rdma tests: `rdma_peer serve ADDR:PORT [export_bytes]`
 * listens, exports "mem" (filled with bytes i & 0xff), echoes messages 20 -> 21 (header
 * and data) and prints "READY <port>" on stdout. It runs until stdin reaches EOF or it is
 * killed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cxrpc/rdma.h>

static void echo(cxr_rdma_msg *m, void *user) {
  size_t hl, dl;
  const void *h = cxr_rdma_msg_hdr(m, &hl);
  const void *d = cxr_rdma_msg_data(m, &dl);
  struct iovec iov = {(void *)d, dl};
  cxr_rdma_reply(m, 21, h, hl, dl ? &iov : NULL, dl ? 1 : 0, 0);
}

int main(int argc, char **argv) {
  if (argc < 3 || strcmp(argv[1], "serve")) {
    fprintf(stderr, "usage: rdma_peer serve ADDR:PORT [export_bytes]\n");
    return 2;
  }
  size_t len = argc > 3 ? strtoull(argv[3], NULL, 0) : (4u << 20);
  cxr_rdma_opts o;
  cxr_rdma_opts_init(&o);
  o.listen = argv[2];
  cxr_rdma *r;
  int rc = cxr_rdma_open(&r, &o);
  if (rc) {
    fprintf(stderr, "rdma_peer: open: %s\n", cxr_strerror(rc));
    return 1;
  }
  unsigned char *mem = aligned_alloc(4096, len);
  for (size_t i = 0; i < len; i++) mem[i] = (unsigned char)i;
  cxr_rdma_mr *mr;
  rc = cxr_rdma_export(r, "mem", mem, len, &mr);
  if (rc == 0) rc = cxr_rdma_am_set(r, 20, echo, NULL);
  if (rc) {
    fprintf(stderr, "rdma_peer: export: %s\n", cxr_strerror(rc));
    return 1;
  }
  printf("READY %d %p\n", cxr_rdma_port(r), (void *)mem);
  fflush(stdout);
  char c;
  while (read(0, &c, 1) > 0) {
  }
  cxr_rdma_close(r);
  free(mem);
  return 0;
}

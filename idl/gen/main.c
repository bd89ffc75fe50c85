/* protoc-gen-cxrpc: protoc runs it with a CodeGeneratorRequest on stdin and reads the
 * CodeGeneratorResponse from stdout:
 *   protoc --plugin=protoc-gen-cxrpc=PATH --cxrpc_out=DIR foo.proto */
#include <stdio.h>
#include <stdlib.h>

#include "idl/gen/gen.h"

#define MAX_REQUEST ((size_t)256 << 20)

int main(void) {
  size_t cap = 1 << 16, len = 0;
  unsigned char *buf = malloc(cap);
  if (!buf) return 1;
  for (;;) {
    if (len == cap) {
      if (cap >= MAX_REQUEST) {
        fprintf(stderr, "protoc-gen-cxrpc: request larger than %zu bytes\n", MAX_REQUEST);
        return 1;
      }
      unsigned char *n = realloc(buf, cap * 2);
      if (!n) return 1;
      buf = n, cap *= 2;
    }
    size_t r = fread(buf + len, 1, cap - len, stdin);
    len += r;
    if (r == 0) break;
  }
  if (ferror(stdin)) {
    perror("protoc-gen-cxrpc: reading the request");
    return 1;
  }
  unsigned char *out = NULL;
  size_t olen = 0;
  int rc = cxr_gen_run(buf, len, &out, &olen);
  free(buf);
  if (rc != 0) {
    fprintf(stderr, "protoc-gen-cxrpc: out of memory\n");
    return 1;
  }
  int ok = fwrite(out, 1, olen, stdout) == olen && fflush(stdout) == 0;
  free(out);
  return ok ? 0 : 1;
}

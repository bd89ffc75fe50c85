/* libFuzzer target over the plugin's input: any bytes as a CodeGeneratorRequest must give
 * a response (generated files or an error), never a crash, a hang or a leak. */
#include <stdint.h>
#include <stdlib.h>

#include "idl/gen/gen.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t *out = NULL;
  size_t n = 0;
  if (cxr_gen_run(data, size, &out, &n) != 0) abort();  /* only out of memory may fail */
  free(out);
  return 0;
}

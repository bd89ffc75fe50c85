/* A main for the fuzz targets when libFuzzer is not there (gcc, plain CI): runs the target
 * on the files named on the command line, then on CXR_FUZZ_RUNS (default 3000) inputs from
 * a fixed pseudo-random generator, a tenth of the words tagged as in-block pointers. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return rng;
}

int main(int argc, char **argv) {
  static uint8_t buf[1 << 16];
  for (int i = 1; i < argc; i++) {
    FILE *f = fopen(argv[i], "rb");
    if (!f) continue;
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    LLVMFuzzerTestOneInput(buf, n);
  }
  const char *e = getenv("CXR_FUZZ_RUNS");
  long runs = e ? atol(e) : 3000;
  for (long k = 0; k < runs; k++) {
    size_t n = 2 + next() % 4096;
    for (size_t i = 0; i < n; i += 8) {
      uint64_t w = next();
      switch (w % 10) {
        case 0: w = 0xC0DEull << 48 | (next() % 4096 & ~7ull); break;
        case 1: w = next() % 16; break;
        case 2: w = 0; break;
        default: break;
      }
      memcpy(buf + i, &w, i + 8 <= sizeof buf ? 8 : sizeof buf - i);
    }
    LLVMFuzzerTestOneInput(buf, n);
  }
  printf("%ld inputs, no crash\n", runs + argc - 1);
  return 0;
}

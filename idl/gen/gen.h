/* protoc-gen-cxrpc as a library: one CodeGeneratorRequest in, one response out. */
#ifndef CXR_GEN_GEN_H
#define CXR_GEN_GEN_H

#include <stddef.h>
#include <stdint.h>

/* Decodes req, generates, and encodes a CodeGeneratorResponse into *resp (malloc'd).
 * Errors in the request are reported inside the response (its error field), as protoc
 * expects; returns -1 only when no response could be built (out of memory). */
int cxr_gen_run(const uint8_t *req, size_t len, uint8_t **resp, size_t *resp_len);

#endif

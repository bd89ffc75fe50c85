/* Decodes the request, builds the model, runs each emitter, encodes the response. */
#include "idl/gen/gen.h"

#include <stdlib.h>
#include <string.h>

#include "idl/gen/model.h"

typedef Google__Protobuf__Compiler__CodeGeneratorResponse Response;
typedef Google__Protobuf__Compiler__CodeGeneratorResponse__File OutFile;

static int encode(Response *r, uint8_t **out, size_t *len) {
  size_t n = google__protobuf__compiler__code_generator_response__get_packed_size(r);
  uint8_t *b = malloc(n ? n : 1);
  if (!b) return -1;
  *len = google__protobuf__compiler__code_generator_response__pack(r, b);
  *out = b;
  return 0;
}

static int fail(const char *msg, uint8_t **out, size_t *len) {
  Response r = GOOGLE__PROTOBUF__COMPILER__CODE_GENERATOR_RESPONSE__INIT;
  r.error = (char *)msg;
  r.has_supported_features = 1;
  r.supported_features =
      GOOGLE__PROTOBUF__COMPILER__CODE_GENERATOR_RESPONSE__FEATURE__FEATURE_PROTO3_OPTIONAL;
  return encode(&r, out, len);
}

int cxr_gen_run(const uint8_t *req, size_t len, uint8_t **resp, size_t *resp_len) {
  Google__Protobuf__Compiler__CodeGeneratorRequest *rq =
      google__protobuf__compiler__code_generator_request__unpack(NULL, len, req);
  if (!rq) return fail("protoc-gen-cxrpc: cannot decode the CodeGeneratorRequest", resp, resp_len);
  gm_model m;
  memset(&m, 0, sizeof m);
  int rc;
  if (!gm_build(&m, rq)) {
    rc = fail(m.err, resp, resp_len);
    gm_free(&m);
    google__protobuf__compiler__code_generator_request__free_unpacked(rq, NULL);
    return rc;
  }
  size_t ngen = 0;
  for (size_t i = 0; i < m.nfiles; i++) ngen += m.files[i].generate;
  gen_buf *bufs = calloc(2 * ngen + 1, sizeof *bufs);
  OutFile *files = calloc(2 * ngen + 1, sizeof *files);
  OutFile **fptrs = calloc(2 * ngen + 1, sizeof *fptrs);
  char **names = calloc(2 * ngen + 1, sizeof *names);
  bool oom = !bufs || !files || !fptrs || !names;
  size_t k = 0;
  for (size_t i = 0; !oom && i < m.nfiles; i++) {
    const gm_file *f = &m.files[i];
    if (!f->generate) continue;
    gen_buf *h = &bufs[k], *c = &bufs[k + 1];
    emit_prologue(h, c, f);
    emit_structs(h, c, f);
    emit_validate(h, c, f);
    emit_copy(h, c, f);
    emit_pb(h, c, f);
    emit_service(h, c, f);
    emit_epilogue(h, c, f);
    names[k] = ga_printf(&m.arena, "%s.cxr.h", f->base);
    names[k + 1] = ga_printf(&m.arena, "%s.cxr.c", f->base);
    for (size_t j = k; j < k + 2; j++) {
      if (bufs[j].oom || !names[j]) {
        oom = true;
        break;
      }
      gb_printf(&bufs[j], "%s", "");  /* make sure p exists and is terminated */
      google__protobuf__compiler__code_generator_response__file__init(&files[j]);
      files[j].name = names[j];
      files[j].content = bufs[j].p ? bufs[j].p : (char *)"";
      fptrs[j] = &files[j];
    }
    k += 2;
  }
  if (oom) {
    rc = fail("protoc-gen-cxrpc: out of memory", resp, resp_len);
  } else {
    Response r = GOOGLE__PROTOBUF__COMPILER__CODE_GENERATOR_RESPONSE__INIT;
    r.has_supported_features = 1;
    r.supported_features =
        GOOGLE__PROTOBUF__COMPILER__CODE_GENERATOR_RESPONSE__FEATURE__FEATURE_PROTO3_OPTIONAL;
    r.n_file = k;
    r.file = fptrs;
    rc = encode(&r, resp, resp_len);
  }
  for (size_t j = 0; bufs && j < 2 * ngen; j++) gb_free(&bufs[j]);
  free(bufs);
  free(files);
  free(fptrs);
  free(names);
  gm_free(&m);
  google__protobuf__compiler__code_generator_request__free_unpacked(rq, NULL);
  return rc;
}

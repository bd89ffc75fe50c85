/* protobuf-c conversion helpers for generated code. */
#include <cxrpc/idl_pb.h>

#include <stdlib.h>
#include <string.h>

void *cxr__pb_new(const ProtobufCMessageDescriptor *d) {
  void *p = malloc(d->sizeof_message);
  if (p) protobuf_c_message_init(d, p);
  return p;
}

int cxr__pb_str(char **d, cxr_str s) {
  if (s.len && memchr(s.ptr, 0, s.len)) return CXR_EINVAL;
  if (s.len >= SIZE_MAX) return CXR_ENOMEM;
  char *p = malloc(s.len + 1);
  if (!p) return CXR_ENOMEM;
  if (s.len) memcpy(p, s.ptr, s.len);
  p[s.len] = 0;
  *d = p;
  return 0;
}

int cxr__pb_bytes(ProtobufCBinaryData *d, cxr_bytes s) {
  d->len = 0;
  d->data = NULL;
  if (!s.len) return 0;
  d->data = malloc(s.len);
  if (!d->data) return CXR_ENOMEM;
  memcpy(d->data, s.ptr, s.len);
  d->len = s.len;
  return 0;
}

int cxr__pb_arr(void **d, size_t n, size_t elem) {
  *d = NULL;
  if (!n) return 0;
  *d = calloc(n, elem);
  return *d ? 0 : CXR_ENOMEM;
}

int cxr__cx_str(cxr_heap *h, cxr_str *d, const char *s) {
  d->ptr = NULL;
  d->len = 0;
  if (!s || !*s) return 0;
  return cxr_str_set(h, d, s, strlen(s));
}

int cxr__cx_bytes(cxr_heap *h, cxr_bytes *d, ProtobufCBinaryData s) {
  d->ptr = NULL;
  d->len = 0;
  if (!s.len) return 0;
  if (!s.data) return CXR_EPROTO;
  return cxr_bytes_set(h, d, s.data, s.len);
}

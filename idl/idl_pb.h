/*
 * cxrpc/idl_pb.h: helpers that generated protobuf-c conversions call (<Msg>_to_pb and
 * <Msg>_from_pb). Internal to generated code; protobuf-c messages made by <Msg>_to_pb are
 * in malloc memory and are freed with protobuf_c_message_free_unpacked(&pb->base, NULL)
 * (or <Msg>_pb_free).
 */
#ifndef CXRPC_IDL_PB_H
#define CXRPC_IDL_PB_H

#include <cxrpc/idl.h>
#include <protobuf-c/protobuf-c.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A malloc'd, initialised protobuf-c message of descriptor d (NULL when out of memory). */
void *cxr__pb_new(const ProtobufCMessageDescriptor *d);
/* malloc'd NUL-terminated copy of s; an embedded NUL is refused (CXR_EINVAL) because
 * protobuf-c strings cannot carry one. */
int cxr__pb_str(char **d, cxr_str s);
int cxr__pb_bytes(ProtobufCBinaryData *d, cxr_bytes s);
/* calloc'd array of n elements (NULL when n is 0). */
int cxr__pb_arr(void **d, size_t n, size_t elem);
/* Into the heap: a protobuf-c string (NULL = empty) or bytes. */
int cxr__cx_str(cxr_heap *h, cxr_str *d, const char *s);
int cxr__cx_bytes(cxr_heap *h, cxr_bytes *d, ProtobufCBinaryData s);

#ifdef __cplusplus
}
#endif
#endif

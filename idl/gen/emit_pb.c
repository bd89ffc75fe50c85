/* Emits conversion to and from the protobuf-c structs that protoc-c generates for the same
 * file, so a message can go to any protobuf peer (pack/unpack with protobuf-c). */
#include <stdio.h>

#include "idl/gen/model.h"

/* One value, cxrpc expression `x` into protobuf-c lvalue `p`. */
static void to_value(gen_buf *c, const gm_field *f, const char *p, const char *x,
                     const char *ind) {
  switch (f->kind) {
    case GK_BOOL:
      gb_printf(c, "%s%s = %s ? 1 : 0;\n", ind, p, x);
      break;
    case GK_ENUM:
      gb_printf(c, "%s%s = (__typeof__(%s))%s;\n", ind, p, p, x);
      break;
    case GK_STRING:
      gb_printf(c, "%sif ((rc = cxr__pb_str(&%s, %s))) return rc;\n", ind, p, x);
      break;
    case GK_BYTES:
      gb_printf(c, "%sif ((rc = cxr__pb_bytes(&%s, %s))) return rc;\n", ind, p, x);
      break;
    case GK_MESSAGE: /* the pointer read once: tested and followed as the same value */
      gb_printf(c, "%s{\n%s  const %s *src_msg = CXR__LOAD(&%s);\n", ind, ind, f->msg->cname, x);
      gb_printf(c, "%s  if (src_msg) {\n", ind);
      gb_printf(c, "%s    if (!(%s = (%s *)cxr__pb_new(&%s))) return CXR_ENOMEM;\n", ind, p,
                f->msg->pbtype, f->msg->pbdesc);
      gb_printf(c, "%s    if ((rc = %s__tpb(src_msg, %s, depth + 1))) return rc;\n%s  }", ind,
                f->msg->cname, p, ind);
      if (f->required)
        gb_printf(c, " else {\n%s    return CXR_EINVAL; /* required */\n%s  }", ind, ind);
      gb_printf(c, "\n%s}\n", ind);
      break;
    default:
      gb_printf(c, "%s%s = %s;\n", ind, p, x);
  }
}

/* One value, protobuf-c expression `p` into cxrpc lvalue `x` (zeroed). */
static void from_value(gen_buf *c, const gm_field *f, const char *x, const char *p,
                       const char *ind, const char *guard) {
  switch (f->kind) {
    case GK_BOOL:
      gb_printf(c, "%s%s = %s != 0;\n", ind, x, p);
      break;
    case GK_ENUM:
      gb_printf(c, "%s%s = (int32_t)%s;\n", ind, x, p);
      if (f->en->closed)
        gb_printf(c, "%sif (%s!%s_is_valid(%s)) return CXR_EPROTO;\n", ind, guard,
                  f->en->cname, x);
      break;
    case GK_STRING:
      gb_printf(c, "%sif ((rc = cxr__cx_str(h, &%s, %s))) return rc;\n", ind, x, p);
      break;
    case GK_BYTES:
      gb_printf(c, "%sif ((rc = cxr__cx_bytes(h, &%s, %s))) return rc;\n", ind, x, p);
      break;
    case GK_MESSAGE:
      gb_printf(c, "%sif (%s) {\n", ind, p);
      gb_printf(c, "%s  if (!(%s = %s_new(h))) return CXR_ENOMEM;\n", ind, x, f->msg->cname);
      gb_printf(c, "%s  if ((rc = %s__fpb(h, %s, %s, depth + 1))) return rc;\n%s}\n", ind,
                f->msg->cname, p, x, ind);
      break;
    default:
      gb_printf(c, "%s%s = %s;\n", ind, x, p);
  }
}

static void to_field(gen_buf *c, const gm_field *f, const char *cx, const char *ind) {
  char p[512], x[512];
  const char *pn = f->pbname;
  if (f->repeated) {
    /* The count and the items pointer read once (a writer of unsealed shared memory may
     * change them meanwhile): the array is allocated, counted and filled by the same count. */
    gb_printf(c, "%s{\n%s  __typeof__(&m->%s.items[0]) src_items = CXR__LOAD(&m->%s.items);\n",
              ind, ind, f->cname, f->cname);
    gb_printf(c, "%s  uint64_t src_count = CXR__LOAD(&m->%s.count);\n", ind, f->cname);
    gb_printf(c, "%s  if (src_count) {\n%s    if (!src_items) return CXR_EPROTO;\n", ind, ind);
    gb_printf(c, "%s    pb->%s = (__typeof__(pb->%s))calloc(src_count, sizeof *pb->%s);\n", ind,
              pn, pn, pn);
    gb_printf(c, "%s    if (!pb->%s) return CXR_ENOMEM;\n%s    pb->n_%s = src_count;\n", ind, pn,
              ind, pn);
    gb_printf(c, "%s    for (uint64_t i = 0; i < src_count; i++) {\n", ind);
    snprintf(p, sizeof p, "pb->%s[i]", pn);
    if (f->kind == GK_MESSAGE) {
      gb_printf(c, "%s      if (!(%s = (%s *)cxr__pb_new(&%s))) return CXR_ENOMEM;\n", ind, p,
                f->msg->pbtype, f->msg->pbdesc);
      gb_printf(c, "%s      if ((rc = %s__tpb(&src_items[i], %s, depth + 1))) return rc;\n", ind,
                f->msg->cname, p);
    } else {
      snprintf(x, sizeof x, "src_items[i]");
      char ind2[64];
      snprintf(ind2, sizeof ind2, "%s      ", ind);
      to_value(c, f, p, x, ind2);
    }
    gb_printf(c, "%s    }\n%s  }\n%s}\n", ind, ind, ind);
    return;
  }
  snprintf(p, sizeof p, "pb->%s", pn);
  if (f->pb_has && f->has_flag)
    gb_printf(c, "%spb->has_%s = m->has_%s;\n", ind, pn, f->cname);
  else if (f->pb_has)  /* map entries: always present */
    gb_printf(c, "%spb->has_%s = 1;\n", ind, pn);
  if (f->has_flag) {
    gb_printf(c, "%sif (m->has_%s) {\n", ind, f->cname);
    char ind2[64];
    snprintf(ind2, sizeof ind2, "%s  ", ind);
    to_value(c, f, p, cx, ind2);
    gb_printf(c, "%s}\n", ind);
  } else {
    to_value(c, f, p, cx, ind);
  }
}

static void from_field(gen_buf *c, const gm_field *f, const char *cx, const char *ind) {
  char p[512], x[512];
  const char *pn = f->pbname;
  if (f->repeated) {
    gb_printf(c, "%sif (pb->n_%s) {\n%s  if (!pb->%s) return CXR_EPROTO;\n", ind, pn, ind, pn);
    gb_printf(c, "%s  if (!CXR_VEC_ALLOC(h, m->%s, pb->n_%s)) return CXR_ENOMEM;\n", ind,
              f->cname, pn);
    gb_printf(c, "%s  for (size_t i = 0; i < pb->n_%s; i++) {\n", ind, pn);
    snprintf(p, sizeof p, "pb->%s[i]", pn);
    snprintf(x, sizeof x, "m->%s.items[i]", f->cname);
    if (f->kind == GK_MESSAGE) {
      gb_printf(c, "%s    if (!%s) return CXR_EPROTO;\n", ind, p);
      gb_printf(c, "%s    if ((rc = %s__fpb(h, %s, &%s, depth + 1))) return rc;\n", ind,
                f->msg->cname, p, x);
    } else {
      char ind2[64];
      snprintf(ind2, sizeof ind2, "%s    ", ind);
      from_value(c, f, x, p, ind2, "");
    }
    gb_printf(c, "%s  }\n%s}\n", ind, ind);
    return;
  }
  snprintf(p, sizeof p, "pb->%s", pn);
  char guard[300] = "";
  if (f->has_flag) {
    if (f->pb_has)
      gb_printf(c, "%sm->has_%s = pb->has_%s != 0;\n", ind, f->cname, pn);
    else  /* proto2 optional string: protobuf-c says absent with NULL */
      gb_printf(c, "%sm->has_%s = pb->%s != NULL;\n", ind, f->cname, pn);
    snprintf(guard, sizeof guard, "m->has_%s && ", f->cname);
  }
  from_value(c, f, cx, p, ind, guard);
}

static void member(char *buf, size_t n, const gm_msg *g, const gm_field *f) {
  if (f->oneof >= 0)
    snprintf(buf, n, "m->%s.%s", g->oneofs[f->oneof].cname, f->cname);
  else
    snprintf(buf, n, "m->%s", f->cname);
}

static void emit_tpb(gen_buf *c, const gm_msg *g) {
  char x[512];
  gb_printf(c, "\nint %s__tpb(const void *src, void *dst, unsigned depth) {\n", g->cname);
  gb_printf(c, "  const %s *m = (const %s *)src;\n  %s *pb = (%s *)dst;\n  int rc = 0;\n",
            g->cname, g->cname, g->pbtype, g->pbtype);
  gb_printf(c, "  (void)m, (void)pb;\n  if (depth > CXR__MAX_DEPTH) return CXR_EPROTO;\n");
  for (size_t i = 0; i < g->nfields; i++) {
    const gm_field *f = &g->fields[i];
    if (f->oneof >= 0) continue;
    member(x, sizeof x, g, f);
    to_field(c, f, x, "  ");
  }
  for (size_t o = 0; o < g->noneofs; o++) {
    gb_printf(c, "  switch (CXR__LOAD(&m->%s_case)) { /* read once */\n", g->oneofs[o].cname);
    for (size_t i = 0; i < g->nfields; i++) {
      const gm_field *f = &g->fields[i];
      if (f->oneof != (int)o) continue;
      gb_printf(c, "    case %d:\n", f->number);
      gb_printf(c, "      pb->%s = (__typeof__(pb->%s))%d;\n", g->oneofs[o].pbcase,
                g->oneofs[o].pbcase, f->number);
      member(x, sizeof x, g, f);
      to_field(c, f, x, "      ");
      gb_printf(c, "      break;\n");
    }
    gb_printf(c, "    default:\n      break;\n  }\n");
  }
  gb_printf(c, "  return rc;\n}\n");
}

static void emit_fpb(gen_buf *c, const gm_msg *g) {
  char x[512];
  gb_printf(c, "\nint %s__fpb(cxr_heap *h, const void *src, void *dst, unsigned depth) {\n",
            g->cname);
  gb_printf(c, "  const %s *pb = (const %s *)src;\n  %s *m = (%s *)dst;\n  int rc = 0;\n",
            g->pbtype, g->pbtype, g->cname, g->cname);
  gb_printf(c, "  (void)h, (void)m, (void)pb;\n  if (depth > CXR__MAX_DEPTH) return CXR_EPROTO;\n");
  for (size_t i = 0; i < g->nfields; i++) {
    const gm_field *f = &g->fields[i];
    if (f->oneof >= 0) continue;
    member(x, sizeof x, g, f);
    from_field(c, f, x, "  ");
  }
  for (size_t o = 0; o < g->noneofs; o++) {
    gb_printf(c, "  switch ((int)pb->%s) {\n    case 0:\n      break;\n", g->oneofs[o].pbcase);
    for (size_t i = 0; i < g->nfields; i++) {
      const gm_field *f = &g->fields[i];
      if (f->oneof != (int)o) continue;
      gb_printf(c, "    case %d:\n      m->%s_case = %d;\n", f->number, g->oneofs[o].cname,
                f->number);
      member(x, sizeof x, g, f);
      from_field(c, f, x, "      ");
      gb_printf(c, "      break;\n");
    }
    gb_printf(c, "    default:\n      return CXR_EPROTO;\n  }\n");
  }
  gb_printf(c, "  return rc;\n}\n");
}

void emit_pb(gen_buf *h, gen_buf *c, const gm_file *f) {
  if (!f->nmsgs) return;
  gb_printf(h,
            "\n/* protobuf-c interop (structs from protoc-c for this file):\n"
            " * _to_pb: a malloc'd protobuf-c copy of a trusted graph; free it with _pb_free.\n"
            " * _from_pb: a copy in heap h of an unpacked protobuf-c message (CXR_EPROTO for a\n"
            " *   value outside a closed enum or a malformed message). */\n");
  for (size_t i = 0; i < f->nmsgs; i++) {
    const gm_msg *g = f->msgs[i];
    gb_printf(h, "int %s_to_pb(const %s *m, %s **out);\n", g->cname, g->cname, g->pbtype);
    gb_printf(h, "int %s_from_pb(cxr_heap *h, const %s *pb, %s **out);\n", g->cname, g->pbtype,
              g->cname);
    gb_printf(h, "void %s_pb_free(%s *pb);\n", g->cname, g->pbtype);
  }
  gb_printf(h, "/* internal */\n");
  for (size_t i = 0; i < f->nmsgs; i++) {
    const gm_msg *g = f->msgs[i];
    gb_printf(h, "int %s__tpb(const void *src, void *dst, unsigned depth);\n", g->cname);
    gb_printf(h, "int %s__fpb(cxr_heap *h, const void *src, void *dst, unsigned depth);\n",
              g->cname);
  }
  for (size_t i = 0; i < f->nmsgs; i++) {
    const gm_msg *g = f->msgs[i];
    const char *n = g->cname, *t = g->pbtype;
    emit_tpb(c, g);
    emit_fpb(c, g);
    gb_printf(c,
              "\nint %s_to_pb(const %s *m, %s **out) {\n"
              "  if (!m || !out) return CXR_EINVAL;\n"
              "  %s *pb = (%s *)cxr__pb_new(&%s);\n  if (!pb) return CXR_ENOMEM;\n"
              "  int rc = %s__tpb(m, pb, 0);\n"
              "  if (rc) {\n    protobuf_c_message_free_unpacked(&pb->base, NULL);\n    return rc;\n  }\n"
              "  *out = pb;\n  return 0;\n}\n",
              n, n, t, t, t, g->pbdesc, n);
    gb_printf(c,
              "\nint %s_from_pb(cxr_heap *h, const %s *pb, %s **out) {\n"
              "  if (!h || !pb || !out) return CXR_EINVAL;\n"
              "  %s *m = %s_new(h);\n  if (!m) return CXR_ENOMEM;\n"
              "  int rc = %s__fpb(h, pb, m, 0);\n"
              "  if (rc) {\n    %s_free(h, m);\n    return rc;\n  }\n  *out = m;\n  return 0;\n}\n",
              n, t, n, n, n, n, n);
    gb_printf(c,
              "\nvoid %s_pb_free(%s *pb) {\n  if (pb) protobuf_c_message_free_unpacked(&pb->base, NULL);\n}\n",
              n, t);
  }
}

/* Emits validators: <Msg>_validate checks a graph from an untrusted peer (every pointer in
 * range and aligned, lengths bounded, cycles and depth bounded, bools and closed enums in
 * their domain, oneof cases known) before anyone else reads it. */
#include <stdio.h>

#include "idl/gen/model.h"

#define RET "return rc;"

/* Checks one value held at expression `e` (a member of m or of a union). */
static void check_value(gen_buf *c, const gm_field *x, const char *e, const char *ind,
                        bool has_guard) {
  switch (x->kind) {
    case GK_BOOL:
      gb_printf(c, "%sif ((rc = cxr__v_bool(v, &%s))) " RET "\n", ind, e);
      break;
    case GK_ENUM:
      if (!x->en->closed) break;
      if (has_guard)
        gb_printf(c, "%sif (m->has_%s && !%s_is_valid(%s))\n", ind, x->cname, x->en->cname, e);
      else
        gb_printf(c, "%sif (!%s_is_valid(%s))\n", ind, x->en->cname, e);
      gb_printf(c, "%s  return cxr__v_fail(v, CXR_INVALID_ENUM);\n", ind);
      break;
    case GK_STRING:
      gb_printf(c, "%sif ((rc = cxr__v_str(v, &%s))) " RET "\n", ind, e);
      break;
    case GK_BYTES:
      gb_printf(c, "%sif ((rc = cxr__v_bytes(v, &%s))) " RET "\n", ind, e);
      break;
    case GK_MESSAGE:
      gb_printf(c, "%sif ((rc = cxr__v_msg(v, %s, sizeof(%s), _Alignof(%s), %s__vin, %s)))\n",
                ind, e, x->msg->cname, x->msg->cname, x->msg->cname,
                x->required ? "true" : "false");
      gb_printf(c, "%s  " RET "\n", ind);
      break;
    default:
      break;  /* integers and floats: every bit pattern is valid */
  }
}

static void check_repeated(gen_buf *c, const gm_field *x) {
  const char *n = x->cname;
  switch (x->kind) {
    case GK_BOOL:
      gb_printf(c, "  if ((rc = cxr__v_bools(v, &m->%s))) " RET "\n", n);
      break;
    case GK_ENUM:
      if (x->en->closed) {
        gb_printf(c, "  if ((rc = cxr__v_enums(v, &m->%s, %s_is_valid))) " RET "\n", n,
                  x->en->cname);
        break;
      }
      __attribute__((fallthrough)); /* an open enum array is an int32 array */
    case GK_DOUBLE:
    case GK_FLOAT:
    case GK_INT32:
    case GK_INT64:
    case GK_UINT32:
    case GK_UINT64:
      gb_printf(c,
                "  if ((rc = cxr__v_block(v, m->%s.items, m->%s.count, sizeof *m->%s.items,\n"
                "                         _Alignof(__typeof__(*m->%s.items)))))\n    " RET "\n",
                n, n, n, n);
      break;
    case GK_STRING:
      gb_printf(c, "  if ((rc = cxr__v_strs(v, &m->%s))) " RET "\n", n);
      break;
    case GK_BYTES:
      gb_printf(c, "  if ((rc = cxr__v_bytess(v, &m->%s))) " RET "\n", n);
      break;
    case GK_MESSAGE:
      gb_printf(c,
                "  if ((rc = cxr__v_msgs(v, m->%s.items, m->%s.count, sizeof(%s), "
                "_Alignof(%s), %s__vin)))\n    " RET "\n",
                n, n, x->msg->cname, x->msg->cname, x->msg->cname);
      break;
  }
}

static void emit_vin(gen_buf *c, const gm_msg *g) {
  gb_printf(c, "\nint %s__vin(cxr__vctx *v, const void *p) {\n", g->cname);
  gb_printf(c, "  const %s *m = (const %s *)p;\n  int rc = 0;\n  (void)v, (void)m;\n", g->cname, g->cname);
  char e[512];
  for (size_t i = 0; i < g->nfields; i++) {
    const gm_field *x = &g->fields[i];
    if (x->oneof >= 0) continue;
    if (x->has_flag) gb_printf(c, "  if ((rc = cxr__v_bool(v, &m->has_%s))) " RET "\n", x->cname);
    if (x->repeated) {
      check_repeated(c, x);
    } else {
      snprintf(e, sizeof e, "m->%s", x->cname);
      check_value(c, x, e, "  ", x->has_flag);
    }
  }
  for (size_t o = 0; o < g->noneofs; o++) {
    const gm_oneof *on = &g->oneofs[o];
    gb_printf(c, "  switch (m->%s_case) {\n    case 0:\n      break;\n", on->cname);
    for (size_t i = 0; i < g->nfields; i++) {
      const gm_field *x = &g->fields[i];
      if (x->oneof != (int)o) continue;
      gb_printf(c, "    case %d:\n", x->number);
      snprintf(e, sizeof e, "m->%s.%s", on->cname, x->cname);
      check_value(c, x, e, "      ", false);
      gb_printf(c, "      break;\n");
    }
    gb_printf(c, "    default:\n      return cxr__v_fail(v, CXR_INVALID_ONEOF);\n  }\n");
  }
  gb_printf(c, "  return rc;\n}\n");
}

void emit_validate(gen_buf *h, gen_buf *c, const gm_file *f) {
  if (!f->nmsgs) return;
  gb_printf(h,
            "\n/* Validators: 0 when the graph at m lies inside r and respects lim (NULL, or "
            "a zero field:\n * defaults, see cxr_limits_init); else CXR_EBADPTR or CXR_EPROTO, "
            "with "
            "cxr_invalid_reason().\n * Run them on memory the peer can no longer change "
            "(sealed), or the check can race. */\n");
  for (size_t i = 0; i < f->nmsgs; i++) {
    const char *n = f->msgs[i]->cname;
    gb_printf(h, "int %s_validate(const %s *m, const cxr_range *r, const cxr_limits *lim);\n",
              n, n);
  }
  gb_printf(h, "/* internal */\n");
  for (size_t i = 0; i < f->nmsgs; i++)
    gb_printf(h, "int %s__vin(cxr__vctx *v, const void *p);\n", f->msgs[i]->cname);
  for (size_t i = 0; i < f->nmsgs; i++) {
    const gm_msg *g = f->msgs[i];
    emit_vin(c, g);
    gb_printf(c,
              "\nint %s_validate(const %s *m, const cxr_range *r, const cxr_limits *lim) {\n"
              "  cxr__vctx v;\n  int rc = cxr__v_begin(&v, r, lim);\n  if (rc) return rc;\n"
              "  rc = cxr__v_root(&v, m, sizeof(%s), _Alignof(%s), %s__vin);\n"
              "  cxr__v_end(&v);\n  return rc;\n}\n",
              g->cname, g->cname, g->cname, g->cname, g->cname);
  }
}

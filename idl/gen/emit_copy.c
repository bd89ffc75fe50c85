/* Emits the graph walks over trusted (built or validated) messages: deep copy between
 * heaps, free, equality, and the byte ranges a graph occupies (for shipping to a replica). */
#include <stdio.h>

#include "idl/gen/model.h"

static bool is_float(const gm_field *x) { return x->kind == GK_FLOAT || x->kind == GK_DOUBLE; }

/* ---- copy: d is zeroed, s is the source; both expressions name one value ----
 * The source may be shared memory its writer still changes: each count, case and pointer of
 * it is read once (CXR__LOAD) into a local that sizes, fills and branches, and each block is
 * written through the local that received it, never through the destination read back (a
 * copy can go to a peer's heap too). With a range r (_copy_in), each block is checked to lie
 * inside r at that one read before anything reads it, and counted against r's length
 * (cxr__cp_in; r NULL for _copy). */

static void copy_value(gen_buf *c, const gm_field *x, const char *d, const char *s,
                       const char *ind) {
  switch (x->kind) {
    case GK_STRING:
      gb_printf(c, "%sif ((rc = cxr__cp_str(to, &%s, &%s, r))) return rc;\n", ind, d, s);
      break;
    case GK_BYTES:
      gb_printf(c, "%sif ((rc = cxr__cp_bytes(to, &%s, &%s, r))) return rc;\n", ind, d, s);
      break;
    case GK_MESSAGE: {
      const char *m = x->msg->cname;
      gb_printf(c, "%s{\n%s  const %s *src_msg = CXR__LOAD(&%s);\n", ind, ind, m, s);
      gb_printf(c, "%s  if (src_msg) {\n", ind);
      gb_printf(c, "%s    if ((rc = cxr__cp_in(r, src_msg, 1, sizeof *src_msg, _Alignof(%s))))\n"
                   "%s      return rc;\n", ind, m, ind);
      gb_printf(c, "%s    %s *dst_msg = %s_new(to);\n", ind, m, m);
      gb_printf(c, "%s    if (!dst_msg) return CXR_ENOMEM;\n%s    %s = dst_msg;\n", ind, ind, d);
      gb_printf(c, "%s    if ((rc = %s__cin(to, src_msg, dst_msg, r, depth + 1))) return rc;\n",
                ind, m);
      gb_printf(c, "%s  }\n%s}\n", ind, ind);
      break;
    }
    default:
      gb_printf(c, "%s%s = %s;\n", ind, d, s);
  }
}

static void copy_repeated(gen_buf *c, const gm_field *x) {
  const char *n = x->cname;
  switch (x->kind) {
    case GK_STRING:
      gb_printf(c, "  if ((rc = cxr__cp_strs(to, &d->%s, &s->%s, r))) return rc;\n", n, n);
      break;
    case GK_BYTES:
      gb_printf(c, "  if ((rc = cxr__cp_bytess(to, &d->%s, &s->%s, r))) return rc;\n", n, n);
      break;
    case GK_MESSAGE: {
      const char *m = x->msg->cname;
      gb_printf(c, "  {\n    const %s *src_items = CXR__LOAD(&s->%s.items);\n", m, n);
      gb_printf(c, "    uint64_t src_count = CXR__LOAD(&s->%s.count);\n    if (src_count) {\n", n);
      gb_printf(c, "      if ((rc = cxr__cp_in(r, src_items, src_count, sizeof *src_items,\n"
                   "                           _Alignof(%s))))\n        return rc;\n", m);
      gb_printf(c, "      %s *dst_items = (%s *)cxr_vec_alloc(to, sizeof *dst_items, src_count);\n",
                m, m);
      gb_printf(c, "      if (!dst_items) return CXR_ENOMEM;\n      d->%s.items = dst_items;\n", n);
      gb_printf(c, "      d->%s.count = src_count;\n", n);
      gb_printf(c, "      for (uint64_t i = 0; i < src_count; i++)\n"
                   "        if ((rc = %s__cin(to, &src_items[i], &dst_items[i], r, depth + 1))) "
                   "return rc;\n    }\n  }\n", m);
      break;
    }
    default:
      gb_printf(c, "  {\n    const void *src_items = CXR__LOAD(&s->%s.items);\n", n);
      gb_printf(c, "    uint64_t src_count = CXR__LOAD(&s->%s.count);\n    if (src_count) {\n", n);
      gb_printf(c, "      if ((rc = cxr__cp_in(r, src_items, src_count, sizeof *d->%s.items,\n"
                   "                           _Alignof(__typeof__(*d->%s.items)))))\n"
                   "        return rc;\n", n, n);
      gb_printf(c, "      void *dst_items = cxr__cp_array(to, src_items, src_count, "
                   "sizeof *d->%s.items);\n", n);
      gb_printf(c, "      if (!dst_items) return CXR_ENOMEM;\n      d->%s.items = dst_items;\n", n);
      gb_printf(c, "      d->%s.count = src_count;\n    }\n  }\n", n);
  }
}

/* ---- free: releases what a value owns ---- */

/* String and bytes bodies and scalar arrays are leaves, given to cxr__free_leaf: nothing
 * is read through them, so they are not entered (cxr__free_enter); two fields may name one
 * (validation allows it), or any block of the graph, and each is freed once, at the end of
 * the top-level walk (cxr__free_exit). */

static void free_value(gen_buf *c, const gm_field *x, const char *e, const char *ind) {
  if (x->kind == GK_STRING || x->kind == GK_BYTES)
    gb_printf(c, "%scxr__free_leaf(h, (void *)%s.ptr);\n", ind, e);
  else if (x->kind == GK_MESSAGE)
    gb_printf(c, "%scxr__free_msg(h, %s, sizeof(%s), %s__fin);\n", ind, e, x->msg->cname,
              x->msg->cname);
}

static void free_repeated(gen_buf *c, const gm_field *x) {
  const char *n = x->cname;
  if (x->kind == GK_STRING)
    gb_printf(c, "  cxr__free_strs(h, &m->%s);\n", n);
  else if (x->kind == GK_BYTES)
    gb_printf(c, "  cxr__free_bytess(h, &m->%s);\n", n);
  else if (x->kind == GK_MESSAGE) /* (items and count read once: cxr__free_enter) */
    gb_printf(c,
              "  {\n    %s *it = CXR__LOAD(&m->%s.items);\n"
              "    uint64_t cnt = CXR__LOAD(&m->%s.count);\n"
              "    if (it && cxr__free_enter(h, it, cnt, sizeof *it)) {\n"
              "      for (uint64_t i = 0; i < cnt; i++) %s__fin(h, &it[i]);\n"
              "      cxr__free_exit(h, it);\n    }\n  }\n",
              x->msg->cname, n, n, x->msg->cname);
  else
    gb_printf(c, "  cxr__free_leaf(h, m->%s.items);\n", n);
}

/* ---- equality ---- */

static void eq_value(gen_buf *c, const gm_field *x, const char *a, const char *b,
                     const char *ind) {
  switch (x->kind) {
    case GK_STRING:
    case GK_BYTES:
      gb_printf(c, "%sif (!cxr__eq_mem(%s.ptr, %s.len, %s.ptr, %s.len)) return false;\n", ind, a,
                a, b, b);
      break;
    case GK_MESSAGE:
      gb_printf(c, "%sif (!%s != !%s || (%s && !%s__eq(%s, %s))) return false;\n", ind, a, b, a,
                x->msg->cname, a, b);
      break;
    case GK_FLOAT:
    case GK_DOUBLE:
      /* -0 equals 0 (proto3 does not send either), NaN equals NaN */
      gb_printf(c, "%sif (!(%s == %s || (%s != %s && %s != %s))) return false;\n", ind, a, b, a,
                a, b, b);
      break;
    default:
      gb_printf(c, "%sif (%s != %s) return false;\n", ind, a, b);
  }
}

static void eq_repeated(gen_buf *c, const gm_field *x) {
  const char *n = x->cname;
  if (x->kind == GK_STRING) {
    gb_printf(c, "  if (!cxr__eq_strs(&a->%s, &b->%s)) return false;\n", n, n);
  } else if (x->kind == GK_BYTES) {
    gb_printf(c, "  if (!cxr__eq_bytess(&a->%s, &b->%s)) return false;\n", n, n);
  } else if (x->kind == GK_MESSAGE || is_float(x)) {
    gb_printf(c, "  if (a->%s.count != b->%s.count) return false;\n", n, n);
    gb_printf(c, "  for (uint64_t i = 0; i < a->%s.count; i++) {\n", n);
    char ea[256], eb[256];
    if (x->kind == GK_MESSAGE) {
      gb_printf(c, "    if (!%s__eq(&a->%s.items[i], &b->%s.items[i])) return false;\n",
                x->msg->cname, n, n);
    } else {
      snprintf(ea, sizeof ea, "a->%s.items[i]", n);
      snprintf(eb, sizeof eb, "b->%s.items[i]", n);
      eq_value(c, x, ea, eb, "    ");
    }
    gb_printf(c, "  }\n");
  } else {
    gb_printf(c, "  if (!cxr__eq_mem(a->%s.items, a->%s.count * sizeof *a->%s.items, b->%s.items,\n"
                 "                   b->%s.count * sizeof *b->%s.items)) return false;\n",
              n, n, n, n, n, n);
  }
}

/* ---- ranges ---- */

static void rg_value(gen_buf *c, const gm_field *x, const char *e, const char *ind) {
  if (x->kind == GK_STRING || x->kind == GK_BYTES)
    gb_printf(c, "%sif ((rc = cxr_ranges_add(r, %s.ptr, %s.len))) return rc;\n", ind, e, e);
  else if (x->kind == GK_MESSAGE)
    gb_printf(c,
              "%sif (%s && ((rc = cxr_ranges_add(r, %s, sizeof(%s))) ||\n%s    (rc = "
              "%s__rin(%s, r, depth + 1)))) return rc;\n",
              ind, e, e, x->msg->cname, ind, x->msg->cname, e);
}

static void rg_repeated(gen_buf *c, const gm_field *x) {
  const char *n = x->cname;
  if (x->kind == GK_STRING) {
    gb_printf(c, "  if ((rc = cxr__rg_strs(r, &m->%s))) return rc;\n", n);
  } else if (x->kind == GK_BYTES) {
    gb_printf(c, "  if ((rc = cxr__rg_bytess(r, &m->%s))) return rc;\n", n);
  } else {
    gb_printf(c, "  if ((rc = cxr_ranges_add(r, m->%s.items, m->%s.count * sizeof *m->%s.items))) "
                 "return rc;\n", n, n, n);
    if (x->kind == GK_MESSAGE)
      gb_printf(c, "  for (uint64_t i = 0; i < m->%s.count; i++)\n"
                   "    if ((rc = %s__rin(&m->%s.items[i], r, depth + 1))) return rc;\n",
                n, x->msg->cname, n);
  }
}

/* ---- one function per walk, oneofs through a switch on the case ---- */

typedef enum { W_COPY, W_FREE, W_EQ, W_RG } walk;

static void member_expr(char *buf, size_t n, const char *base, const gm_msg *g,
                        const gm_field *x) {
  if (x->oneof >= 0)
    snprintf(buf, n, "%s->%s.%s", base, g->oneofs[x->oneof].cname, x->cname);
  else
    snprintf(buf, n, "%s->%s", base, x->cname);
}

static void one(gen_buf *c, walk w, const gm_msg *g, const gm_field *x, const char *ind) {
  char e1[512], e2[512];
  switch (w) {
    case W_COPY:
      member_expr(e1, sizeof e1, "d", g, x);
      member_expr(e2, sizeof e2, "s", g, x);
      if (x->has_flag) gb_printf(c, "%sd->has_%s = s->has_%s;\n", ind, x->cname, x->cname);
      if (x->repeated) copy_repeated(c, x); else copy_value(c, x, e1, e2, ind);
      break;
    case W_FREE:
      member_expr(e1, sizeof e1, "m", g, x);
      if (x->repeated) free_repeated(c, x); else free_value(c, x, e1, ind);
      break;
    case W_EQ:
      member_expr(e1, sizeof e1, "a", g, x);
      member_expr(e2, sizeof e2, "b", g, x);
      if (x->has_flag) {
        gb_printf(c, "%sif (a->has_%s != b->has_%s) return false;\n", ind, x->cname, x->cname);
        gb_printf(c, "%sif (a->has_%s) {\n", ind, x->cname);
        eq_value(c, x, e1, e2, "    ");
        gb_printf(c, "%s}\n", ind);
      } else if (x->repeated) {
        eq_repeated(c, x);
      } else {
        eq_value(c, x, e1, e2, ind);
      }
      break;
    case W_RG:
      member_expr(e1, sizeof e1, "m", g, x);
      if (x->repeated) rg_repeated(c, x); else rg_value(c, x, e1, ind);
      break;
  }
}

/* Which fields one pass of a walk takes: all of them, or (the free walk's three passes)
 * the message fields and lists of messages, then the lists of strings or bytes (blocks it
 * also enters), then the others. */
typedef enum { P_ALL, P_MESSAGES, P_LISTS, P_LEAVES } pass;

static bool in_pass(const gm_field *x, pass p) {
  if (p == P_ALL) return true;
  if (x->kind == GK_MESSAGE) return p == P_MESSAGES;
  if (x->repeated && (x->kind == GK_STRING || x->kind == GK_BYTES)) return p == P_LISTS;
  return p == P_LEAVES;
}

static void walk_pass(gen_buf *c, walk w, const gm_msg *g, pass p) {
  for (size_t i = 0; i < g->nfields; i++)
    if (g->fields[i].oneof < 0 && in_pass(&g->fields[i], p)) one(c, w, g, &g->fields[i], "  ");
  static const char *const base[] = {"s", "m", "a", "m"};
  for (size_t o = 0; o < g->noneofs; o++) {
    const char *cn = g->oneofs[o].cname;
    bool any = p == P_LEAVES; /* a switch of scalars alone too (uses the free's oc) */
    for (size_t i = 0; i < g->nfields; i++)
      if (g->fields[i].oneof == (int)o && in_pass(&g->fields[i], p)) any = true;
    if (!any) continue;
    /* The copy stores and switches on one read of the source's case: two reads could store
     * one member's case and fill the union from another member. */
    const char *in = w == W_COPY ? "    " : "  ";  /* the switch's indent */
    if (w == W_COPY)
      gb_printf(c, "  {\n    uint32_t src_case = CXR__LOAD(&s->%s_case);\n"
                   "    d->%s_case = src_case;\n    switch (src_case) {\n", cn, cn);
    if (w == W_EQ) gb_printf(c, "  if (a->%s_case != b->%s_case) return false;\n", cn, cn);
    if (w == W_FREE) gb_printf(c, "  switch (oc%zu) {\n", o); /* read once: walk_fields */
    else if (w != W_COPY) gb_printf(c, "  switch (%s->%s_case) {\n", base[w], cn);
    char member[16];
    snprintf(member, sizeof member, "%s    ", in);
    for (size_t i = 0; i < g->nfields; i++) {
      if (g->fields[i].oneof != (int)o || !in_pass(&g->fields[i], p)) continue;
      gb_printf(c, "%s  case %d:\n", in, g->fields[i].number);
      one(c, w, g, &g->fields[i], member);
      gb_printf(c, "%sbreak;\n", member);
    }
    if (w == W_COPY)  /* an unknown case (unvalidated input) copies as "none set" */
      gb_printf(c, "      default:\n        d->%s_case = 0;\n        break;\n    }\n  }\n", cn);
    else
      gb_printf(c, "    default:\n      break;\n  }\n");
  }
}

/* The free walk takes the blocks it enters before the leaves (string bodies, scalar
 * arrays), and the messages before the lists of strings or bytes (whose items are leaves).
 * The leaves wait for the end of the top-level walk (cxr__free_leaf) but when their set
 * cannot grow (out of memory): then they are freed at once, and this order still has a
 * leaf a peer pointed at a message block of this one's subtree find it freed by its walk,
 * where freeing it first had that walk refuse it (logged) and leak its leaves. Each
 * oneof's case is read once for every pass. */
static void walk_fields(gen_buf *c, walk w, const gm_msg *g) {
  if (w != W_FREE) {
    walk_pass(c, w, g, P_ALL);
    return;
  }
  for (size_t o = 0; o < g->noneofs; o++)
    gb_printf(c, "  uint32_t oc%zu = CXR__LOAD(&m->%s_case);\n", o, g->oneofs[o].cname);
  walk_pass(c, w, g, P_MESSAGES);
  walk_pass(c, w, g, P_LISTS);
  walk_pass(c, w, g, P_LEAVES);
}

void emit_copy(gen_buf *h, gen_buf *c, const gm_file *f) {
  if (!f->nmsgs) return;
  gb_printf(h,
            "\n/* Graph walks over messages built here or already validated (they trust the "
            "graph):\n"
            " * _copy: deep copy into heap `to` (*out owned by the caller; on error nothing is "
            "left).\n"
            " * _copy_in: the same, from a graph its writer may still change (a validated, "
            "unsealed\n *        argument): CXR_EBADPTR when a pointer, with the count or "
            "length read with it,\n *        lies outside r (cxr_call_arg_range); CXR_EPROTO "
            "when it would read more\n *        bytes than r holds (blocks shared or "
            "overlapping since validation).\n"
            " * _free: frees m and everything it points to, all allocated in h (by _new, "
            "cxr_str_set,\n *        CXR_VEC_ALLOC, _copy or _from_pb); a graph a peer "
            "rewrote since costs a\n *        bounded walk (cxr__free_enter), not a crash "
            "or a hang.\n"
            " * _equal: same content (presence, oneof cases, values; -0 == 0, NaN == NaN).\n"
            " * _ranges: appends the exact byte ranges the graph occupies (root included). */\n");
  for (size_t i = 0; i < f->nmsgs; i++) {
    const char *n = f->msgs[i]->cname;
    gb_printf(h, "int %s_copy(cxr_heap *to, const %s *m, %s **out);\n", n, n, n);
    gb_printf(h, "int %s_copy_in(cxr_heap *to, const %s *m, const cxr_range *r, %s **out);\n", n,
              n, n);
    gb_printf(h, "void %s_free(cxr_heap *h, %s *m);\n", n, n);
    gb_printf(h,
              "/* Gives back a call's result m of connection c: %s_free on the connection heap "
              "in the pod,\n * cxr_conn_free (back to the server's heap) across racks. */\n"
              "void %s_release(cxr_conn *c, %s *m);\n", n, n, n);
    gb_printf(h, "bool %s_equal(const %s *a, const %s *b);\n", n, n, n);
    gb_printf(h, "int %s_ranges(const %s *m, cxr_ranges *out);\n", n, n);
  }
  gb_printf(h, "/* internal */\n");
  for (size_t i = 0; i < f->nmsgs; i++) {
    const char *n = f->msgs[i]->cname;
    gb_printf(h, "int %s__cin(cxr_heap *to, const void *src, void *dst, cxr__cpsrc *r,\n"
                 "    unsigned depth);\n", n);
    gb_printf(h, "void %s__fin(cxr_heap *h, void *p);\n", n);
    gb_printf(h, "bool %s__eq(const void *pa, const void *pb);\n", n);
    gb_printf(h, "int %s__rin(const void *p, cxr_ranges *r, unsigned depth);\n", n);
  }
  for (size_t i = 0; i < f->nmsgs; i++) {
    const gm_msg *g = f->msgs[i];
    const char *n = g->cname;
    gb_printf(c, "\nint %s__cin(cxr_heap *to, const void *src, void *dst, cxr__cpsrc *r,\n"
                 "    unsigned depth) {\n", n);
    gb_printf(c, "  const %s *s = (const %s *)src;\n  %s *d = (%s *)dst;\n  int rc = 0;\n", n, n,
              n, n);
    gb_printf(c, "  (void)to, (void)s, (void)d, (void)r;\n"
                 "  if (depth > CXR__MAX_DEPTH) return CXR_EPROTO;\n");
    walk_fields(c, W_COPY, g);
    gb_printf(c, "  return rc;\n}\n");

    gb_printf(c, "\nvoid %s__fin(cxr_heap *h, void *p) {\n  %s *m = (%s *)p;\n  (void)h, (void)m;\n",
              n, n, n);
    walk_fields(c, W_FREE, g);
    gb_printf(c, "}\n");

    gb_printf(c, "\nbool %s__eq(const void *pa, const void *pb) {\n", n);
    gb_printf(c, "  const %s *a = (const %s *)pa, *b = (const %s *)pb;\n  (void)a, (void)b;\n", n,
              n, n);
    walk_fields(c, W_EQ, g);
    gb_printf(c, "  return true;\n}\n");

    gb_printf(c, "\nint %s__rin(const void *p, cxr_ranges *r, unsigned depth) {\n", n);
    gb_printf(c, "  const %s *m = (const %s *)p;\n  int rc = 0;\n  (void)m, (void)r;\n", n, n);
    gb_printf(c, "  if (depth > CXR__MAX_DEPTH) return CXR_EPROTO;\n");
    walk_fields(c, W_RG, g);
    gb_printf(c, "  return rc;\n}\n");

    gb_printf(c,
              "\nint %s_copy(cxr_heap *to, const %s *m, %s **out) {\n"
              "  if (!to || !m || !out) return CXR_EINVAL;\n"
              "  %s *d = %s_new(to);\n  if (!d) return CXR_ENOMEM;\n"
              "  int rc = %s__cin(to, m, d, NULL, 0);\n"
              "  if (rc) {\n    %s_free(to, d);\n    return rc;\n  }\n  *out = d;\n  return 0;\n}\n",
              n, n, n, n, n, n, n);
    gb_printf(c,
              "\nint %s_copy_in(cxr_heap *to, const %s *m, const cxr_range *r, %s **out) {\n"
              "  if (!to || !m || !r || !out) return CXR_EINVAL;\n"
              "  cxr__cpsrc src = {*r, r->len};  /* reads at most r's length (cxr__cp_in) */\n"
              "  int rc = cxr__cp_in(&src, m, 1, sizeof *m, _Alignof(%s));\n"
              "  if (rc) return rc;\n"
              "  %s *d = %s_new(to);\n  if (!d) return CXR_ENOMEM;\n"
              "  rc = %s__cin(to, m, d, &src, 0);\n"
              "  if (rc) {\n    %s_free(to, d);\n    return rc;\n  }\n"
              "  *out = d;\n  return 0;\n}\n",
              n, n, n, n, n, n, n, n);
    gb_printf(c,
              "\nvoid %s_free(cxr_heap *h, %s *m) {\n"
              "  if (h && m) cxr__free_top(h, m, sizeof *m, %s__fin);\n}\n",
              n, n, n);
    gb_printf(c,
              "\nvoid %s_release(cxr_conn *c, %s *m) {\n  if (!c || !m) return;\n"
              "  if (cxr_conn_is_remote(c)) cxr_conn_free(c, m);\n"
              "  else %s_free(cxr_conn_heap(c), m);\n}\n",
              n, n, n);
    gb_printf(c,
              "\nbool %s_equal(const %s *a, const %s *b) {\n  if (a == b) return true;\n"
              "  if (!a || !b) return false;\n  return %s__eq(a, b);\n}\n",
              n, n, n, n);
    gb_printf(c,
              "\nint %s_ranges(const %s *m, cxr_ranges *out) {\n"
              "  if (!m || !out) return CXR_EINVAL;\n"
              "  int rc = cxr_ranges_add(out, m, sizeof *m);\n"
              "  return rc ? rc : %s__rin(m, out, 0);\n}\n",
              n, n, n);
  }
}

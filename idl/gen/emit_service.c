/* Emits typed client stubs (sync, async + wait) and the server skeleton, which validates
 * the argument graph before dispatch when the peer is untrusted. */
#include "idl/gen/model.h"

static void emit_client(gen_buf *h, gen_buf *c, const gm_service *s, const gm_method *x) {
  const char *in = x->in->cname, *out = x->out->cname, *n = x->cname;
  gb_comment(h, "", x->comment);
  gb_printf(h, "/* %s: id 0x%08x = FNV-1a(\"%s\") */\n#define %s_ID 0x%08xu\n", x->path, x->id,
            x->path, n, x->id);
  gb_printf(h,
            "/* Calls %s with rq (built in cxr_conn_heap(c)); *rs is the result, validated "
            "inside\n * cxr_conn_result_range(c), owned by the caller, given back with "
            "%s_release(c, *rs); it\n * may be NULL, and is after an error. On a remote "
            "(\"ucx://\") connection the argument\n * graph's ranges are shipped unless "
            "o->ranges names them. */\n",
            x->path, out);
  gb_printf(h, "int %s(cxr_conn *c, const %s *rq, %s **rs, const cxr_call_opts *o);\n", n, in,
            out);
  gb_printf(h, "int %s_async(cxr_conn *c, const %s *rq, cxr_future **f, const cxr_call_opts *o);\n",
            n, in);
  gb_printf(h,
            "/* Waits for a future from %s_async and validates its result (the future is "
            "still\n * the caller's to free); *rs is NULL after an error. */\n",
            n);
  gb_printf(h, "int %s_wait(cxr_conn *c, cxr_future *f, int64_t timeout_ns, %s **rs);\n", n, out);
  (void)s;

  gb_printf(c,
            "\nstatic int %s__result(cxr_conn *c, void *res, %s **rs) {\n"
            "  if (res) {\n"
            "    /* the server is a peer too: its result must stay where results may lie (the\n"
            "     * connection heap, or across racks the replica of the server's result heap) */\n"
            "    cxr_range r = cxr_conn_result_range(c);\n"
            "    int rc = %s_validate((const %s *)res, &r, NULL);\n"
            "    if (rc) {\n      if (cxr_conn_is_remote(c)) cxr_conn_free(c, res);  /* the server's blocks */\n"
            "      return rc;\n    }\n  }\n"
            "  *rs = (%s *)res;\n  return 0;\n}\n",
            n, out, out, out, out);
  gb_printf(c,
            "\nint %s(cxr_conn *c, const %s *rq, %s **rs, const cxr_call_opts *o) {\n"
            "  if (rs) *rs = NULL;  /* no garbage for the caller after an error */\n"
            "  if (!c || !rq || !rs) return CXR_EINVAL;\n"
            "  void *res = NULL;\n"
            "  cxr_call_opts tmp;\n  cxr_ranges rg;\n  int rc;\n"
            "  const cxr_call_opts *uo = cxr__stub_opts(c, rq, sizeof *rq, %s__rin, o, &tmp, &rg, &rc);\n"
            "  if (rc) return rc;\n"
            "  rc = cxr_conn_call(c, %s_ID, rq, &res, uo);\n"
            "  cxr_ranges_free(&rg);\n"
            "  if (rc) return rc;\n"
            "  return %s__result(c, res, rs);\n}\n",
            n, in, out, in, n, n);
  gb_printf(c,
            "\nint %s_async(cxr_conn *c, const %s *rq, cxr_future **f, const cxr_call_opts *o) {\n"
            "  if (!c || !rq || !f) return CXR_EINVAL;\n"
            "  cxr_call_opts tmp;\n  cxr_ranges rg;\n  int rc;\n"
            "  const cxr_call_opts *uo = cxr__stub_opts(c, rq, sizeof *rq, %s__rin, o, &tmp, &rg, &rc);\n"
            "  if (rc) return rc;\n"
            "  rc = cxr_conn_call_async(c, %s_ID, rq, f, uo);\n"
            "  cxr_ranges_free(&rg);\n  return rc;\n}\n",
            n, in, in, n);
  gb_printf(c,
            "\nint %s_wait(cxr_conn *c, cxr_future *f, int64_t timeout_ns, %s **rs) {\n"
            "  if (rs) *rs = NULL;  /* no garbage for the caller after an error */\n"
            "  if (!c || !f || !rs) return CXR_EINVAL;\n"
            "  void *res = NULL;\n"
            "  int rc = cxr_future_wait(f, timeout_ns, &res);\n"
            "  if (rc) return rc;\n"
            "  return %s__result(c, res, rs);\n}\n",
            n, out, n);
}

void emit_service(gen_buf *h, gen_buf *c, const gm_file *f) {
  for (size_t i = 0; i < f->nservices; i++) {
    const gm_service *s = &f->services[i];
    const char *sn = s->cname;
    gb_printf(h, "\n/* ---- service %s ---- */\n", s->full);
    gb_comment(h, "", s->comment);
    for (size_t j = 0; j < s->nmethods; j++) emit_client(h, c, s, &s->methods[j]);

    gb_printf(h,
              "\n/* Server side of %s: one handler per method (NULL: the server answers "
              "CXR_ENOMETHOD).\n * A handler builds its result in cxr_call_heap(call) and "
              "returns 0 or a CXR_E* code;\n * when it returns a code, the skeleton frees "
              "the graph left in *rs (the client gets no result). */\n",
              s->full);
    gb_printf(h, "typedef struct %s_handlers {\n", sn);
    for (size_t j = 0; j < s->nmethods; j++) {
      const gm_method *x = &s->methods[j];
      gb_comment(h, "  ", x->comment);
      gb_printf(h, "  int (*%s)(cxr_call *call, const %s *rq, %s **rs, void *user);\n", x->member,
                x->in->cname, x->out->cname);
    }
    if (!s->nmethods) gb_printf(h, "  void *cxr__none;\n");
    gb_printf(h, "} %s_handlers;\n", sn);
    gb_printf(h,
              "/* Caller-owned, must outlive the channel. limits: for validating arguments of "
              "untrusted\n * peers (a field left zero: its cxr_limits_init default). */\n"
              "typedef struct %s_server {\n  %s_handlers handlers;\n  void *user;\n"
              "  cxr_limits limits;\n} %s_server;\n",
              sn, sn, sn);
    gb_printf(h,
              "/* Registers the handlers on ch (several services may share one channel). "
              "Arguments from\n * an untrusted peer are validated against "
              "cxr_call_arg_range() before the handler runs;\n * an invalid graph is answered "
              "with the validator's error. */\n"
              "int %s_serve(cxr_channel *ch, %s_server *srv);\n",
              sn, sn);

    for (size_t j = 0; j < s->nmethods; j++) {
      const gm_method *x = &s->methods[j];
      const char *in = x->in->cname, *out = x->out->cname;
      gb_printf(c,
                "\nstatic int %s__tramp(cxr_call *call, const void *args, void **result, void "
                "*user) {\n"
                "  %s_server *srv = (%s_server *)user;\n"
                "  const %s *rq = (const %s *)args;\n"
                "  if (!rq) return CXR_EPROTO;\n"
                "  /* trusted or not, the struct itself must lie where the server checked it:\n"
                "   * one past the heap's end would fault the server for every client */\n"
                "  int arc = cxr__skel_arg_check(call, args, sizeof *rq);\n"
                "  if (arc) return arc;\n"
                "  bool untrusted, remote;\n"
                "  cxr__call_kind(call, &untrusted, &remote);\n"
                "  if (untrusted) {\n"
                "    /* across racks the graph lies in our replica of the caller's heap */\n"
                "    cxr_range r = remote ? cxr_call_arg_range(call) : cxr__call_arg_extent(call, args);\n"
                "    cxr_limits tmp;\n"
                "    int rc = %s_validate(rq, &r, cxr__limits(&srv->limits, &tmp));\n"
                "    if (rc) return rc;\n  }\n"
                "  %s *rs = NULL;\n"
                "  int rc = srv->handlers.%s(call, rq, &rs, srv->user);\n"
                "  /* another rack: ship the whole result graph, not only its root block */\n"
                "  if (rc == 0 && remote && rs) rc = cxr__skel_result(call, rs, sizeof *rs, %s__rin);\n"
                "  /* a failed call has no result: the graph the handler built goes back to the\n"
                "   * heap (the client would see only the error, and the blocks would stay) */\n"
                "  if (rc != 0 && rs) {\n"
                "    /* (an echo of the argument itself is the caller's: left alone) */\n"
                "    if ((const void *)rs != args && cxr_heap_contains(cxr_call_heap(call), rs, sizeof *rs))\n"
                "      %s_free(cxr_call_heap(call), rs);\n"
                "    rs = NULL;\n  }\n"
                "  *result = rs;\n  return rc;\n}\n",
                x->cname, sn, sn, in, in, in, out, x->member, out, out);
    }
    gb_printf(c, "\nint %s_serve(cxr_channel *ch, %s_server *srv) {\n", sn, sn);
    gb_printf(c, "  if (!ch || !srv) return CXR_EINVAL;\n  int rc = 0;\n  (void)rc;\n");
    for (size_t j = 0; j < s->nmethods; j++) {
      const gm_method *x = &s->methods[j];
      gb_printf(c,
                "  if (srv->handlers.%s && (rc = cxr_channel_on(ch, %s_ID, %s__tramp, srv)))\n"
                "    return rc;\n",
                x->member, x->cname, x->cname);
    }
    gb_printf(c, "  return 0;\n}\n");
  }
}

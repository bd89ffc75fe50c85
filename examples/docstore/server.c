/* docstore server: keeps documents in a heap of its own. Clients are untrusted: every
 * request graph is validated by the generated skeleton before a handler sees it, then
 * copied (one deep copy, no parsing) into the store.
 *   bazel run //examples/docstore:server -- [channel]      (Ctrl-C to stop) */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cxrpc/sandbox.h>

#include "examples/docstore/docstore.cxr.h"
#include "examples/docstore/json.h"

#define MAX_DOCS 1024

typedef struct store {
  pthread_mutex_t mu;
  cxr_heap *heap;  /* the documents live here, not in any client's heap */
  docstore_Document *docs[MAX_DOCS];
  uint64_t versions[MAX_DOCS];
  size_t n;
} store;

/* A request string in the handler's own memory (malloc'd, NUL-terminated; *out freed by the
 * caller). The client can rewrite its graph during the call, so the pointer and length are
 * read once, must still lie inside the call's argument range and the validator's length
 * limit, and are copied before the store's lock is taken: a pointer swapped since then can
 * neither read the server's memory nor fault while the lock is held (cxr_sandbox_run would
 * abandon the handler with s->mu locked, and every later call would hang). */
static int take_str(cxr_call *call, const cxr_str *s, cxr_str *out) {
  const char *p = CXR__LOAD(&s->ptr);
  uint64_t len = CXR__LOAD(&s->len);
  cxr_range r = cxr_call_arg_range(call);
  cxr_limits lim;
  cxr_limits_init(&lim);  /* what the skeleton validated with (the server sets no limits) */
  if (len > lim.max_len || (len && cxr_range_check(&r, p, len, 1))) return CXR_EBADPTR;
  char *d = malloc(len + 1);
  if (!d) return CXR_ENOMEM;
  if (len) memcpy(d, p, len);
  d[len] = 0;
  *out = (cxr_str){d, len};
  return 0;
}

static long find(store *s, cxr_str id) {
  for (size_t i = 0; i < s->n; i++)
    if (s->docs[i]->id.len == id.len && memcmp(s->docs[i]->id.ptr, id.ptr, id.len) == 0)
      return (long)i;
  return -1;
}

static int on_put(cxr_call *call, const docstore_PutRequest *rq, docstore_PutReply **rs,
                  void *user) {
  store *s = user;
  const docstore_Document *doc = CXR__LOAD(&rq->doc);
  if (!doc) return CXR_EINVAL;
  docstore_Document *copy = NULL;
  /* The document may have changed since validation: every pointer the copy follows must
   * still lie in the connection heap, or another client's documents (in s->heap) could be
   * copied into this one. The id is checked on the copy, which the client cannot change. */
  cxr_range ar = cxr_call_arg_range(call);
  int rc = docstore_Document_copy_in(s->heap, doc, &ar, &copy);
  if (rc) return rc;
  if (copy->id.len == 0) {
    docstore_Document_free(s->heap, copy);
    return CXR_EINVAL;
  }
  cxr_ranges rg;
  cxr_ranges_init(&rg);
  docstore_Document_ranges(copy, &rg);
  uint64_t bytes = cxr_ranges_bytes(&rg);
  cxr_ranges_free(&rg);

  docstore_PutReply *r = docstore_PutReply_new(cxr_call_heap(call));
  if (!r) {
    docstore_Document_free(s->heap, copy);
    return CXR_ENOMEM;
  }
  /* Counted before the copy is stored: once it is, another Put of the same id may free it. */
  uint64_t nodes = json_count(copy->root);
  pthread_mutex_lock(&s->mu);
  long i = find(s, copy->id);
  if (i < 0 && s->n == MAX_DOCS) {
    pthread_mutex_unlock(&s->mu);
    docstore_Document_free(s->heap, copy);
    docstore_PutReply_free(cxr_call_heap(call), r);
    return CXR_EFULL;
  }
  if (i < 0) i = (long)s->n++, s->versions[i] = 0;
  else docstore_Document_free(s->heap, s->docs[i]);
  s->docs[i] = copy;
  uint64_t version = ++s->versions[i];
  pthread_mutex_unlock(&s->mu);
  r->version = version;  /* r is in the client's heap: written outside the lock */
  r->nodes = nodes;
  r->bytes = bytes;
  *rs = r;
  return 0;
}

static int on_get(cxr_call *call, const docstore_GetRequest *rq, docstore_GetReply **rs,
                  void *user) {
  store *s = user;
  cxr_heap *out = cxr_call_heap(call);
  cxr_str id = {NULL, 0}, path = {NULL, 0};
  int rc = take_str(call, &rq->id, &id);
  if (rc || (rc = take_str(call, &rq->path, &path))) {
    free((void *)id.ptr);
    return rc;
  }
  /* Nothing of the client's is touched under the lock, its heap included (the client could
   * hold that heap's lock): the value is copied into the store's heap, then out after. */
  docstore_Value *v = NULL;
  pthread_mutex_lock(&s->mu);
  long i = find(s, id);
  const docstore_Value *at = i < 0 ? NULL : json_at(s->docs[i]->root, path.ptr, path.len);
  if (at) rc = docstore_Value_copy(s->heap, at, &v);
  pthread_mutex_unlock(&s->mu);
  free((void *)id.ptr);
  free((void *)path.ptr);
  docstore_GetReply *r = rc ? NULL : docstore_GetReply_new(out);
  if (!rc && !r) rc = CXR_ENOMEM;
  if (!rc && v) {
    r->found = true;
    rc = docstore_Value_copy(out, v, &r->value);  /* the answer goes into the client's heap */
  }
  docstore_Value_free(s->heap, v);
  if (rc) {
    docstore_GetReply_free(out, r);
    return rc;
  }
  *rs = r;
  return 0;
}

static int on_query(cxr_call *call, const docstore_QueryRequest *rq, docstore_QueryReply **rs,
                    void *user) {
  store *s = user;
  cxr_heap *out = cxr_call_heap(call);
  cxr_str path = {NULL, 0}, eq = {NULL, 0};
  int rc = take_str(call, &rq->path, &path);
  if (rc || (rc = take_str(call, &rq->equals, &eq))) {
    free((void *)path.ptr);
    return rc;
  }
  /* As in on_get: the matching ids are copied into the store's heap under the lock, into the
   * client's heap after it. */
  cxr_str ids[MAX_DOCS];
  size_t n = 0;
  pthread_mutex_lock(&s->mu);
  for (size_t i = 0; !rc && i < s->n; i++) {
    const docstore_Value *v = json_at(s->docs[i]->root, path.ptr, path.len);
    if (v && v->kind_case == 4 && v->kind.text.len == eq.len &&
        memcmp(v->kind.text.ptr, eq.ptr, eq.len) == 0)
      rc = cxr_str_set(s->heap, &ids[n++], s->docs[i]->id.ptr, s->docs[i]->id.len);
  }
  pthread_mutex_unlock(&s->mu);
  free((void *)path.ptr);
  free((void *)eq.ptr);
  if (rc) n--;  /* the last one failed: nothing to free there */
  docstore_QueryReply *r = rc ? NULL : docstore_QueryReply_new(out);
  if (!rc && !r) rc = CXR_ENOMEM;
  if (!rc && n && !CXR_VEC_ALLOC(out, r->ids, n)) rc = CXR_ENOMEM;
  for (size_t k = 0; !rc && k < n; k++)
    rc = cxr_str_set(out, &r->ids.items[k], ids[k].ptr, ids[k].len);
  for (size_t k = 0; k < n; k++) cxr_heap_free(s->heap, (void *)ids[k].ptr);
  if (rc) {
    docstore_QueryReply_free(out, r);
    return rc;
  }
  *rs = r;
  return 0;
}

static int on_count(cxr_call *call, const docstore_Document *rq, docstore_PutReply **rs,
                    void *user) {
  (void)user;
  docstore_PutReply *r = docstore_PutReply_new(cxr_call_heap(call));
  if (!r) return CXR_ENOMEM;
  /* The client's tree, read where it lies: validated, but the client can still change it
   * (a pointer swapped after validation can make a small graph a tree of 2^50 values), so
   * the count is bounded as validation is (its default node and depth limits), and each
   * pointer it follows must still lie in the connection heap. */
  uint64_t n = 0;
  cxr_range ar = cxr_call_arg_range(call);
  int rc = json_count_within(CXR__LOAD(&rq->root), &ar, 1u << 20, 64, &n);
  if (rc) {
    docstore_PutReply_free(cxr_call_heap(call), r);
    return rc;
  }
  r->nodes = n;
  *rs = r;
  return 0;
}

int main(int argc, char **argv) {
  const char *name = argc > 1 ? argv[1] : "docstore";
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, NULL);  /* before any thread starts */

  static store st = {.mu = PTHREAD_MUTEX_INITIALIZER};
  char heap_name[64];
  snprintf(heap_name, sizeof heap_name, "docstore-data-%d", (int)getpid());
  cxr_heap_opts ho;
  cxr_heap_opts_init(&ho);
  ho.remove_on_last_close = true;
  int rc = cxr_heap_create(&st.heap, heap_name, 256u << 20, &ho);
  if (rc) {
    fprintf(stderr, "docstore: cannot create the store heap: %s\n", cxr_strerror(rc));
    return 1;
  }
  cxr_channel_opts o;
  cxr_channel_opts_init(&o);
  o.untrusted = true;  /* validate every request graph before a handler reads it */
  o.conn_heap_size = 64u << 20;
  o.workers = 2;
  cxr_channel *ch;
  if ((rc = cxr_channel_open(&ch, name, &o))) {
    fprintf(stderr, "docstore: cannot open channel %s: %s\n", name, cxr_strerror(rc));
    return 1;
  }
  static docstore_DocStore_server srv = {
      .handlers = {.Put = on_put, .Get = on_get, .Query = on_query, .Count = on_count},
      .user = &st,
  };
  if ((rc = docstore_DocStore_serve(ch, &srv)) || (rc = cxr_channel_start(ch))) {
    fprintf(stderr, "docstore: cannot serve: %s\n", cxr_strerror(rc));
    return 1;
  }
  printf("docstore: serving channel '%s' (untrusted clients, validated requests)\n", name);
  fflush(stdout);
  int sig = 0;
  sigwait(&sigs, &sig);
  cxr_channel_stop(ch);
  cxr_channel_close(ch); /* joins the workers: their writes to st are visible from here on */
  printf("docstore: %s, stopping with %zu documents\n", sig == SIGINT ? "SIGINT" : "SIGTERM", st.n);
  for (size_t i = 0; i < st.n; i++) docstore_Document_free(st.heap, st.docs[i]);
  cxr_heap_close(st.heap);
  return 0;
}

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

static long find(store *s, cxr_str id) {
  for (size_t i = 0; i < s->n; i++)
    if (s->docs[i]->id.len == id.len && memcmp(s->docs[i]->id.ptr, id.ptr, id.len) == 0)
      return (long)i;
  return -1;
}

static int on_put(cxr_call *call, const docstore_PutRequest *rq, docstore_PutReply **rs,
                  void *user) {
  store *s = user;
  if (!rq->doc || rq->doc->id.len == 0) return CXR_EINVAL;
  docstore_Document *copy = NULL;
  int rc = docstore_Document_copy(s->heap, rq->doc, &copy);
  if (rc) return rc;
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
  r->version = ++s->versions[i];
  pthread_mutex_unlock(&s->mu);
  r->nodes = json_count(copy->root);
  r->bytes = bytes;
  *rs = r;
  return 0;
}

static int on_get(cxr_call *call, const docstore_GetRequest *rq, docstore_GetReply **rs,
                  void *user) {
  store *s = user;
  cxr_heap *out = cxr_call_heap(call);
  docstore_GetReply *r = docstore_GetReply_new(out);
  if (!r) return CXR_ENOMEM;
  int rc = 0;
  pthread_mutex_lock(&s->mu);
  long i = find(s, rq->id);
  const docstore_Value *v = i < 0 ? NULL : json_at(s->docs[i]->root, rq->path.ptr, rq->path.len);
  if (v) {
    r->found = true;
    rc = docstore_Value_copy(out, v, &r->value);  /* the answer goes into the client's heap */
  }
  pthread_mutex_unlock(&s->mu);
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
  docstore_QueryReply *r = docstore_QueryReply_new(out);
  if (!r) return CXR_ENOMEM;
  int rc = 0;
  pthread_mutex_lock(&s->mu);
  size_t hits[MAX_DOCS], n = 0;
  for (size_t i = 0; i < s->n; i++) {
    const docstore_Value *v = json_at(s->docs[i]->root, rq->path.ptr, rq->path.len);
    if (v && v->kind_case == 4 && v->kind.text.len == rq->equals.len &&
        memcmp(v->kind.text.ptr, rq->equals.ptr, rq->equals.len) == 0)
      hits[n++] = i;
  }
  if (n && !CXR_VEC_ALLOC(out, r->ids, n)) rc = CXR_ENOMEM;
  for (size_t k = 0; !rc && k < n; k++)
    rc = cxr_str_set(out, &r->ids.items[k], s->docs[hits[k]]->id.ptr, s->docs[hits[k]]->id.len);
  pthread_mutex_unlock(&s->mu);
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
   * the count is bounded as validation is (its default node and depth limits). */
  uint64_t n = 0;
  if (!json_count_within(rq->root, 1u << 20, 64, &n)) {
    docstore_PutReply_free(cxr_call_heap(call), r);
    return CXR_EINVAL;
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

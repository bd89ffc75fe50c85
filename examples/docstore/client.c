/* docstore client: parses JSON documents straight into the connection heap, stores them
 * with one pointer each, reads paths back, queries, then times a large document by
 * pointer against protobuf-c pack + unpack of the same content.
 *   bazel run //examples/docstore:client -- [channel]     (with the server running) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "examples/docstore/docstore.cxr.h"
#include "examples/docstore/docstore.pb-c.h"  /* pack, unpack */
#include "examples/docstore/json.h"

static const char *const docs[][2] = {
    {"ada", "{\"name\": \"Ada Lovelace\", \"born\": 1815, \"city\": \"London\","
            " \"works\": [{\"title\": \"Notes\", \"year\": 1843}], \"tags\": [\"math\", \"engines\"]}"},
    {"alan", "{\"name\": \"Alan Turing\", \"born\": 1912, \"city\": \"London\","
             " \"works\": [{\"title\": \"On Computable Numbers\", \"year\": 1936},"
             " {\"title\": \"Computing Machinery and Intelligence\", \"year\": 1950}],"
             " \"alive\": false, \"spouse\": null}"},
    {"grace", "{\"name\": \"Grace Hopper\", \"born\": 1906, \"city\": \"New York\","
              " \"works\": [{\"title\": \"A-0\", \"year\": 1952}], \"rank\": \"Rear Admiral\"}"},
};

static int failures;
#define CHECK(c, ...)                                      \
  do {                                                     \
    if (!(c)) {                                            \
      failures++;                                          \
      fprintf(stderr, "docstore-client: FAILED: " __VA_ARGS__); \
      fputc('\n', stderr);                                 \
    }                                                      \
  } while (0)

static int put(cxr_conn *c, const char *id, docstore_Value *root, docstore_PutReply **out) {
  cxr_heap *h = cxr_conn_heap(c);
  docstore_PutRequest *rq = docstore_PutRequest_new(h);
  if (!rq || !(rq->doc = docstore_Document_new(h))) return CXR_ENOMEM;
  cxr_str_setz(h, &rq->doc->id, id);
  rq->doc->root = root;
  int rc = docstore_DocStore_Put(c, rq, out, NULL);
  rq->doc->root = NULL;  /* the caller frees the tree */
  docstore_PutRequest_free(h, rq);
  return rc;
}

static void get(cxr_conn *c, const char *id, const char *path, const char *want) {
  cxr_heap *h = cxr_conn_heap(c);
  docstore_GetRequest *rq = docstore_GetRequest_new(h);
  docstore_GetReply *rs = NULL;
  cxr_str_setz(h, &rq->id, id);
  cxr_str_setz(h, &rq->path, path);
  int rc = docstore_DocStore_Get(c, rq, &rs, NULL);
  printf("get %s %-12s -> ", id, *path ? path : "(root)");
  if (rc || !rs || !rs->found) {
    printf("%s\n", rc ? cxr_strerror(rc) : "not found");
  } else {
    json_print(stdout, rs->value);
    printf("\n");
  }
  if (want) {
    char buf[256] = "";
    if (!rc && rs && rs->found) {
      FILE *m = fmemopen(buf, sizeof buf - 1, "w");
      json_print(m, rs->value);
      fclose(m);
    }
    CHECK(strcmp(buf, want) == 0, "get %s %s: got '%s', want '%s'", id, path, buf, want);
  }
  docstore_GetReply_free(h, rs);
  docstore_GetRequest_free(h, rq);
}

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* A wide, deep tree of objects, arrays and strings of about `bytes` bytes in h. */
static docstore_Value *big_tree(cxr_heap *h, size_t bytes) {
  docstore_Value *root = docstore_Value_new(h);
  docstore_Array *a = docstore_Array_new(h);
  size_t n = bytes / 240 + 1;
  CXR_VEC_ALLOC(h, a->items, n);
  for (size_t i = 0; i < n; i++) {
    docstore_Object *o = docstore_Object_new(h);
    CXR_VEC_ALLOC(h, o->members, 3);
    const char *keys[3] = {"id", "title", "score"};
    for (int k = 0; k < 3; k++) {
      cxr_str_setz(h, &o->members.items[k].key, keys[k]);
      docstore_Value *v = docstore_Value_new(h);
      if (k == 2) {
        v->kind_case = 3, v->kind.number = (double)i / 3;
      } else {
        char text[64];
        snprintf(text, sizeof text, "%s-%zu-lorem-ipsum-dolor-sit", keys[k], i);
        v->kind_case = 4;
        cxr_str_setz(h, &v->kind.text, text);
      }
      o->members.items[k].value = v;
    }
    a->items.items[i].kind_case = 5;
    a->items.items[i].kind.object = o;
  }
  root->kind_case = 6, root->kind.array = a;
  return root;
}

int main(int argc, char **argv) {
  const char *name = argc > 1 ? argv[1] : "docstore";
  cxr_conn *c = NULL;
  int rc = CXR_ENOENT;
  for (int i = 0; i < 50 && rc; i++) {  /* the server may still be starting */
    rc = cxr_connect(&c, name, NULL);
    if (rc) usleep(100000);
  }
  if (rc) {
    fprintf(stderr, "docstore-client: cannot connect to '%s': %s\n", name, cxr_strerror(rc));
    return 1;
  }
  cxr_heap *h = cxr_conn_heap(c);
  for (size_t i = 0; i < sizeof docs / sizeof docs[0]; i++) {
    char err[128];
    docstore_Value *root = json_parse(h, docs[i][1], err, sizeof err);
    if (!root) {
      fprintf(stderr, "docstore-client: %s: %s\n", docs[i][0], err);
      return 1;
    }
    docstore_PutReply *r = NULL;
    rc = put(c, docs[i][0], root, &r);
    CHECK(rc == 0, "put %s: %s", docs[i][0], cxr_strerror(rc));
    if (!rc)
      printf("put %-5s -> version %llu, %llu values, %llu bytes in the store\n", docs[i][0],
             (unsigned long long)r->version, (unsigned long long)r->nodes,
             (unsigned long long)r->bytes);
    docstore_PutReply_free(h, r);
    docstore_Value_free(h, root);
  }
  get(c, "alan", "works.1.title", "\"Computing Machinery and Intelligence\"");
  get(c, "ada", "tags", "[\"math\", \"engines\"]");
  get(c, "grace", "born", "1906");
  get(c, "alan", "spouse", "null");
  get(c, "nobody", "", "");

  docstore_QueryRequest *q = docstore_QueryRequest_new(h);
  docstore_QueryReply *qr = NULL;
  cxr_str_setz(h, &q->path, "city");
  cxr_str_setz(h, &q->equals, "London");
  rc = docstore_DocStore_Query(c, q, &qr, NULL);
  CHECK(rc == 0 && qr && qr->ids.count == 2, "query city == London");
  printf("query city == \"London\" ->");
  for (uint64_t i = 0; !rc && qr && i < qr->ids.count; i++)
    printf(" %.*s", (int)qr->ids.items[i].len, qr->ids.items[i].ptr);
  printf("\n");
  docstore_QueryReply_free(h, qr);
  docstore_QueryRequest_free(h, q);

  /* A hostile request: a cycle in the tree. The server's skeleton refuses it before the
   * handler runs. */
  docstore_Value *loop = docstore_Value_new(h);
  loop->kind_case = 6;
  loop->kind.array = docstore_Array_new(h);
  CXR_VEC_ALLOC(h, loop->kind.array->items, 1);
  loop->kind.array->items.items[0].kind_case = 6;
  loop->kind.array->items.items[0].kind.array = loop->kind.array;
  docstore_PutReply *lr = NULL;
  rc = put(c, "loop", loop, &lr);
  printf("put of a cyclic tree -> %s\n", rc ? cxr_strerror(rc) : "accepted (wrong!)");
  CHECK(rc == CXR_EPROTO, "a cyclic document was not refused");

  /* The point of it: a 1 MiB tree passes as one pointer. Count reads it in place on the
   * server (after validating it); Put also deep-copies it into the store. */
  docstore_Value *big = big_tree(h, 1u << 20);
  docstore_Document *d = docstore_Document_new(h);
  d->root = big;
  cxr_str_setz(h, &d->id, "big");
  docstore_PutReply *cr = NULL, *br = NULL;
  double t0 = now_us();
  rc = docstore_DocStore_Count(c, d, &cr, NULL);
  double t_count = now_us() - t0;
  CHECK(rc == 0 && cr && cr->nodes == json_count(big), "count big: %s", cxr_strerror(rc));
  t0 = now_us();
  int rc2 = put(c, "big", big, &br);
  double t_put = now_us() - t0;
  CHECK(rc2 == 0, "put big: %s", cxr_strerror(rc2));
  Docstore__Document *pb = NULL;
  double t1 = now_us();
  docstore_Document_to_pb(d, &pb);
  size_t len = docstore__document__get_packed_size(pb);
  uint8_t *wire = malloc(len);
  double t2 = now_us();
  docstore__document__pack(pb, wire);
  Docstore__Document *back = docstore__document__unpack(NULL, len, wire);
  double t3 = now_us();
  if (!rc && !rc2)
    printf("a %llu-value tree of %llu bytes: Count by pointer %.0f us (validated, read in "
           "place); Put %.0f us (validated, deep-copied into the store);\n  protobuf-c pack + "
           "unpack of the same tree, no call at all: %.0f us (%zu wire bytes)\n",
           (unsigned long long)cr->nodes, (unsigned long long)br->bytes, t_count, t_put,
           t3 - t2, len);
  (void)t1;
  docstore_PutReply_free(h, cr);
  docstore__document__free_unpacked(back, NULL);
  free(wire);
  docstore_Document_pb_free(pb);
  docstore_PutReply_free(h, br);
  docstore_Document_free(h, d);
  cxr_conn_close(c);
  if (failures) fprintf(stderr, "docstore-client: %d checks failed\n", failures);
  else printf("docstore-client: all checks passed\n");
  return failures ? 1 : 0;
}

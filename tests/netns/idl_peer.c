/* A peer for netns_idl_test: the generated tree.Tree service across racks.
 *   idl_peer server CHANNEL LISTEN   serves (untrusted channel: the skeleton validates)
 *   idl_peer client TARGET CALLS     CALLS random trees, sync and async, each reply checked
 * Prints READY, then (client) "ok" or "fail: ..."; a server exits when stdin closes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cxrpc/rpc.h>

#include "tests/netns/tree.cxr.h"

static uint64_t count(const tree_Node *n) {
  uint64_t c = 1;
  for (uint64_t i = 0; n && i < n->kids.count; i++) c += count(&n->kids.items[i]);
  return c;
}

static int echo(cxr_call *call, const tree_EchoRequest *rq, tree_EchoReply **rs, void *user) {
  cxr_heap *h = cxr_call_heap(call);
  tree_EchoReply *r = tree_EchoReply_new(h);
  if (r == NULL) return CXR_ENOMEM;
  int rc = rq->root ? tree_Node_copy(h, rq->root, &r->root) : 0;
  if (rc) {
    tree_EchoReply_free(h, r);
    return rc;
  }
  r->nodes = rq->root ? count(rq->root) : 0;
  r->salt = rq->salt;
  *rs = r;
  (void)user;
  return 0;
}

static int server(const char *chan, const char *listen) {
  cxr_channel_opts o;
  cxr_channel_opts_init(&o);
  o.listen = listen;
  o.untrusted = true;
  cxr_channel *ch;
  int rc = cxr_channel_open(&ch, chan, &o);
  static tree_Tree_server srv = {.handlers = {.Echo = echo}};
  if (rc == 0) rc = tree_Tree_serve(ch, &srv);
  if (rc == 0) rc = cxr_channel_start(ch);
  if (rc) {
    printf("fail: %s\n", cxr_strerror(rc));
    return 1;
  }
  printf("READY\n");
  fflush(stdout);
  char line[64];
  while (fgets(line, sizeof line, stdin)) {
  }
  cxr_channel_close(ch);
  return 0;
}

static uint64_t rnd(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* A random node with up to `fan` kids per level, `depth` levels: names, blobs of up to 3000
 * bytes (some span pages), tags and map entries, all in h. */
static int build(cxr_heap *h, tree_Node *n, int depth, uint64_t *s) {
  char name[32];
  snprintf(name, sizeof name, "n%llu", (unsigned long long)(rnd(s) % 100000));
  int rc = cxr_str_setz(h, &n->name, name);
  size_t bl = rnd(s) % 3000;
  unsigned char blob[3000];
  for (size_t i = 0; i < bl; i++) blob[i] = (unsigned char)rnd(s);
  if (!rc && bl) rc = cxr_bytes_set(h, &n->blob, blob, bl);
  if (!rc && rnd(s) % 2) {
    if (!CXR_VEC_ALLOC(h, n->tags, 1 + rnd(s) % 3)) return CXR_ENOMEM;
    for (uint64_t i = 0; !rc && i < n->tags.count; i++) rc = cxr_str_setz(h, &n->tags.items[i], "tag");
  }
  if (!rc && rnd(s) % 2) {
    if (!CXR_VEC_ALLOC(h, n->attrs, 2)) return CXR_ENOMEM;
    for (uint64_t i = 0; !rc && i < 2; i++) {
      rc = cxr_str_setz(h, &n->attrs.items[i].key, i ? "b" : "a");
      n->attrs.items[i].value = (int64_t)rnd(s);
    }
  }
  if (!rc && depth > 0) {
    uint64_t k = rnd(s) % 4;
    if (k && !CXR_VEC_ALLOC(h, n->kids, k)) return CXR_ENOMEM;
    for (uint64_t i = 0; !rc && i < k; i++) rc = build(h, &n->kids.items[i], depth - 1, s);
  }
  return rc;
}

static int client(const char *target, int calls) {
  cxr_conn *c;
  int rc = cxr_connect(&c, target, NULL);
  if (rc) {
    printf("READY\nfail: connect: %s\n", cxr_strerror(rc));
    return 1;
  }
  printf("READY\n");
  fflush(stdout);
  cxr_heap *h = cxr_conn_heap(c);
  cxr_heap_stats st0, st;
  if (cxr_heap_stats(h, &st0) != 0) st0.used = 0;
  uint64_t seed = 0x9E3779B97F4A7C15ull;
  for (int i = 0; i < calls; i++) {
    tree_EchoRequest *rq = tree_EchoRequest_new(h);
    tree_Node *root = rq ? tree_Node_new(h) : NULL;
    if (!root || (rc = build(h, root, 4, &seed)) != 0) {
      printf("fail: build %d\n", i);
      return 1;
    }
    rq->root = root;
    rq->salt = (uint32_t)i;
    tree_EchoReply *rs = NULL;
    if (i % 2 == 0) {
      rc = tree_Tree_Echo(c, rq, &rs, NULL);
    } else {
      cxr_future *f;
      rc = tree_Tree_Echo_async(c, rq, &f, NULL);
      if (rc == 0) {
        rc = tree_Tree_Echo_wait(c, f, 0, &rs);
        cxr_future_free(f);
      }
    }
    if (rc || !rs) {
      printf("fail: call %d: %s\n", i, rc ? cxr_strerror(rc) : "no result");
      return 1;
    }
    /* The result lies where the connection says results live (the server heap's replica
     * across racks), is a copy (other addresses) and equals what was sent. */
    cxr_range rr = cxr_conn_result_range(c);
    bool inside = (uintptr_t)rs >= (uintptr_t)rr.p && (uintptr_t)rs < (uintptr_t)rr.p + rr.len;
    if (!inside || rs->root == root || !tree_Node_equal(rs->root, root) ||
        rs->nodes != count(root) || rs->salt != (uint32_t)i) {
      printf("fail: reply %d differs (inside %d)\n", i, inside);
      return 1;
    }
    tree_EchoReply_release(c, rs);
    tree_EchoRequest_free(h, rq);
  }
  /* Every request graph was freed and (in the pod) every result: the connection heap holds
   * what it held before. */
  if (cxr_heap_stats(h, &st) == 0 && st.used != st0.used)
    printf("fail: %zu bytes left in the connection heap (%zu before)\n", st.used, st0.used);
  else
    printf("ok %s\n", cxr_conn_is_remote(c) ? "remote" : "pod");
  fflush(stdout);
  cxr_conn_close(c);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc == 4 && !strcmp(argv[1], "server")) return server(argv[2], argv[3]);
  if (argc == 4 && !strcmp(argv[1], "client")) return client(argv[2], atoi(argv[3]));
  fprintf(stderr, "usage: idl_peer server CHANNEL ucx://ADDR:PORT | client TARGET CALLS\n");
  return 2;
}

/*
 * Demo: two processes share one heap at the same address and exchange a pointer-rich
 * structure without serializing it.
 *
 *   shared_heap            builder: creates the heap, builds a binary tree of 4095 nodes
 *                          (each with a name string), publishes it as the heap's root, then
 *                          starts `shared_heap walk` as a separate program and waits
 *   shared_heap --ctl PATH also runs `PATH heaps` (cxrpcctl) while the heap is live
 *   shared_heap walk NAME  walker: opens the heap by name, follows the builder's pointers,
 *                          checksums the tree, adds a node of its own, reports
 *
 * Only the public header <cxrpc/shm.h> is used.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cxrpc/shm.h>

typedef struct node {
  struct node *left, *right;
  char *label;  /* a pointer into the same heap */
  uint64_t key;
} node;

typedef struct tree {
  node *root;
  uint64_t count, checksum;  /* written by the builder */
  uint64_t walked, walk_sum; /* written by the walker */
  node *gift;                /* a node the walker built for the builder */
  int walker_pid;
} tree;

/* Order-independent: builder and walker visit nodes in different orders. Covers the key
 * and the label string, so both pointers of each node are followed. */
static uint64_t node_sum(uint64_t key, const char *label) {
  uint64_t h = 1469598103934665603ull ^ key;
  for (const char *c = label; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
  return h;
}

static node *build(cxr_heap *h, uint64_t lo, uint64_t hi, uint64_t *sum) {
  if (lo > hi) return NULL;
  uint64_t mid = lo + (hi - lo) / 2;
  node *n = cxr_heap_alloc(h, sizeof *n);
  char buf[32];
  int len = snprintf(buf, sizeof buf, "node-%" PRIu64, mid);
  n->label = cxr_heap_alloc(h, (size_t)len + 1);
  if (!n || !n->label) {
    fprintf(stderr, "builder: %s\n", cxr_strerror(cxr_last_error()));
    exit(1);
  }
  memcpy(n->label, buf, (size_t)len + 1);
  n->key = mid;
  *sum += node_sum(mid, n->label);
  n->left = mid > lo ? build(h, lo, mid - 1, sum) : NULL;
  n->right = build(h, mid + 1, hi, sum);
  return n;
}

/* In-order walk; checks every pointer lies in the heap before following it. */
static int walk(cxr_heap *h, const node *n, uint64_t *count, uint64_t *sum, int depth) {
  if (n == NULL) return 0;
  if (depth > 64 || !cxr_heap_contains(h, n, sizeof *n) || !cxr_heap_contains(h, n->label, 1))
    return -1;
  if (walk(h, n->left, count, sum, depth + 1)) return -1;
  (*count)++;
  *sum += node_sum(n->key, n->label);
  return walk(h, n->right, count, sum, depth + 1);
}

static int walker(const char *name) {
  cxr_heap *h;
  int rc = cxr_heap_open(&h, name);
  if (rc) {
    fprintf(stderr, "walker: open %s: %s\n", name, cxr_strerror(rc));
    return 1;
  }
  tree *t = cxr_heap_get_root(h);
  uint64_t count = 0, sum = 0;
  if (t == NULL || walk(h, t->root, &count, &sum, 0) != 0) {
    fprintf(stderr, "walker: the tree has a pointer outside the heap\n");
    return 1;
  }
  printf("walker  [pid %d]: mapped heap '%s' at %p; root label \"%s\"; walked %" PRIu64
         " nodes, checksum %016" PRIx64 "\n",
         (int)getpid(), name, cxr_heap_base(h), t->root->label, count, sum);
  node *g = cxr_heap_alloc(h, sizeof *g);
  g->label = cxr_heap_alloc(h, 32);
  snprintf(g->label, 32, "gift from pid %d", (int)getpid());
  g->left = g->right = NULL;
  g->key = 42;
  cxr_heap_adopt(h, g); /* already ours; shown for the API: it survives our lease as owned */
  t->walked = count;
  t->walk_sum = sum;
  t->walker_pid = (int)getpid();
  t->gift = g;
  cxr_heap_close(h);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "walk")) return walker(argv[2]);
  char name[64];
  snprintf(name, sizeof name, "demo-tree-%d", (int)getpid());
  cxr_heap *h;
  cxr_heap_opts o;
  cxr_heap_opts_init(&o);
  o.remove_on_last_close = true;
  int rc = cxr_heap_create(&h, name, 8 << 20, &o);
  if (rc) {
    fprintf(stderr, "builder: create: %s (root %s)\n", cxr_strerror(rc), cxr_root());
    return 1;
  }
  tree *t = cxr_heap_alloc(h, sizeof *t);
  memset(t, 0, sizeof *t);
  uint64_t sum = 0;
  t->count = 4095;
  t->root = build(h, 1, t->count, &sum);
  t->checksum = sum;
  cxr_heap_set_root(h, t);
  cxr_heap_stats st;
  cxr_heap_stats(h, &st);
  printf("builder [pid %d]: heap '%s' at %p (%zu KiB) in %s; built a tree of %" PRIu64
         " nodes, %zu bytes used, checksum %016" PRIx64 "\n",
         (int)getpid(), name, cxr_heap_base(h), cxr_heap_size(h) >> 10, cxr_root(), t->count,
         st.used, t->checksum);
  fflush(stdout);

  pid_t pid = fork();
  if (pid == 0) {
    /* A new program image: nothing inherited but the heap's name. */
    execl("/proc/self/exe", argv[0], "walk", name, (char *)NULL);
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0 && t->walked == t->count &&
           t->walk_sum == t->checksum && t->gift && cxr_heap_contains(h, t->gift, sizeof *t->gift);
  if (ok)
    printf("builder [pid %d]: walker %d saw the same %" PRIu64 " nodes (checksums match) and left "
           "a node at %p labelled \"%s\"\n",
           (int)getpid(), t->walker_pid, t->walked, (void *)t->gift, t->gift->label);
  else
    printf("builder: MISMATCH: walker status %d, walked %" PRIu64 "/%" PRIu64 "\n", status,
           t->walked, t->count);
  if (argc == 3 && !strcmp(argv[1], "--ctl")) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "'%s' heaps", argv[2]);
    printf("builder [pid %d]: what cxrpcctl sees while the heap is live:\n", (int)getpid());
    fflush(stdout);
    if (system(cmd) != 0) printf("(cxrpcctl failed)\n");
  }
  cxr_heap_stats(h, &st);
  printf("builder [pid %d]: heap stats: %zu bytes used, %" PRIu64 " allocations, %u holder(s); "
         "closing (last holder: the heap file is removed)\n",
         (int)getpid(), st.used, st.allocs, st.holders);
  cxr_heap_close(h);
  return ok ? 0 : 1;
}

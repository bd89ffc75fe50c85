/* Writes seed inputs for validate_fuzz: real message graphs built in a heap, laid out as
 * one block with every pointer rewritten to the fuzzer's tagged form (0xC0DE << 48 |
 * offset), so the fuzzer starts from valid graphs and mutates from there.
 *   validate_seeds DIR [count] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/idl/everything.cxr.h"

static cxr_heap *h;
static uint64_t rs = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
  rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
  return rs;
}

static void str(cxr_str *s) {
  char b[24];
  int n = (int)(rnd() % 12);
  for (int i = 0; i < n; i++) b[i] = (char)('a' + rnd() % 26);
  cxr_str_set(h, s, b, (size_t)n);
}

static cxrtest_open_Tree *tree(int depth) {
  cxrtest_open_Tree *t = cxrtest_open_Tree_new(h);
  str(&t->name);
  t->kind = (int32_t)(rnd() % 3);
  if (depth < 3 && rnd() % 2) {
    uint64_t n = 1 + rnd() % 3;
    CXR_VEC_ALLOC(h, t->children, n);
    for (uint64_t i = 0; i < n; i++) {
      cxrtest_open_Tree *c = tree(depth + 1);
      t->children.items[i] = *c;
      cxr_heap_free(h, c);
    }
  }
  if (depth < 3 && rnd() % 3 == 0) t->link = tree(depth + 1);
  if (rnd() % 2) {
    CXR_VEC_ALLOC(h, t->attrs, 1);
    str(&t->attrs.items[0].key);
    str(&t->attrs.items[0].value);
  }
  if (rnd() % 2) t->payload_case = 8, str(&t->payload.text);
  if (rnd() % 2) {
    CXR_VEC_ALLOC(h, t->sizes, 2);
    CXR_VEC_ALLOC(h, t->kinds, 2);
  }
  return t;
}

static cxrtest_Everything_Inner *inner(int depth) {
  cxrtest_Everything_Inner *in = cxrtest_Everything_Inner_new(h);
  in->has_mode = true;
  in->mode = (int32_t)(rnd() % 2);
  if (rnd() % 2) {
    CXR_VEC_ALLOC(h, in->notes, 2);
    str(&in->notes.items[0]);
    str(&in->notes.items[1]);
  }
  if (depth < 6 && rnd() % 2) in->child = inner(depth + 1);
  return in;
}

static cxrtest_Everything *everything(void) {
  cxrtest_Everything *m = cxrtest_Everything_new(h);
  m->id = (int64_t)rnd();
  str(&m->name);
  m->must = cxrtest_Leaf_new(h);
  if (rnd() % 2) m->inner = inner(0);
  if (rnd() % 2) m->tree = tree(0);
  if (rnd() % 2) m->has_color = true, m->color = 2;
  if (rnd() % 2) {
    CXR_VEC_ALLOC(h, m->r_leaf, 2);
    m->r_leaf.items[1].has_label = true;
    str(&m->r_leaf.items[1].label);
  }
  if (rnd() % 2) {
    CXR_VEC_ALLOC(h, m->by_name, 1);
    str(&m->by_name.items[0].key);
    m->by_name.items[0].value = cxrtest_Leaf_new(h);
  }
  if (rnd() % 2) {
    CXR_VEC_ALLOC(h, m->r_string, 2);
    str(&m->r_string.items[0]);
  }
  if (rnd() % 2) CXR_VEC_ALLOC(h, m->r_bool, 3);
  if (rnd() % 2) m->choice_case = 52, m->choice.c_leaf = cxrtest_Leaf_new(h);
  return m;
}

/* Lays the graph's ranges out in one block and rewrites pointers into tagged offsets. */
static size_t to_block(cxr_ranges *r, uint8_t *out, size_t cap) {
  size_t off[4096], cur = 0;
  if (r->count > 4096) return 0;
  for (size_t i = 0; i < r->count; i++) {
    cur = (cur + 7) & ~(size_t)7;
    off[i] = cur;
    if (cur + r->items[i].len > cap) return 0;
    memcpy(out + cur, r->items[i].p, r->items[i].len);
    cur += r->items[i].len;
  }
  for (size_t i = 0; i < r->count; i++) {
    for (size_t k = 0; k + 8 <= r->items[i].len; k += 8) {
      uint64_t v;
      memcpy(&v, out + off[i] + k, 8);
      for (size_t j = 0; j < r->count; j++) {
        uintptr_t p = (uintptr_t)r->items[j].p;
        if (v >= p && v < p + r->items[j].len) {
          v = 0xC0DEull << 48 | (uint64_t)(off[j] + (v - p));
          memcpy(out + off[i] + k, &v, 8);
          break;
        }
      }
    }
  }
  return cur;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: validate_seeds DIR [count]\n");
    return 2;
  }
  int count = argc > 2 ? atoi(argv[2]) : 60;
  if (cxr_init(NULL) != 0) return 1;
  char name[64];
  snprintf(name, sizeof name, "fuzz-seeds-%d", (int)getpid());
  if (cxr_heap_create(&h, name, 64u << 20, NULL) != 0) return 1;
  cxr_heap_unlink(name);
  static uint8_t buf[2 + 60000];
  int written = 0;
  for (int i = 0; i < count; i++) {
    cxr_ranges r;
    cxr_ranges_init(&r);
    int which = i % 3;
    if (which == 0) cxrtest_Everything_ranges(everything(), &r);
    else if (which == 1) cxrtest_open_Tree_ranges(tree(0), &r);
    else cxrtest_Everything_Inner_ranges(inner(0), &r);
    buf[0] = (uint8_t)which;
    buf[1] = 63;  /* max_depth 64 */
    size_t n = to_block(&r, buf + 2, sizeof buf - 2);
    cxr_ranges_free(&r);
    if (n == 0) continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/seed-%03d", argv[1], i);
    FILE *f = fopen(path, "wb");
    if (!f) continue;
    written += fwrite(buf, 1, n + 2, f) == n + 2;
    fclose(f);
  }
  printf("%d seeds\n", written);
  cxr_heap_close(h);
  return 0;
}

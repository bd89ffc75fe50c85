/* JSON <-> docstore_Value, building directly in a shared heap. */
#include "examples/docstore/json.h"

#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cxrpc/sandbox.h>

typedef struct parser {
  cxr_heap *h;
  const char *p;
  char *err;
  size_t errlen;
  int depth;
} parser;

static bool fail(parser *ps, const char *why) {
  if (ps->err && !ps->err[0]) snprintf(ps->err, ps->errlen, "%s near '%.12s'", why, ps->p);
  return false;
}

static void ws(parser *ps) {
  while (isspace((unsigned char)*ps->p)) ps->p++;
}

static bool str(parser *ps, cxr_str *out) {
  if (*ps->p != '"') return fail(ps, "expected a string");
  const char *s = ++ps->p;
  size_t n = 0;
  for (; s[n] != '"'; n++)
    if (!s[n] || s[n] == '\\') return fail(ps, "unterminated string (escapes are not supported)");
  ps->p = s + n + 1;
  return cxr_str_set(ps->h, out, s, n) == 0 || fail(ps, "heap full");
}

static bool value(parser *ps, docstore_Value *v);

/* Values of arrays and members of objects go into inline arrays; we count first by
 * parsing into a temporary linked list of heap values, then copy them into place. */
typedef struct item {
  docstore_Value v;
  cxr_str key;
  struct item *next;
} item;

static bool list(parser *ps, char close, bool keyed, item **head, uint64_t *n) {
  item **tail = head;
  *n = 0;
  ps->p++;
  ws(ps);
  if (*ps->p == close) return ps->p++, true;
  for (;;) {
    item *it = calloc(1, sizeof *it);
    if (!it) return fail(ps, "out of memory");
    *tail = it, tail = &it->next, (*n)++;
    ws(ps);
    if (keyed) {
      if (!str(ps, &it->key)) return false;
      ws(ps);
      if (*ps->p++ != ':') return fail(ps, "expected ':'");
      ws(ps);
    }
    if (!value(ps, &it->v)) return false;
    ws(ps);
    if (*ps->p == ',') {
      ps->p++;
      continue;
    }
    if (*ps->p == close) return ps->p++, true;
    return fail(ps, "expected ',' or a closing bracket");
  }
}

static void drop(item *it) {
  while (it) {
    item *n = it->next;
    free(it);
    it = n;
  }
}

static bool value(parser *ps, docstore_Value *v) {
  if (++ps->depth > 64) return fail(ps, "nested too deeply");
  ws(ps);
  bool ok = true;
  const char *p = ps->p;
  if (*p == '"') {
    v->kind_case = 4;
    ok = str(ps, &v->kind.text);
  } else if (*p == '{' || *p == '[') {
    bool obj = *p == '{';
    item *head = NULL;
    uint64_t n = 0;
    ok = list(ps, obj ? '}' : ']', obj, &head, &n);
    if (ok && obj) {
      docstore_Object *o = docstore_Object_new(ps->h);
      ok = o && (n == 0 || CXR_VEC_ALLOC(ps->h, o->members, n));
      uint64_t i = 0;
      for (item *it = head; ok && it; it = it->next, i++) {
        o->members.items[i].key = it->key;
        docstore_Value *c = docstore_Value_new(ps->h);
        ok = c != NULL;
        if (ok) *c = it->v, o->members.items[i].value = c;
      }
      v->kind_case = 5, v->kind.object = o;
    } else if (ok) {
      docstore_Array *a = docstore_Array_new(ps->h);
      ok = a && (n == 0 || CXR_VEC_ALLOC(ps->h, a->items, n));
      uint64_t i = 0;
      for (item *it = head; ok && it; it = it->next, i++) a->items.items[i] = it->v;
      v->kind_case = 6, v->kind.array = a;
    }
    if (!ok) fail(ps, "heap full");
    drop(head);
  } else if (strncmp(p, "true", 4) == 0 || strncmp(p, "false", 5) == 0) {
    v->kind_case = 2, v->kind.bool_value = *p == 't';
    ps->p += *p == 't' ? 4 : 5;
  } else if (strncmp(p, "null", 4) == 0) {
    v->kind_case = 1, v->kind.null_value = true;
    ps->p += 4;
  } else {
    char *end;
    double d = strtod(p, &end);
    if (end == p) return fail(ps, "expected a value");
    v->kind_case = 3, v->kind.number = d;
    ps->p = end;
  }
  ps->depth--;
  return ok;
}

docstore_Value *json_parse(cxr_heap *h, const char *text, char *err, size_t errlen) {
  if (err && errlen) err[0] = 0;
  parser ps = {h, text, err, errlen, 0};
  docstore_Value *v = docstore_Value_new(h);
  if (!v) return NULL;
  if (!value(&ps, v)) return NULL;  /* what was built stays in h until the heap goes */
  ws(&ps);
  if (*ps.p) return fail(&ps, "trailing text"), NULL;
  return v;
}

void json_print(FILE *f, const docstore_Value *v) {
  if (!v) {
    fputs("null", f);
    return;
  }
  switch (v->kind_case) {
    case 2: fputs(v->kind.bool_value ? "true" : "false", f); break;
    case 3: fprintf(f, "%.17g", v->kind.number); break;
    case 4: fprintf(f, "\"%.*s\"", (int)v->kind.text.len, v->kind.text.ptr); break;
    case 5: {
      const docstore_Object *o = v->kind.object;
      fputc('{', f);
      for (uint64_t i = 0; o && i < o->members.count; i++) {
        const docstore_Member *m = &o->members.items[i];
        fprintf(f, "%s\"%.*s\": ", i ? ", " : "", (int)m->key.len, m->key.ptr);
        json_print(f, m->value);
      }
      fputc('}', f);
      break;
    }
    case 6: {
      const docstore_Array *a = v->kind.array;
      fputc('[', f);
      for (uint64_t i = 0; a && i < a->items.count; i++) {
        if (i) fputs(", ", f);
        json_print(f, &a->items.items[i]);
      }
      fputc(']', f);
      break;
    }
    default: fputs("null", f);
  }
}

const docstore_Value *json_at(const docstore_Value *v, const char *path, size_t len) {
  size_t i = 0;
  while (v && i < len) {
    size_t j = i;
    while (j < len && path[j] != '.') j++;
    const char *seg = path + i;
    size_t n = j - i;
    if (v->kind_case == 5 && v->kind.object) {
      const docstore_Object *o = v->kind.object;
      const docstore_Value *next = NULL;
      for (uint64_t k = 0; k < o->members.count; k++)
        if (o->members.items[k].key.len == n && memcmp(o->members.items[k].key.ptr, seg, n) == 0)
          next = o->members.items[k].value;
      v = next;
    } else if (v->kind_case == 6 && v->kind.array) {
      char *end;
      char buf[24];
      if (n == 0 || n >= sizeof buf) return NULL;
      memcpy(buf, seg, n), buf[n] = 0;
      unsigned long idx = strtoul(buf, &end, 10);
      if (*end || idx >= v->kind.array->items.count) return NULL;
      v = &v->kind.array->items.items[idx];
    } else {
      return NULL;
    }
    i = j + 1;
  }
  return v;
}

/* True when `count` elements of `elem` bytes at p lie inside r (their size not overflowing). */
static bool array_in(const cxr_range *r, const void *p, uint64_t count, size_t elem,
                     size_t align) {
  return count == 0 ||
         (count <= SIZE_MAX / elem && cxr_range_check(r, p, count * elem, align) == 0);
}

/* Each block is checked against r before it is read, at the address and count read once:
 * a pointer swapped after validation may point anywhere the server maps. Every member and
 * item looked at costs one unit of *work, NULL ones too: counting values alone let an object
 * of a million members with no value, shared by a million references, cost 10^12 steps
 * within the bound on values (a review, 2026-11-28). */
static int count_within(const docstore_Value *v, const cxr_range *r, uint64_t max, unsigned depth,
                        uint64_t *n, uint64_t *work) {
  if (v == NULL) return 0;
  if (cxr_range_check(r, v, sizeof *v, _Alignof(docstore_Value))) return CXR_EBADPTR;
  if (*n >= max) return CXR_EINVAL;
  ++*n;
  uint32_t kind = CXR__LOAD(&v->kind_case);
  int rc = 0;
  if (kind == 5) {
    const docstore_Object *o = CXR__LOAD(&v->kind.object);
    if (o == NULL) return 0;
    if (depth == 0) return CXR_EINVAL;
    if (cxr_range_check(r, o, sizeof *o, _Alignof(docstore_Object))) return CXR_EBADPTR;
    uint64_t count = CXR__LOAD(&o->members.count);
    const docstore_Member *m = CXR__LOAD(&o->members.items);
    if (!array_in(r, m, count, sizeof *m, _Alignof(docstore_Member))) return CXR_EBADPTR;
    if (count > max - *work) return CXR_EINVAL;
    *work += count;
    for (uint64_t i = 0; i < count && !rc; i++)
      rc = count_within(CXR__LOAD(&m[i].value), r, max, depth - 1, n, work);
  } else if (kind == 6) {
    const docstore_Array *a = CXR__LOAD(&v->kind.array);
    if (a == NULL) return 0;
    if (depth == 0) return CXR_EINVAL;
    if (cxr_range_check(r, a, sizeof *a, _Alignof(docstore_Array))) return CXR_EBADPTR;
    uint64_t count = CXR__LOAD(&a->items.count);
    const docstore_Value *items = CXR__LOAD(&a->items.items);
    if (!array_in(r, items, count, sizeof *items, _Alignof(docstore_Value))) return CXR_EBADPTR;
    if (count > max - *work) return CXR_EINVAL;
    *work += count;
    for (uint64_t i = 0; i < count && !rc; i++)
      rc = count_within(&items[i], r, max, depth - 1, n, work);
  }
  return rc;
}

int json_count_within(const docstore_Value *v, const cxr_range *r, uint64_t max, unsigned depth,
                      uint64_t *n) {
  uint64_t work = 0;
  return count_within(v, r, max, depth, n, &work);
}

uint64_t json_count(const docstore_Value *v) {
  if (!v) return 0;
  uint64_t n = 1;
  if (v->kind_case == 5 && v->kind.object)
    for (uint64_t i = 0; i < v->kind.object->members.count; i++)
      n += json_count(v->kind.object->members.items[i].value);
  if (v->kind_case == 6 && v->kind.array)
    for (uint64_t i = 0; i < v->kind.array->items.count; i++)
      n += json_count(&v->kind.array->items.items[i]);
  return n;
}

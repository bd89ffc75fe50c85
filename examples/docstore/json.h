/* A small JSON reader and writer for docstore values: parses text straight into a
 * docstore_Value tree in a heap (no intermediate tree) and prints one back. */
#ifndef DOCSTORE_JSON_H
#define DOCSTORE_JSON_H

#include <stdio.h>

#include "examples/docstore/docstore.cxr.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Parses a JSON text into h; NULL on a syntax error (message in err) or a full heap. */
docstore_Value *json_parse(cxr_heap *h, const char *text, char *err, size_t errlen);
void json_print(FILE *f, const docstore_Value *v);
/* The value at a dotted path ("a.b.0"), or NULL. */
const docstore_Value *json_at(const docstore_Value *v, const char *path, size_t len);
/* Values in a tree (the root included). */
uint64_t json_count(const docstore_Value *v);
/* The same for a tree its writer may still be changing (a request read where it lies, in
 * the client's heap): each field read once, at most max values and depth levels below the
 * root, every value, object and array inside r (the call's argument range), and at most max
 * members and items looked at in all. Shared subtrees
 * count once per reference, so a graph the validator saw small can stand, after the client
 * swaps one pointer, for a tree of 2^50 values. 0, or CXR_EINVAL when a bound is reached,
 * CXR_EBADPTR when a pointer lies outside r (*n is then what was counted). */
int json_count_within(const docstore_Value *v, const cxr_range *r, uint64_t max, unsigned depth,
                      uint64_t *n);

#ifdef __cplusplus
}
#endif

#endif

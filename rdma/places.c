/* Places for answers not yet sent, per client: a hash table keyed by the UCX endpoint,
 * linear probing, at most half full (places.h). */
#include <stdint.h>
#include <stdlib.h>

#include "rdma/places.h"

enum { PLACES_MIN = 16 }; /* the smallest table (a power of 2) */

/* Where `uep`'s probe starts: the endpoint's address spread by Fibonacci hashing (its low
 * bits are alignment). */
static size_t home(const cxr__places *p, ucp_ep_h uep) {
  uint64_t x = (uint64_t)(uintptr_t)uep * 0x9E3779B97F4A7C15ull;
  return (size_t)(x >> 32) & (p->cap - 1);
}

/* The slot holding `uep`, or the free one where it would go (the table is never full). */
static cxr__place *find(const cxr__places *p, ucp_ep_h uep) {
  size_t i = home(p, uep);
  while (p->slots[i].uep != NULL && p->slots[i].uep != uep) i = (i + 1) & (p->cap - 1);
  return &p->slots[i];
}

/* Moves the entries into a table of `cap` slots: false (the table as it was) without memory. */
static bool resize(cxr__places *p, size_t cap) {
  cxr__place *slots = calloc(cap, sizeof *slots);
  if (slots == NULL) return false;
  cxr__places n = {.slots = slots, .cap = cap, .clients = p->clients, .out = p->out};
  for (size_t i = 0; i < p->cap; i++)
    if (p->slots[i].uep != NULL) *find(&n, p->slots[i].uep) = p->slots[i];
  free(p->slots);
  *p = n;
  return true;
}

bool cxr__place_take(cxr__places *p, ucp_ep_h uep, unsigned each, unsigned shared) {
  if (uep == NULL) return false;
  cxr__place *c = p->cap ? find(p, uep) : NULL;
  if (c != NULL && c->uep == uep) {
    if (c->out >= each || p->out >= shared) return false;
    c->out++;
    p->out++;
    return true;
  }
  /* A client's first place is its own: no bound but its endpoint's cost. */
  if ((p->clients + 1) * 2 > p->cap && !resize(p, p->cap ? p->cap * 2 : PLACES_MIN))
    return false;
  *find(p, uep) = (cxr__place){.uep = uep, .out = 1};
  p->clients++;
  return true;
}

/* Empties slot i, moving back the entries after it that probed past it, so that every
 * entry stays reachable from its home without tombstones. */
static void erase(cxr__places *p, size_t i) {
  size_t mask = p->cap - 1;
  for (size_t j = (i + 1) & mask; p->slots[j].uep != NULL; j = (j + 1) & mask) {
    size_t h = home(p, p->slots[j].uep);
    if (((j - h) & mask) >= ((j - i) & mask)) { /* i lies between its home and j */
      p->slots[i] = p->slots[j];
      i = j;
    }
  }
  p->slots[i] = (cxr__place){0};
}

void cxr__place_give(cxr__places *p, ucp_ep_h uep) {
  if (p->cap == 0 || uep == NULL) return;
  cxr__place *c = find(p, uep);
  if (c->uep != uep) return;
  if (--c->out > 0) {
    p->out--; /* places are alike: the client's own is the last one given */
    return;
  }
  erase(p, (size_t)(c - p->slots));
  if (--p->clients == 0) {
    cxr__places_drop(p); /* a flood's table is not kept once it is over */
  } else if (p->cap > PLACES_MIN && p->clients * 8 < p->cap) {
    resize(p, p->cap / 2); /* (without memory it stays as large: still correct) */
  }
}

void cxr__places_drop(cxr__places *p) {
  free(p->slots);
  *p = (cxr__places){0};
}

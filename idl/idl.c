/* The idl runtime: validation context, builders, copy/free/equal helpers, ranges. */
#include <cxrpc/idl.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shm/log.h"

void cxr_limits_init(cxr_limits *l) {
  if (!l) return;
  l->max_depth = 64;
  l->max_nodes = 1u << 20;
  l->max_len = 256u << 20;
}

static _Thread_local int invalid_reason;

int cxr_invalid_reason(void) { return invalid_reason; }

const char *cxr_invalid_str(int reason) {
  static const char *const s[] = {
      "valid",
      "pointer outside the allowed range",
      "length past the end of the range or over max_len",
      "misaligned pointer",
      "message reached twice (cycle or shared node)",
      "nesting deeper than max_depth",
      "more than max_nodes messages or elements",
      "value outside a closed enum",
      "bool other than 0 or 1",
      "oneof case names no member",
      "required message field missing",
      "NULL pointer where data is required",
  };
  if (reason < 0 || (size_t)reason >= sizeof s / sizeof s[0]) return "unknown reason";
  return s[reason];
}

/* ---------------- validation ---------------- */

/* The visited set starts in the context (v->small); a larger one lives in one block per
 * thread that stays with the thread between validations, each clearing the part it uses.
 * A validation that never returns, as cxr_sandbox_run abandons one that faults on a peer's
 * page, then leaves nothing that the thread's next validation does not reuse or free, and
 * the block goes when the thread ends (thread_exit). A block above VSET_KEEP_BYTES is
 * given back at the end of a validation, so an idle thread keeps at most that much.
 * Validators never nest on a thread (they call nothing but the generated walk). */
#define VSET_KEEP_BYTES ((size_t)1 << 20)

static _Thread_local uintptr_t *vset_mem;
static _Thread_local size_t vset_cap; /* entries of vset_mem */

/* The ancestor set of a _free walk (below): allocated at the thread's first _free. */
static _Thread_local const void **free_anc;
static _Thread_local uint16_t *free_anc_slot;
static _Thread_local unsigned free_levels; /* levels free_anc holds; 0: not allocated */
static _Thread_local bool free_anc_kept;   /* thread_exit will free it */
/* The leaves a _free walk frees at its end (free_pend_add): allocated at its first leaf.
 * Its larger tables are its own, never the thread's validation block (grow): a walk cut
 * short by a fault (cxr_sandbox_run) leaves it filled until the thread's next _free, and a
 * validation run in between would clear or free it. */
static _Thread_local cxr__vctx *free_pend;

/* One key for the blocks this file keeps per thread: its destructor frees them when the
 * thread ends. Its value is only a non-NULL mark (a destructor runs for those alone). */
static pthread_once_t thread_once = PTHREAD_ONCE_INIT;
static pthread_key_t thread_key;
static bool thread_key_made;
static _Thread_local bool thread_armed; /* this thread's mark is set (thread_exit clears) */

static void free_anc_drop(void) {
  free(free_anc);
  free_anc = NULL;
  free_anc_slot = NULL;
  free_levels = 0;
  free_anc_kept = false;
}

static void thread_exit(void *mark) {
  (void)mark;
  free(vset_mem);
  vset_mem = NULL;
  vset_cap = 0;
  free_anc_drop();
  if (free_pend != NULL && free_pend->set != free_pend->small) free(free_pend->set);
  free(free_pend);
  free_pend = NULL;
  thread_armed = false; /* the key's value is NULL again: a later block must set it */
}

static void thread_make_key(void) {
  thread_key_made = pthread_key_create(&thread_key, thread_exit) == 0;
}

/* Whether thread_exit will free this thread's blocks; false if the key could not be made,
 * and then nothing would: callers keep no block between calls. */
static bool thread_exit_armed(void) {
  if (thread_armed) return true; /* (validations ask each time: set the mark once) */
  pthread_once(&thread_once, thread_make_key);
  thread_armed = thread_key_made && pthread_setspecific(thread_key, &thread_key_made) == 0;
  return thread_armed;
}

static size_t vset_keep_bytes(void) { return thread_exit_armed() ? VSET_KEEP_BYTES : 0; }

/* Makes mem (cap entries, or NULL) the thread's block, freeing the one it replaces. */
static void vset_adopt(uintptr_t *mem, size_t cap) {
  if (vset_mem != mem) free(vset_mem);
  vset_mem = mem;
  vset_cap = cap;
  if (mem) thread_exit_armed();
}

int cxr__v_begin(cxr__vctx *v, const cxr_range *r, const cxr_limits *lim) {
  if (!v || !r || !r->p) return CXR_EINVAL;
  memset(v, 0, offsetof(cxr__vctx, small));
  v->lo = (uintptr_t)r->p;
  if (r->len > UINTPTR_MAX - v->lo) return CXR_EINVAL;
  v->hi = v->lo + r->len;
  cxr_limits tmp;
  v->lim = *cxr__limits(lim, &tmp);
  v->set = v->small;
  v->cap = sizeof v->small / sizeof v->small[0];
  memset(v->small, 0, sizeof v->small);
  invalid_reason = CXR_INVALID_NONE;
  return 0;
}

void cxr__v_end(cxr__vctx *v) {
  if (v) v->set = NULL;
  if (vset_cap && vset_cap * sizeof *vset_mem > vset_keep_bytes()) vset_adopt(NULL, 0);
}

int cxr__v_fail(cxr__vctx *v, int reason) {
  (void)v;
  invalid_reason = reason;
  switch (reason) {
    case CXR_INVALID_RANGE:
    case CXR_INVALID_LENGTH:
    case CXR_INVALID_ALIGN:
    case CXR_INVALID_NULL:
      return CXR_EBADPTR;
    default:
      return CXR_EPROTO;
  }
}

int cxr__v_count(cxr__vctx *v, uint64_t n) {
  if (n > v->lim.max_nodes || v->nodes > v->lim.max_nodes - n)
    return cxr__v_fail(v, CXR_INVALID_NODES);
  v->nodes += n;
  return 0;
}

static inline size_t hash_ptr(uintptr_t p) {
  uint64_t x = (uint64_t)p * 0x9E3779B97F4A7C15ull;
  return (size_t)(x >> 17);
}

/* Doubles the set: into the thread's block when it is idle (v->set is still small) and
 * large enough, else into a new block that replaces it. */
static int grow(cxr__vctx *v) {
  size_t ncap = v->cap * 2;
  bool own = v == free_pend; /* its blocks are its own (free_pend) */
  uintptr_t *ns;
  if (!own && v->set != vset_mem && vset_cap >= ncap) {
    ns = vset_mem;
    memset(ns, 0, ncap * sizeof *ns);
  } else if (!(ns = calloc(ncap, sizeof *ns))) {
    return CXR_ENOMEM;
  }
  for (size_t i = 0; i < v->cap; i++) {
    uintptr_t q = v->set[i];
    if (!q) continue;
    size_t j = hash_ptr(q) & (ncap - 1);
    while (ns[j]) j = (j + 1) & (ncap - 1);
    ns[j] = q;
  }
  if (own && v->set != v->small) free(v->set);
  else if (!own && ns != vset_mem) vset_adopt(ns, ncap); /* frees the old block (v->set?) */
  v->set = ns;
  v->cap = ncap;
  return 0;
}

/* Inserts p; returns 1 if it was already there, 0 if inserted, <0 on error (then p is
 * not there: a set that cannot grow still answers 1 for what it holds). The set never
 * holds more than max_nodes entries (callers count first). */
static int visit(cxr__vctx *v, uintptr_t p) {
  size_t j = hash_ptr(p) & (v->cap - 1);
  while (v->set[j]) {
    if (v->set[j] == p) return 1;
    j = (j + 1) & (v->cap - 1);
  }
  if ((v->n + 1) * 2 > v->cap) {
    int rc = grow(v);
    if (rc) return rc;
    j = hash_ptr(p) & (v->cap - 1);
    while (v->set[j]) j = (j + 1) & (v->cap - 1);
  }
  v->set[j] = p;
  v->n++;
  return 0;
}

/* p..p+len inside [lo, hi), aligned. */
static int check_mem(cxr__vctx *v, uintptr_t p, uint64_t len, size_t align) {
  if (p < v->lo || p >= v->hi) return cxr__v_fail(v, CXR_INVALID_RANGE);
  if (len > v->hi - p) return cxr__v_fail(v, CXR_INVALID_LENGTH);
  if (align > 1 && (p & (align - 1))) return cxr__v_fail(v, CXR_INVALID_ALIGN);
  return 0;
}

static int node(cxr__vctx *v, const void *p, size_t size, size_t align) {
  int rc = check_mem(v, (uintptr_t)p, size, align);
  if (rc) return rc;
  if ((rc = cxr__v_count(v, 1))) return rc;
  rc = visit(v, (uintptr_t)p);
  if (rc < 0) return rc;
  if (rc) return cxr__v_fail(v, CXR_INVALID_CYCLE);
  return 0;
}

int cxr__v_root(cxr__vctx *v, const void *p, size_t size, size_t align, cxr__vfn fn) {
  if (!p) return cxr__v_fail(v, CXR_INVALID_NULL);
  int rc = node(v, p, size, align);
  return rc ? rc : fn(v, p);
}

int cxr__v_msg(cxr__vctx *v, const void *p, size_t size, size_t align, cxr__vfn fn,
               bool required) {
  if (!p) return required ? cxr__v_fail(v, CXR_INVALID_REQUIRED) : 0;
  if (v->depth >= v->lim.max_depth) return cxr__v_fail(v, CXR_INVALID_DEPTH);
  int rc = node(v, p, size, align);
  if (rc) return rc;
  v->depth++;
  rc = fn(v, p);
  v->depth--;
  return rc;
}

int cxr__v_block(cxr__vctx *v, const void *p, uint64_t count, size_t elem, size_t align) {
  if (count == 0) return 0;  /* the pointer is never read when empty */
  if (!p) return cxr__v_fail(v, CXR_INVALID_NULL);
  if (elem == 0) return CXR_EINVAL; /* a caller's error, not the peer's: no reason set */
  if (count > v->lim.max_len / elem) return cxr__v_fail(v, CXR_INVALID_LENGTH);
  return check_mem(v, (uintptr_t)p, count * elem, align);
}

int cxr__v_bool(cxr__vctx *v, const bool *b) {
  uint8_t x;
  memcpy(&x, b, 1);  /* read as a byte: a bool holding 2 is undefined behaviour */
  return x > 1 ? cxr__v_fail(v, CXR_INVALID_BOOL) : 0;
}

/* Each bool read counts as an element, like each closed enum: one array referenced from
 * many messages is read once per reference (arrays are not deduplicated), and the count
 * is what bounds that work. */
int cxr__v_bools(cxr__vctx *v, const cxr_vec_bool *a) {
  const bool *items = a->items;
  uint64_t n = a->count;
  int rc = cxr__v_block(v, items, n, 1, 1);
  if (rc || (rc = cxr__v_count(v, n))) return rc;
  const uint8_t *q = (const uint8_t *)items;
  for (uint64_t i = 0; i < n; i++)
    if (q[i] > 1) return cxr__v_fail(v, CXR_INVALID_BOOL);
  return 0;
}

int cxr__v_str(cxr__vctx *v, const cxr_str *s) {
  return cxr__v_block(v, s->ptr, s->len, 1, 1);
}

int cxr__v_bytes(cxr__vctx *v, const cxr_bytes *b) {
  return cxr__v_block(v, b->ptr, b->len, 1, 1);
}

int cxr__v_strs(cxr__vctx *v, const cxr_vec_str *a) {
  const cxr_str *items = a->items;
  uint64_t n = a->count;
  int rc = cxr__v_block(v, items, n, sizeof(cxr_str), _Alignof(cxr_str));
  if (rc || (rc = cxr__v_count(v, n))) return rc;
  for (uint64_t i = 0; i < n; i++)
    if ((rc = cxr__v_str(v, &items[i]))) return rc;
  return 0;
}

int cxr__v_bytess(cxr__vctx *v, const cxr_vec_bytes *a) {
  const cxr_bytes *items = a->items;
  uint64_t n = a->count;
  int rc = cxr__v_block(v, items, n, sizeof(cxr_bytes), _Alignof(cxr_bytes));
  if (rc || (rc = cxr__v_count(v, n))) return rc;
  for (uint64_t i = 0; i < n; i++)
    if ((rc = cxr__v_bytes(v, &items[i]))) return rc;
  return 0;
}

int cxr__v_enums(cxr__vctx *v, const cxr_vec_i32 *a, bool (*valid)(int32_t)) {
  const int32_t *items = a->items;
  uint64_t n = a->count;
  int rc = cxr__v_block(v, items, n, sizeof(int32_t), _Alignof(int32_t));
  if (rc || (rc = cxr__v_count(v, n))) return rc;
  for (uint64_t i = 0; i < n; i++)
    if (!valid(items[i])) return cxr__v_fail(v, CXR_INVALID_ENUM);
  return 0;
}

int cxr__v_msgs(cxr__vctx *v, const void *items, uint64_t count, size_t size, size_t align,
                cxr__vfn fn) {
  int rc = cxr__v_block(v, items, count, size, align);
  if (rc || count == 0) return rc;
  if (v->depth >= v->lim.max_depth) return cxr__v_fail(v, CXR_INVALID_DEPTH);
  v->depth++;
  for (uint64_t i = 0; i < count && !rc; i++) {
    const void *p = (const char *)items + i * size;
    if (!(rc = node(v, p, size, align))) rc = fn(v, p);
  }
  v->depth--;
  return rc;
}

/* ---------------- building ---------------- */

int cxr_str_set(cxr_heap *h, cxr_str *s, const char *p, size_t len) {
  if (!h || !s || (!p && len) || len == SIZE_MAX) return CXR_EINVAL;
  char *d = cxr_heap_alloc(h, len + 1);
  if (!d) return cxr_last_error() ? cxr_last_error() : CXR_ENOMEM;
  if (len) memcpy(d, p, len);
  d[len] = 0;
  s->ptr = d;
  s->len = len;
  return 0;
}

int cxr_str_setz(cxr_heap *h, cxr_str *s, const char *z) {
  if (!z) return CXR_EINVAL;
  return cxr_str_set(h, s, z, strlen(z));
}

int cxr_bytes_set(cxr_heap *h, cxr_bytes *b, const void *p, size_t len) {
  if (!b) return CXR_EINVAL;
  cxr_str s;
  int rc = cxr_str_set(h, &s, p, len);
  if (rc) return rc;
  b->ptr = (const uint8_t *)s.ptr;
  b->len = len;
  return 0;
}

void *cxr_vec_alloc(cxr_heap *h, size_t elem, uint64_t n) {
  if (!h || elem == 0) return cxr__fail_null(CXR_EINVAL);
  /* An empty list still gets a block (of one element): NULL then always means failure, so
   * `if (!CXR_VEC_ALLOC(h, v, n)) return CXR_ENOMEM;` holds for any n, and the generated
   * free gives the block back with the message. Nothing reads it while count is 0. */
  if (n == 0) n = 1;
  if (n > SIZE_MAX / elem) return cxr__fail_null(CXR_ENOMEM);
  void *p = cxr_heap_alloc(h, (size_t)(n * elem));
  if (!p) return NULL;
  memset(p, 0, (size_t)(n * elem));
  return p;
}

/* ---------------- copy, free, equal ---------------- */

/* The copies read each length, count and pointer of the source once (CXR__LOAD in idl.h),
 * and write through the blocks they allocated, never through a pointer read back from the
 * destination (which may be a peer's heap too). */

/* With a range (_copy_in), each block a copy is about to read, at the address and count it
 * read once, must lie inside r: a pointer its writer swapped after validation could reach
 * any memory the copying process maps (the server's own heap, say) and copy it out. And the
 * copy reads at most r's length in all: see cxr__cpsrc. */
int cxr__cp_in(cxr__cpsrc *src, const void *p, uint64_t count, size_t elem, size_t align) {
  if (!src || count == 0) return 0;
  uintptr_t a = (uintptr_t)p, lo = (uintptr_t)src->r.p;
  if (!lo || src->r.len > UINTPTR_MAX - lo) return CXR_EBADPTR;
  uintptr_t hi = lo + src->r.len;
  if (elem == 0) elem = 1;
  if (a < lo || a >= hi || count > (hi - a) / elem) return CXR_EBADPTR;
  if (align > 1 && (a & (align - 1))) return CXR_EBADPTR;
  uint64_t n = count * elem; /* no overflow: at most hi - a */
  if (n > src->left) return CXR_EPROTO;
  src->left -= n;
  return 0;
}

void *cxr__cp_mem(cxr_heap *to, const void *src, size_t n) {
  if (n == 0) return NULL;
  void *d = cxr_heap_alloc(to, n);
  if (d) memcpy(d, src, n);
  return d;
}

void *cxr__cp_array(cxr_heap *to, const void *src, uint64_t count, size_t elem) {
  if (elem == 0 || count > SIZE_MAX / elem) return cxr__fail_null(CXR_ENOMEM);
  return cxr__cp_mem(to, src, (size_t)(count * elem));
}

int cxr__cp_str(cxr_heap *to, cxr_str *d, const cxr_str *s, cxr__cpsrc *src) {
  const char *ptr = CXR__LOAD(&s->ptr);
  uint64_t len = CXR__LOAD(&s->len);
  d->ptr = NULL;
  d->len = 0;
  if (!len) return 0;
  int rc = cxr__cp_in(src, ptr, len, 1, 1);
  return rc ? rc : cxr_str_set(to, d, ptr, len);
}

int cxr__cp_bytes(cxr_heap *to, cxr_bytes *d, const cxr_bytes *s, cxr__cpsrc *src) {
  const uint8_t *ptr = CXR__LOAD(&s->ptr);
  uint64_t len = CXR__LOAD(&s->len);
  d->ptr = NULL;
  d->len = 0;
  if (!len) return 0;
  int rc = cxr__cp_in(src, ptr, len, 1, 1);
  return rc ? rc : cxr_bytes_set(to, d, ptr, len);
}

int cxr__cp_strs(cxr_heap *to, cxr_vec_str *d, const cxr_vec_str *s, cxr__cpsrc *src) {
  const cxr_str *items = CXR__LOAD(&s->items);
  uint64_t n = CXR__LOAD(&s->count);
  d->items = NULL;
  d->count = 0;
  if (!n) return 0;
  int rc = cxr__cp_in(src, items, n, sizeof *items, _Alignof(cxr_str));
  if (rc) return rc;
  cxr_str *out = cxr_vec_alloc(to, sizeof *out, n);
  if (!out) return CXR_ENOMEM;
  d->items = out;
  d->count = n;
  for (uint64_t i = 0; i < n; i++) {
    rc = cxr__cp_str(to, &out[i], &items[i], src);
    if (rc) return rc;
  }
  return 0;
}

int cxr__cp_bytess(cxr_heap *to, cxr_vec_bytes *d, const cxr_vec_bytes *s, cxr__cpsrc *src) {
  const cxr_bytes *items = CXR__LOAD(&s->items);
  uint64_t n = CXR__LOAD(&s->count);
  d->items = NULL;
  d->count = 0;
  if (!n) return 0;
  int rc = cxr__cp_in(src, items, n, sizeof *items, _Alignof(cxr_bytes));
  if (rc) return rc;
  cxr_bytes *out = cxr_vec_alloc(to, sizeof *out, n);
  if (!out) return CXR_ENOMEM;
  d->items = out;
  d->count = n;
  for (uint64_t i = 0; i < n; i++) {
    rc = cxr__cp_bytes(to, &out[i], &items[i], src);
    if (rc) return rc;
  }
  return 0;
}

/* The blocks a _free walk is inside of (its ancestors), a set of at most CXR__MAX_DEPTH:
 * open addressing at half load, 2 * free_levels slots. Removal is last in, first out
 * (free_leave), which gives back the table as it was before that insertion, so
 * clearing the slot is enough. The table is allocated at a thread's first _free with room
 * for FREE_LEVELS_MIN levels and doubled when a walk goes deeper (to CXR__MAX_DEPTH), so
 * that a thread that never frees a message costs nothing: a static table was 72 KiB of TLS
 * in every thread of every process linking cxrpc. It stays with the thread (thread_exit
 * frees it), or goes at the end of each walk if there is no key to free it by. */
#define FREE_LEVELS_MIN 64u
_Static_assert((CXR__MAX_DEPTH & (CXR__MAX_DEPTH - 1)) == 0 && CXR__MAX_DEPTH >= FREE_LEVELS_MIN,
               "the table's levels, FREE_LEVELS_MIN doubled up to CXR__MAX_DEPTH, are powers of 2");
static _Thread_local unsigned free_depth;
static _Thread_local uint64_t free_budget; /* bytes of blocks the top-level _free may enter */
static _Thread_local uint64_t free_entered;  /* blocks entered by this thread (tests) */

static uint64_t free_refused; /* walks cut short: logged at the 1st, 2nd, 4th... */
static uint64_t free_nomem;   /* tables not allocated: logged likewise */

/* The slot of p in anc (of nslots), or of the empty slot where it would go. */
static unsigned free_anc_find(const void *const *anc, unsigned nslots, const void *p) {
  uint64_t x = (uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ull;
  unsigned i = (unsigned)(x >> 40) & (nslots - 1); /* nslots: a power of 2 */
  while (anc[i] != NULL && anc[i] != p) i = (i + 1) & (nslots - 1);
  return i;
}

/* Room for one level more: the first table, or one of twice the levels holding the walk's
 * ancestors. False (logged) when out of memory: the caller then enters nothing more. */
static bool free_anc_grow(void) {
  unsigned n = free_levels ? 2 * free_levels : FREE_LEVELS_MIN;
  if (n > CXR__MAX_DEPTH) n = CXR__MAX_DEPTH;
  const void **anc = calloc(1, 2 * (size_t)n * sizeof *anc + n * sizeof *free_anc_slot);
  if (anc == NULL) {
    if (cxr__log_due(__atomic_add_fetch(&free_nomem, 1, __ATOMIC_RELAXED)))
      CXR_ERR("idl: a _free left a block %u level(s) down allocated: out of memory for its "
              "walk's table of %u levels", free_depth, n);
    return false;
  }
  uint16_t *slot = (uint16_t *)(anc + 2 * n);
  for (unsigned l = 0; l < free_depth; l++) {
    const void *p = free_anc[free_anc_slot[l]];
    slot[l] = (uint16_t)free_anc_find(anc, 2 * n, p);
    anc[slot[l]] = p;
  }
  if (free_levels == 0) free_anc_kept = thread_exit_armed();
  free(free_anc);
  free_anc = anc;
  free_anc_slot = slot;
  free_levels = n;
  return true;
}

/* Gives the table back after a walk when no thread_exit would. */
static void free_anc_done(void) {
  if (free_depth == 0 && free_levels != 0 && !free_anc_kept) free_anc_drop();
}

/* Each block is entered once: it must still be allocated (a shared subtree met again was
 * freed after its first walk) and not be an ancestor (a cycle), so the work is the graph's
 * distinct blocks and their items, whatever its paths. Items must fit in their block, so
 * the bytes entered are at most the heap's size: a tree never reaches that bound, which
 * stays for blocks another thread allocates at a freed address during the walk. */
bool cxr__free_enter(cxr_heap *h, const void *p, uint64_t count, size_t size) {
  if (free_depth == 0) free_budget = cxr_heap_size(h);
  size_t usable = p != NULL && size != 0 ? cxr_heap_usable_size(h, p) : 0;
  if (usable != 0 && free_depth == free_levels && free_levels < CXR__MAX_DEPTH &&
      !free_anc_grow())
    return false;
  unsigned slot = usable ? free_anc_find(free_anc, 2 * free_levels, p) : 0;
  if (usable == 0 || count > usable / size || usable > free_budget ||
      free_depth >= CXR__MAX_DEPTH || free_anc[slot] != NULL) {
    if (p != NULL && cxr__log_due(__atomic_add_fetch(&free_refused, 1, __ATOMIC_RELAXED)))
      CXR_WARN("idl: a _free left %llu item(s) at %p: not an allocated block of the heap "
               "(freed already: a shared subtree?), an ancestor (a cycle?) or past the walk's "
               "bounds (a graph rewritten by a peer?)", (unsigned long long)count, p);
    free_anc_done();
    return false;
  }
  free_budget -= usable;
  free_anc[slot] = p;
  free_anc_slot[free_depth++] = (uint16_t)slot;
  free_entered++;
  return true;
}

static void free_leave(void) {
  free_anc[free_anc_slot[--free_depth]] = NULL;
  free_anc_done();
}

uint64_t cxr__free_entered(void) { return free_entered; }

/* The leaves (string bodies, scalar arrays) of the thread's top-level _free, freed once at
 * its end, after every block it enters (free_pend_flush). Freed as the walk met them, a
 * leaf that a peer pointed at a block the walk had still to enter (a later sibling's
 * subtree, validation allows it) freed it first: its walk then found it freed, logged and
 * leaked what it held. At the end, a leaf naming a block the walk entered finds it freed
 * (cxr__heap_free_shared leaves it). The set is validation's visited set (visit), which
 * never runs during a _free: the same small table, then the thread's larger block, given
 * back when over VSET_KEEP_BYTES (cxr__v_end). It costs a probe per leaf, as the ancestor
 * table did, and no walk more; each leaf named by several fields is freed once. */
/* True when p waits in the set (added now or before). */
static bool free_pend_add(void *p) {
  if (free_pend == NULL) {
    if ((free_pend = calloc(1, sizeof *free_pend)) == NULL) return false;
    free_pend->set = free_pend->small;
    free_pend->cap = sizeof free_pend->small / sizeof free_pend->small[0];
  }
  return visit(free_pend, (uintptr_t)p) >= 0;
}

static void free_pend_flush(cxr_heap *h) {
  cxr__vctx *v = free_pend;
  if (v == NULL) return;
  for (size_t i = 0; v->n != 0 && i < v->cap; i++) {
    if (v->set[i] == 0) continue;
    cxr__heap_free_shared(h, (void *)v->set[i]);
    v->set[i] = 0; /* the table is empty again when the loop ends */
    v->n--;
  }
  if (v->set != v->small && v->cap * sizeof *v->set > vset_keep_bytes()) {
    free(v->set); /* back to the small table (which grow left as it was) */
    memset(v->small, 0, sizeof v->small);
    v->set = v->small;
    v->cap = sizeof v->small / sizeof v->small[0];
  }
  if (!thread_exit_armed()) {
    if (v->set != v->small) free(v->set);
    free(v);
    free_pend = NULL;
  }
}

void cxr__free_exit(cxr_heap *h, void *p) {
  free_leave();
  cxr_heap_free(h, p);
  if (free_depth == 0) free_pend_flush(h);
}

void cxr__free_msg(cxr_heap *h, void *p, size_t size, void (*fin)(cxr_heap *, void *)) {
  if (p == NULL || !cxr__free_enter(h, p, 1, size)) return;
  fin(h, p);
  cxr__free_exit(h, p);
}

static uint64_t free_cut; /* abandoned walks found: logged at the 1st, 2nd, 4th... */

/* A walk found still under way by a top-level _free was abandoned: cxr_sandbox_run cut a
 * handler's _free short at a fault (a peer shrank its heap under it, say). Its ancestors
 * and depth would make every later _free of the thread a part of it, whose leaves then
 * wait for an end that never comes (leaked). Its own leaves are dropped, not freed: their
 * heap may be the one that faulted, and the walk's blocks were not all freed. */
static void free_abandoned(void) {
  size_t left = free_pend != NULL ? free_pend->n : 0;
  while (free_depth != 0) free_anc[free_anc_slot[--free_depth]] = NULL;
  if (free_pend != NULL) {
    memset(free_pend->set, 0, free_pend->cap * sizeof *free_pend->set);
    free_pend->n = 0;
  }
  if (cxr__log_due(__atomic_add_fetch(&free_cut, 1, __ATOMIC_RELAXED)))
    CXR_WARN("idl: a _free cut short (a fault in a sandboxed handler?) left %zu string(s) or "
             "array(s) allocated; the thread's next _free starts afresh", left);
}

void cxr__free_top(cxr_heap *h, void *p, size_t size, void (*fin)(cxr_heap *, void *)) {
  if (free_depth != 0) free_abandoned();
  cxr__free_msg(h, p, size, fin);
}

/* Inside a walk, a leaf waits for its end (free_pend_add). Only when the set cannot grow
 * (out of memory) is it freed at once, as before: then it is left to its block's own free
 * if the walk is inside of that block (freed here, the walk would go on reading it freed
 * and free it again), and one naming a block yet to be entered frees it first. */
void cxr__free_leaf(cxr_heap *h, void *p) {
  if (p == NULL) return;
  if (free_depth != 0 && free_pend_add(p)) return;
  if (free_depth != 0 && free_anc[free_anc_find(free_anc, 2 * free_levels, p)] == p) return;
  cxr__heap_free_shared(h, p);
}

/* Each pointer and the count read once (the graph may be a peer's to change). The strings
 * are leaves that other fields may name too (cxr__free_leaf). */
void cxr__free_strs(cxr_heap *h, cxr_vec_str *a) {
  cxr_str *items = CXR__LOAD(&a->items);
  uint64_t count = CXR__LOAD(&a->count);
  if (items == NULL || !cxr__free_enter(h, items, count, sizeof *items)) return;
  for (uint64_t i = 0; i < count; i++) cxr__free_leaf(h, (void *)CXR__LOAD(&items[i].ptr));
  cxr__free_exit(h, items);
}

void cxr__free_bytess(cxr_heap *h, cxr_vec_bytes *a) {
  cxr_bytes *items = CXR__LOAD(&a->items);
  uint64_t count = CXR__LOAD(&a->count);
  if (items == NULL || !cxr__free_enter(h, items, count, sizeof *items)) return;
  for (uint64_t i = 0; i < count; i++) cxr__free_leaf(h, (void *)CXR__LOAD(&items[i].ptr));
  cxr__free_exit(h, items);
}

bool cxr__eq_mem(const void *a, uint64_t alen, const void *b, uint64_t blen) {
  return alen == blen && (alen == 0 || memcmp(a, b, alen) == 0);
}

bool cxr__eq_strs(const cxr_vec_str *a, const cxr_vec_str *b) {
  if (a->count != b->count) return false;
  for (uint64_t i = 0; i < a->count; i++)
    if (!cxr__eq_mem(a->items[i].ptr, a->items[i].len, b->items[i].ptr, b->items[i].len))
      return false;
  return true;
}

bool cxr__eq_bytess(const cxr_vec_bytes *a, const cxr_vec_bytes *b) {
  if (a->count != b->count) return false;
  for (uint64_t i = 0; i < a->count; i++)
    if (!cxr__eq_mem(a->items[i].ptr, a->items[i].len, b->items[i].ptr, b->items[i].len))
      return false;
  return true;
}

/* ---------------- ranges ---------------- */

void cxr_ranges_init(cxr_ranges *r) {
  if (r) memset(r, 0, sizeof *r);
}

int cxr_ranges_add(cxr_ranges *r, const void *p, size_t len) {
  if (!r) return CXR_EINVAL;
  if (len == 0) return 0;
  if (r->count == r->cap) {
    size_t ncap = r->cap ? r->cap * 2 : 16;
    cxr_range *n = realloc(r->items, ncap * sizeof *n);
    if (!n) return CXR_ENOMEM;
    r->items = n;
    r->cap = ncap;
  }
  r->items[r->count].p = p;
  r->items[r->count].len = len;
  r->count++;
  return 0;
}

static int cmp_range(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)((const cxr_range *)a)->p, y = (uintptr_t)((const cxr_range *)b)->p;
  return x < y ? -1 : x > y;
}

void cxr_ranges_merge(cxr_ranges *r) {
  if (!r || r->count < 2) return;
  qsort(r->items, r->count, sizeof *r->items, cmp_range);
  size_t o = 0;
  for (size_t i = 1; i < r->count; i++) {
    uintptr_t end = (uintptr_t)r->items[o].p + r->items[o].len;
    uintptr_t s = (uintptr_t)r->items[i].p, e = s + r->items[i].len;
    if (s <= end) {
      if (e > end) r->items[o].len = e - (uintptr_t)r->items[o].p;
    } else {
      r->items[++o] = r->items[i];
    }
  }
  r->count = o + 1;
}

size_t cxr_ranges_bytes(const cxr_ranges *r) {
  size_t n = 0;
  for (size_t i = 0; r && i < r->count; i++) n += r->items[i].len;
  return n;
}

void cxr_ranges_free(cxr_ranges *r) {
  if (!r) return;
  free(r->items);
  memset(r, 0, sizeof *r);
}

int cxr__rg_strs(cxr_ranges *r, const cxr_vec_str *a) {
  int rc = cxr_ranges_add(r, a->items, a->count * sizeof(cxr_str));
  for (uint64_t i = 0; !rc && i < a->count; i++)
    rc = cxr_ranges_add(r, a->items[i].ptr, a->items[i].len);
  return rc;
}

int cxr__rg_bytess(cxr_ranges *r, const cxr_vec_bytes *a) {
  int rc = cxr_ranges_add(r, a->items, a->count * sizeof(cxr_bytes));
  for (uint64_t i = 0; !rc && i < a->count; i++)
    rc = cxr_ranges_add(r, a->items[i].ptr, a->items[i].len);
  return rc;
}

/* ---------------- ids, calls ---------------- */

uint32_t cxr_method_id(const char *s) {
  uint32_t h = 2166136261u;
  for (; s && *s; s++) {
    h ^= (uint8_t)*s;
    h *= 16777619u;
  }
  return h;
}

/* Each zero field takes its default: a caller who sets max_len alone means "the defaults,
 * with this max_len", not max_nodes 0 and max_depth 0 (every graph refused). */
const cxr_limits *cxr__limits(const cxr_limits *l, cxr_limits *tmp) {
  if (l && l->max_depth && l->max_nodes && l->max_len) return l;
  cxr_limits_init(tmp);
  if (l && l->max_depth) tmp->max_depth = l->max_depth;
  if (l && l->max_nodes) tmp->max_nodes = l->max_nodes;
  if (l && l->max_len) tmp->max_len = l->max_len;
  return tmp;
}

/*
 * cxrpc/shm.h: the address window, heaps in shared files mapped at the same virtual
 * address in every process, a multi-process allocator, the pod registry and leases.
 *
 * All functions are thread-safe. Functions returning int give 0 or a negative CXR_E*;
 * those returning a pointer give NULL with the reason in cxr_last_error().
 */
#ifndef CXRPC_SHM_H
#define CXRPC_SHM_H

#include <cxrpc/base.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the runtime: window, root, pod (the one documented global object) ---- */

typedef struct cxr_init_opts {
  const char *root;       /* pod root folder; default $CXRPC_ROOT or /dev/shm/cxrpc */
  uintptr_t window_base;  /* default from $CXRPC_WINDOW ("0xLO-0xHI") or 0x600000000000 */
  size_t window_size;     /* default 0x100000000000 (16 TiB) */
  unsigned pod;           /* slice of the window this pod owns; CXR_POD_DEFAULT (what
                             cxr_init_opts_init sets): $CXRPC_POD, or 0 */
  unsigned pod_slices;    /* how many slices the window is cut into; default 16 */
} cxr_init_opts;

/* cxr_init_opts.pod: take $CXRPC_POD (or 0). Any other value, 0 included, is that pod. */
#define CXR_POD_DEFAULT 0xffffffffu

void cxr_init_opts_init(cxr_init_opts *o);
/* Reserves the window (PROT_NONE, via libpmem2) and checks the root. Idempotent: later
 * calls with other options return CXR_EBUSY. Every other call runs it with defaults. */
int cxr_init(const cxr_init_opts *o);
const char *cxr_root(void);
int cxr_window(uintptr_t *base, size_t *size);
/* The address range of pod `pod`'s slice (heaps of that pod live only there). */
int cxr_pod_slice(unsigned pod, uintptr_t *base, size_t *size);

/* ---- heaps ---- */

typedef struct cxr_heap cxr_heap;

typedef struct cxr_heap_opts {
  unsigned mode;       /* permissions of the heap file; default 0600 */
  uintptr_t addr;      /* fixed address inside the window; 0 = the registry picks one */
  const char *path;    /* explicit file or DAX device; default <root>/<name>.heap */
  bool keep_orphans;   /* when an allocating process dies, keep the blocks it still owned
                          (default false: they come back to the heap with its lease) */
  bool remove_on_last_close; /* remove the file and name when the last holder closes or
                                dies (default false: the heap persists until unlinked) */
} cxr_heap_opts;

void cxr_heap_opts_init(cxr_heap_opts *o);

int cxr_heap_create(cxr_heap **h, const char *name, size_t size, const cxr_heap_opts *o);
int cxr_heap_open(cxr_heap **h, const char *name);
/* Unmaps and drops this process's lease; the last holder's close removes the file once the
 * name is unlinked (or for heaps created with remove-on-last-close semantics). */
void cxr_heap_close(cxr_heap *h);
/* Removes the name; the file goes when the last holder closes or dies. */
int cxr_heap_unlink(const char *name);

void *cxr_heap_alloc(cxr_heap *h, size_t size);                 /* 16-byte aligned */
void *cxr_heap_alloc_aligned(cxr_heap *h, size_t align, size_t size);
void *cxr_heap_alloc_pages(cxr_heap *h, size_t size);           /* page-aligned, whole pages:
                                                                   can be sealed */
void *cxr_heap_realloc(cxr_heap *h, void *p, size_t size);
void cxr_heap_free(cxr_heap *h, void *p);                        /* NULL is a no-op */
size_t cxr_heap_usable_size(const cxr_heap *h, const void *p);
/* Internal (idl's _free): cxr_heap_free of a block other references may have freed before
 * (string bodies and arrays two fields share): p inside the heap that is no allocated block
 * is left without a log or an error; p outside it is logged as by cxr_heap_free. */
void cxr__heap_free_shared(cxr_heap *h, void *p);
/* Transfers ownership of a block to the calling process (so it survives its allocator). */
int cxr_heap_adopt(cxr_heap *h, void *p);

bool cxr_heap_contains(const cxr_heap *h, const void *p, size_t len);
void *cxr_heap_base(const cxr_heap *h);
size_t cxr_heap_size(const cxr_heap *h);
const char *cxr_heap_name(const cxr_heap *h);

/* One pointer-sized slot in the header, so processes find a heap's first object. */
int cxr_heap_set_root(cxr_heap *h, void *p);
void *cxr_heap_get_root(const cxr_heap *h);

/* Real cache-line flush on DAX (libpmem2); elsewhere (tmpfs too) an msync of the pages. */
int cxr_heap_persist(cxr_heap *h, const void *p, size_t len);

typedef struct cxr_heap_stats {
  size_t size;           /* bytes in the heap file */
  size_t capacity;       /* bytes available to allocations */
  size_t used;           /* bytes held by live allocations (rounded to their class) */
  size_t cached;         /* free bytes held in thread caches */
  uint64_t allocs, frees;
  unsigned holders;      /* processes holding a lease */
  uint64_t generation;
  uintptr_t addr;
} cxr_heap_stats;
/* C cannot have a function and a type both named cxr_heap_stats: the function is
 * cxr_heap_get_stats, and cxr_heap_stats(h, &st) (a function-like macro) still calls it,
 * while `cxr_heap_stats st;` still names the type. */
int cxr_heap_get_stats(const cxr_heap *h, cxr_heap_stats *out);
#define cxr_heap_stats(h, out) cxr_heap_get_stats((h), (out))

/* Renews this holder's lease. Allocation slow paths renew it too; a process on another
 * host of the pod (where its pid cannot be checked) must renew at least every
 * CXRPC_LEASE_MS (default 10 s) or be treated as dead. */
int cxr_heap_renew(cxr_heap *h);

/* Recovers holders whose process died: their caches, half-done operations and (unless
 * keep_orphans) the blocks they owned. Returns how many holders were recovered (>= 0). */
int cxr_heap_reap(cxr_heap *h);

/* ---- the pod registry, read from outside (cxrpcctl) ---- */

typedef struct cxr_heap_info {
  char name[CXR_NAME_MAX + 1];
  char path[256];
  uintptr_t addr;
  size_t size, used;
  unsigned holders, dead_holders;
  uint64_t generation;
  int64_t lease_age_ns;   /* since the least recent renewal among holders */
} cxr_heap_info;

/* Fills up to `max` entries; *n gets how many heaps exist. */
int cxr_registry_list(cxr_heap_info *out, size_t max, size_t *n);

#ifdef __cplusplus
}
#endif
#endif

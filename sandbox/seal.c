/*
 * Seal tables: the sender's seal/release/flush/cancel and the receiver's check/done.
 *
 * Only the receiver writes the shared table (it maps the memfd read-write before sealing
 * the file with F_SEAL_FUTURE_WRITE; the kernel then refuses every writable mapping, write()
 * or mprotect(PROT_WRITE) of it by the sender). The sender keeps its own view of each live
 * seal in private memory and never trusts the shared table for addresses, only for the
 * state word that says "done".
 *
 * Readers (the sender, cxrpcd) do not trust the receiver either: they take a table only in
 * a memfd whose size is sealed, read its header once and use only the checked copy, so
 * whatever the receiver writes later cannot lead them outside their mapping.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sandbox/internal.h"
#include "shm/log.h"

#define MAX_SLOTS CXR_SEAL_SLOTS_MAX
#define GEN_MAX 0xfffu
#define ID(g, s) ((cxr_seal_id)((g) << 20 | (s)))
#define ID_SLOT(id) ((id) & (MAX_SLOTS - 1))
#define ID_GEN(id) ((id) >> 20)
#define STATE(g, s) (((uint64_t)(g) << 8) | (uint64_t)(s))
/* The seals create puts on a table's memfd, and what attach and cxrpcd demand of one: no
 * writable view but the receiver's own, and a size nobody can change (a shrink would make
 * every reader's next access fault). */
#define CXR__SEAL_TABLE_SEALS (F_SEAL_FUTURE_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

typedef struct pend {
  uint64_t a, n;
} pend;

struct cxr_seal_table {
  bool sender;
  int fd;
  void *mem;
  size_t bytes;
  unsigned slots;
  cxr__seal_rec *recs;
  pthread_mutex_t mu;
  /* sender's private bookkeeping */
  uint32_t *gen;
  uint64_t *s_addr, *s_len; /* s_len 0: slot free */
  uint32_t *freel;
  unsigned nfree;
  uint32_t *live, *live_pos;
  unsigned nlive;
  pend *pend;
  unsigned npend, batch;
  uint64_t plo, phi; /* hull of the pending ranges */
  bool peer_dead;
  /* receiver: the peer's fields are written under peer_lock (set_peer, reset) and read
   * under it by checks, which may run on many threads while another sets the peer: a
   * check never uses a maps descriptor that is being closed (or its number, reused). */
  pthread_rwlock_t peer_lock;
  int peer_pid, maps_fd, sup_sock;
  uint64_t heap_lo, heap_hi, dev, ino, heap_off;
  /* counters */
  _Atomic uint64_t n_seals, n_releases, n_sweeps, n_mprotects, n_checks, n_not_sealed;
};

void cxr_seal_opts_init(cxr_seal_opts *o) {
  if (!o) return;
  memset(o, 0, sizeof *o);
  o->slots = 1024;
  o->release_batch = 1024;
}

/* Checks a private copy of a table header against `bytes`, the size of the file or mapping
 * it came from. */
static int hdr_valid(const cxr__seal_hdr *h, size_t bytes) {
  if (h->magic != CXR__SEAL_MAGIC) return CXR_EBADMAGIC;
  if (h->version != CXR__SEAL_VERSION) return CXR_EVERSION;
  if (h->slots == 0 || h->slots > MAX_SLOTS || h->bytes != cxr__seal_bytes(h->slots) ||
      h->bytes > bytes)
    return CXR_ECORRUPT;
  return 0;
}

int cxr__seal_hdr_ok(const void *mem, size_t bytes, uint32_t *slots) {
  if (!mem || bytes < sizeof(cxr__seal_hdr)) return CXR_EINVAL;
  /* Each field read once: the table's maker keeps a writable mapping and can rewrite the
   * header between our check and a second read (a raised slot count would then lead the
   * reader past its mapping). Only the copy is checked, and only its count handed out. */
  const cxr__seal_hdr *src = mem;
  cxr__seal_hdr h = {
      .magic = __atomic_load_n(&src->magic, __ATOMIC_RELAXED),
      .version = __atomic_load_n(&src->version, __ATOMIC_RELAXED),
      .slots = __atomic_load_n(&src->slots, __ATOMIC_RELAXED),
      .bytes = __atomic_load_n(&src->bytes, __ATOMIC_RELAXED),
  };
  int rc = hdr_valid(&h, bytes);
  if (rc == 0 && slots) *slots = h.slots;
  return rc;
}

int cxr__seal_fd_sealed(int fd) {
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) return errno == EINVAL ? CXR_ENOTSEALED : cxr__from_errno(errno); /* no memfd */
  return (seals & CXR__SEAL_TABLE_SEALS) == CXR__SEAL_TABLE_SEALS ? 0 : CXR_ENOTSEALED;
}

bool cxr__seal_overlaps_active(const void *mem, size_t bytes, uint64_t a, uint64_t n) {
  uint32_t slots;
  if (cxr__seal_hdr_ok(mem, bytes, &slots) != 0) return false;
  const cxr__seal_rec *r = cxr__seal_recs(mem);
  uint64_t e = a + n < a ? UINT64_MAX : a + n;
  for (uint32_t i = 0; i < slots; i++) { /* the checked count, never the header's again */
    uint64_t st = atomic_load_explicit(&r[i].state, memory_order_acquire) & 0xff;
    if (st != CXR__SEAL_ACTIVE && st != CXR__SEAL_CLAIM) continue;
    uint64_t ra = atomic_load_explicit(&r[i].addr, memory_order_relaxed);
    uint64_t rn = atomic_load_explicit(&r[i].len, memory_order_relaxed);
    if (st == CXR__SEAL_CLAIM && rn == 0) return true; /* being written: be safe */
    if (ra < e && a < ra + rn) return true;
  }
  return false;
}

static cxr_seal_table *table_new(bool sender, unsigned slots) {
  cxr_seal_table *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  t->sender = sender;
  t->fd = t->maps_fd = t->sup_sock = -1;
  t->slots = slots;
  t->bytes = cxr__seal_bytes(slots);
  pthread_mutex_init(&t->mu, NULL);
  pthread_rwlock_init(&t->peer_lock, NULL);
  return t;
}

static void table_free(cxr_seal_table *t) {
  if (t->mem && t->mem != MAP_FAILED) munmap(t->mem, t->bytes);
  if (t->fd >= 0) close(t->fd);
  if (t->maps_fd >= 0) close(t->maps_fd);
  if (t->sup_sock >= 0) close(t->sup_sock);
  free(t->gen), free(t->s_addr), free(t->s_len), free(t->freel);
  free(t->live), free(t->live_pos), free(t->pend);
  pthread_mutex_destroy(&t->mu);
  pthread_rwlock_destroy(&t->peer_lock);
  free(t);
}

static void *map_at(uintptr_t addr, size_t bytes, int prot, int fd) {
  int flags = MAP_SHARED | (addr ? MAP_FIXED_NOREPLACE : 0);
  void *m = mmap((void *)addr, bytes, prot, flags, fd, 0);
  if (m != MAP_FAILED && addr && (uintptr_t)m != addr) { /* old kernels ignore NOREPLACE */
    munmap(m, bytes);
    errno = EEXIST;
    return MAP_FAILED;
  }
  return m;
}

int cxr_seal_table_create(cxr_seal_table **out, const cxr_seal_opts *o) {
  if (!out) return CXR_EINVAL;
  *out = NULL;
  cxr_seal_opts d;
  cxr_seal_opts_init(&d);
  if (!o) o = &d;
  if (o->slots == 0 || o->slots > MAX_SLOTS || (o->addr % CXR__PAGE)) return CXR_EINVAL;
  cxr_seal_table *t = table_new(false, o->slots);
  if (!t) return CXR_ENOMEM;
  int rc = CXR_EIO;
  t->fd = memfd_create("cxrpc-seals", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (t->fd < 0 || ftruncate(t->fd, (off_t)t->bytes) != 0) goto fail_errno;
  t->mem = map_at(o->addr, t->bytes, PROT_READ | PROT_WRITE, t->fd);
  if (t->mem == MAP_FAILED) goto fail_errno;
  cxr__seal_hdr *h = t->mem;
  h->magic = CXR__SEAL_MAGIC;
  h->version = CXR__SEAL_VERSION;
  h->slots = t->slots;
  h->bytes = t->bytes;
  t->recs = cxr__seal_recs(t->mem);
  /* From here on nobody can get a writable view of the file but our mapping above. */
  if (fcntl(t->fd, F_ADD_SEALS, CXR__SEAL_TABLE_SEALS)) goto fail_errno;
  *out = t;
  return 0;
fail_errno:
  rc = cxr__from_errno(errno);
  CXR_ERR("seal table: %s", strerror(errno));
  table_free(t);
  return rc;
}

int cxr_seal_table_fd(const cxr_seal_table *t) { return t ? t->fd : CXR_EINVAL; }

int cxr_seal_table_attach(cxr_seal_table **out, int fd, const cxr_seal_opts *o) {
  if (!out || fd < 0) return CXR_EINVAL;
  *out = NULL;
  cxr_seal_opts d;
  cxr_seal_opts_init(&d);
  if (!o) o = &d;
  /* The pending releases' array is allocated whole (16 bytes each): a batch of up to 2^32
   * would ask for 64 GiB up front (and abort under ASan instead of failing). */
  if (o->release_batch == 0 || o->release_batch > CXR_SEAL_SLOTS_MAX || (o->addr % CXR__PAGE))
    return CXR_EINVAL;
  struct stat st;
  if (fstat(fd, &st) != 0) return cxr__from_errno(errno);
  if (st.st_size < (off_t)sizeof(cxr__seal_hdr) || st.st_size > (off_t)cxr__seal_bytes(MAX_SLOTS))
    return CXR_ECORRUPT;
  /* One copy of the header, read from the file (nothing is mapped yet that a shrink could
   * make fault); from here on only this copy's slot count and size are used. */
  cxr__seal_hdr h;
  ssize_t got = pread(fd, &h, sizeof h, 0);
  if (got < 0) return errno == EBADF ? CXR_EACCES : cxr__from_errno(errno); /* write-only */
  if (got != (ssize_t)sizeof h) return CXR_ECORRUPT;
  int rc = hdr_valid(&h, (size_t)st.st_size);
  if (rc) return rc;
  /* The table stays mapped as long as we hold it: its maker must not be able to shrink it
   * under us (every later read would fault). Sealed, the size is fixed; it may have changed
   * before the seals, so it is looked at again. */
  if ((rc = cxr__seal_fd_sealed(fd)) != 0) return rc;
  if (fstat(fd, &st) != 0) return cxr__from_errno(errno);
  if ((uint64_t)st.st_size < h.bytes) return CXR_ECORRUPT;
  unsigned slots = h.slots;
  size_t bytes = h.bytes;
  void *m = map_at(o->addr, bytes, PROT_READ, fd);
  if (m == MAP_FAILED) return cxr__from_errno(errno);
  cxr_seal_table *t = table_new(true, slots);
  if (!t) {
    munmap(m, bytes);
    return CXR_ENOMEM;
  }
  t->mem = m;
  t->bytes = bytes;
  t->recs = cxr__seal_recs(m);
  t->batch = o->release_batch;
  t->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  t->gen = calloc(slots, sizeof *t->gen);
  t->s_addr = calloc(slots, sizeof *t->s_addr);
  t->s_len = calloc(slots, sizeof *t->s_len);
  t->freel = calloc(slots, sizeof *t->freel);
  t->live = calloc(slots, sizeof *t->live);
  t->live_pos = calloc(slots, sizeof *t->live_pos);
  t->pend = calloc(t->batch, sizeof *t->pend);
  if (t->fd < 0 || !t->gen || !t->s_addr || !t->s_len || !t->freel || !t->live ||
      !t->live_pos || !t->pend) {
    table_free(t);
    return CXR_ENOMEM;
  }
  for (unsigned i = 0; i < slots; i++) t->freel[i] = slots - 1 - i;
  t->nfree = slots;
  t->plo = UINT64_MAX;
  *out = t;
  return 0;
}

/* ---- sender ---- */

static int cmp_pend(const void *x, const void *y) {
  const pend *a = x, *b = y;
  return a->a < b->a ? -1 : a->a > b->a;
}

/* Restores write access to every pending range, merged where they touch. */
static int flush_locked(cxr_seal_table *t) {
  if (t->npend == 0) return 0;
  if (t->npend > 1) qsort(t->pend, t->npend, sizeof *t->pend, cmp_pend);
  int rc = 0;
  unsigned keep = 0;
  for (unsigned i = 0; i < t->npend;) {
    uint64_t a = t->pend[i].a, e = a + t->pend[i].n;
    unsigned j = i + 1;
    while (j < t->npend && t->pend[j].a <= e) {
      if (t->pend[j].a + t->pend[j].n > e) e = t->pend[j].a + t->pend[j].n;
      j++;
    }
    atomic_fetch_add_explicit(&t->n_mprotects, 1, memory_order_relaxed);
    if (mprotect((void *)(uintptr_t)a, e - a, PROT_READ | PROT_WRITE) != 0) {
      int e2 = errno;
      CXR_WARN("release of %#lx+%lu refused: %s", (unsigned long)a, (unsigned long)(e - a),
               strerror(e2));
      if (e2 != ENOMEM) { /* ENOMEM: the pages are no longer mapped, nothing to restore */
        if (!rc) rc = cxr__from_errno(e2);
        for (unsigned k = i; k < j; k++) t->pend[keep++] = t->pend[k]; /* try again later */
      }
    }
    i = j;
  }
  t->npend = keep;
  t->plo = UINT64_MAX, t->phi = 0;
  for (unsigned k = 0; k < keep; k++) {
    if (t->pend[k].a < t->plo) t->plo = t->pend[k].a;
    if (t->pend[k].a + t->pend[k].n > t->phi) t->phi = t->pend[k].a + t->pend[k].n;
  }
  atomic_fetch_add_explicit(&t->n_sweeps, 1, memory_order_relaxed);
  return rc;
}

static void live_remove(cxr_seal_table *t, uint32_t slot) {
  uint32_t pos = t->live_pos[slot], last = t->live[--t->nlive];
  t->live[pos] = last;
  t->live_pos[last] = pos;
  t->s_len[slot] = 0;
  t->freel[t->nfree++] = slot;
}

/* The generation the receiver last wrote into slot s's record (0: none). */
static uint32_t rec_gen(const cxr_seal_table *t, uint32_t s) {
  return (uint32_t)(atomic_load_explicit(&t->recs[s].state, memory_order_acquire) >> 8);
}

/* The next generation for slot s: 12 bits (the id fits 32), never 0, and never the one the
 * record shows: after 4095 seals the receiver never checked, the id would come back to the
 * last one it marked done, and that record would answer for the new seal. */
static uint32_t next_gen(const cxr_seal_table *t, uint32_t s) {
  uint32_t g = t->gen[s] % GEN_MAX + 1;
  return g == rec_gen(t, s) ? g % GEN_MAX + 1 : g;
}

int cxr_seal_table_seal(cxr_seal_table *t, const void *p, size_t len, cxr_seal_id *id) {
  if (!t || !t->sender || !p || len == 0 || !id || ((uintptr_t)p % CXR__PAGE)) return CXR_EINVAL;
  uint64_t a = (uintptr_t)p, n = ((uint64_t)len + CXR__PAGE - 1) & ~(uint64_t)(CXR__PAGE - 1);
  if (n < len || a + n < a) return CXR_EINVAL;
  pthread_mutex_lock(&t->mu);
  int rc = 0;
  for (unsigned i = 0; i < t->nlive; i++) {
    uint32_t s = t->live[i];
    if (t->s_addr[s] < a + n && a < t->s_addr[s] + t->s_len[s]) {
      rc = CXR_EBUSY;
      goto out;
    }
  }
  if (t->npend && t->plo < a + n && a < t->phi) { /* re-sealing pages awaiting release */
    for (unsigned i = 0; i < t->npend; i++)
      if (t->pend[i].a < a + n && a < t->pend[i].a + t->pend[i].n) {
        if ((rc = flush_locked(t)) != 0) goto out;
        break;
      }
  }
  if (t->nfree == 0) {
    rc = CXR_EFULL;
    goto out;
  }
  if (mprotect((void *)p, n, PROT_READ) != 0) {
    rc = cxr__from_errno(errno);
    goto out;
  }
  uint32_t s = t->freel[--t->nfree];
  t->gen[s] = next_gen(t, s);
  t->s_addr[s] = a;
  t->s_len[s] = n;
  t->live_pos[s] = t->nlive;
  t->live[t->nlive++] = s;
  *id = ID(t->gen[s], s);
  atomic_fetch_add_explicit(&t->n_seals, 1, memory_order_relaxed);
out:
  pthread_mutex_unlock(&t->mu);
  return rc;
}

/* The slot of a live seal of ours, or -1. Caller holds mu. */
static int64_t live_slot(const cxr_seal_table *t, cxr_seal_id id) {
  uint32_t s = ID_SLOT(id), g = ID_GEN(id);
  if (s >= t->slots || g == 0 || t->gen[s] != g || t->s_len[s] == 0) return -1;
  return s;
}

/* The state of our seal (slot s, generation g) as the receiver's record shows it. A record
 * held (claimed or active) under another generation counts as held: a late descriptor of
 * an earlier seal of this slot may have been checked against our pages, still sealed, and
 * the receiver relies on them until it marks that one done. */
static int rec_state(const cxr_seal_table *t, uint32_t s, uint32_t g) {
  uint64_t st = atomic_load_explicit(&t->recs[s].state, memory_order_acquire);
  int state = (int)(st & 0xff);
  if ((st >> 8) == g || state == CXR__SEAL_CLAIM || state == CXR__SEAL_ACTIVE) return state;
  return CXR__SEAL_FREE; /* never checked under this generation */
}

/* Release and cancel begin alike: a sender's table, locked, and a live seal of ours with the
 * state the receiver gave it. On 0 the caller holds mu and unlocks it; on an error mu is not
 * held. */
static int lock_live_seal(cxr_seal_table *t, cxr_seal_id id, uint32_t *slot, int *state) {
  if (!t || !t->sender) return CXR_EINVAL;
  pthread_mutex_lock(&t->mu);
  int64_t s = live_slot(t, id);
  if (s < 0) {
    pthread_mutex_unlock(&t->mu);
    return CXR_EINVAL;
  }
  *slot = (uint32_t)s;
  *state = rec_state(t, *slot, ID_GEN(id));
  return 0;
}

int cxr_seal_table_release(cxr_seal_table *t, cxr_seal_id id) {
  uint32_t s;
  int st;
  int rc = lock_live_seal(t, id, &s, &st);
  if (rc != 0) return rc;
  if (!t->peer_dead && st != CXR__SEAL_DONE) {
    rc = (st == CXR__SEAL_ACTIVE || st == CXR__SEAL_CLAIM) ? CXR_EPERM : CXR_EAGAIN;
    goto out;
  }
  if (t->npend == t->batch && (rc = flush_locked(t)) != 0 && t->npend == t->batch) goto out;
  pend *p = &t->pend[t->npend++];
  p->a = t->s_addr[s], p->n = t->s_len[s];
  if (p->a < t->plo) t->plo = p->a;
  if (p->a + p->n > t->phi) t->phi = p->a + p->n;
  live_remove(t, s);
  atomic_fetch_add_explicit(&t->n_releases, 1, memory_order_relaxed);
  rc = t->npend >= t->batch ? flush_locked(t) : 0;
out:
  pthread_mutex_unlock(&t->mu);
  return rc;
}

int cxr_seal_table_flush(cxr_seal_table *t) {
  if (!t || !t->sender) return CXR_EINVAL;
  pthread_mutex_lock(&t->mu);
  int rc = flush_locked(t);
  pthread_mutex_unlock(&t->mu);
  return rc;
}

int cxr_seal_table_cancel(cxr_seal_table *t, cxr_seal_id id) {
  uint32_t s;
  int st;
  int rc = lock_live_seal(t, id, &s, &st);
  if (rc != 0) return rc;
  if (!t->peer_dead && (st == CXR__SEAL_ACTIVE || st == CXR__SEAL_CLAIM)) {
    rc = CXR_EPERM;
    goto out;
  }
  atomic_fetch_add_explicit(&t->n_mprotects, 1, memory_order_relaxed);
  /* ENOMEM: the sender unmapped the pages; nothing to restore, the slot is free again (as
   * a release's sweep treats them). */
  if (mprotect((void *)(uintptr_t)t->s_addr[s], t->s_len[s], PROT_READ | PROT_WRITE) != 0 &&
      errno != ENOMEM) {
    rc = cxr__from_errno(errno);
    goto out;
  }
  live_remove(t, s);
out:
  pthread_mutex_unlock(&t->mu);
  return rc;
}

void cxr_seal_table_peer_dead(cxr_seal_table *t) {
  if (!t) return;
  pthread_mutex_lock(&t->mu);
  t->peer_dead = true;
  pthread_mutex_unlock(&t->mu);
}

int cxr_seal_table_range(const cxr_seal_table *t, cxr_seal_id id, cxr_range *out) {
  if (!t || !t->sender || !out) return CXR_EINVAL;
  pthread_mutex_lock((pthread_mutex_t *)&t->mu);
  int64_t s = live_slot(t, id);
  if (s >= 0) *out = (cxr_range){(const void *)(uintptr_t)t->s_addr[s], t->s_len[s]};
  pthread_mutex_unlock((pthread_mutex_t *)&t->mu);
  return s >= 0 ? 0 : CXR_EINVAL;
}

/* ---- receiver ---- */

int cxr_seal_table_set_peer(cxr_seal_table *t, int pid, const void *heap_base, size_t heap_size) {
  if (!t || t->sender || pid <= 0) return CXR_EINVAL;
  if (heap_base && (((uintptr_t)heap_base % CXR__PAGE) || heap_size == 0 ||
                    (uintptr_t)heap_base + heap_size < (uintptr_t)heap_base))
    return CXR_EINVAL;
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/maps", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? CXR_EPEERDEAD : cxr__from_errno(errno);
  uint64_t dev = 0, ino = 0, off = 0;
  if (heap_base) {
    int rc = cxr__vma_backing((uintptr_t)heap_base, &dev, &ino, &off);
    if (rc) {
      close(fd);
      return rc == CXR_ENOENT ? CXR_EINVAL : rc;
    }
  }
  pthread_rwlock_wrlock(&t->peer_lock);
  if (t->maps_fd >= 0) close(t->maps_fd);
  t->maps_fd = fd;
  t->peer_pid = pid;
  t->heap_lo = (uintptr_t)heap_base;
  t->heap_hi = heap_base ? (uintptr_t)heap_base + heap_size : 0;
  t->dev = dev, t->ino = ino, t->heap_off = off;
  pthread_rwlock_unlock(&t->peer_lock);
  return 0;
}

int cxr_seal_table_enforce(cxr_seal_table *t, const char *socket) {
  if (!t || t->sender) return CXR_EINVAL;
  pthread_rwlock_rdlock(&t->peer_lock);
  int peer_pid = t->peer_pid;
  uint64_t heap_lo = t->heap_lo, heap_hi = t->heap_hi;
  pthread_rwlock_unlock(&t->peer_lock);
  if (peer_pid <= 0) return CXR_EINVAL;
  char path[108];
  int rc = cxr__cxrpcd_path(socket, path, sizeof path);
  if (rc) return rc;
  int s = cxr__cxrpcd_connect(path, 0);
  if (s < 0) return s;
  cxr__cxrpcd_msg m = {.magic = CXR__CXRPCD_MAGIC, .type = CXR__MSG_REGISTER,
                       .pid = peer_pid, .base = heap_lo, .size = heap_hi - heap_lo};
  rc = cxr__msg_send(s, &m, t->fd);
  if (!rc) rc = cxr__msg_recv(s, &m, NULL, 2000000000);
  if (!rc && m.type != CXR__MSG_REPLY) rc = CXR_EPROTO;
  if (!rc) rc = m.status;
  if (rc) {
    close(s);
    return rc == CXR_ETIMEDOUT || rc == CXR_EPEERDEAD ? CXR_ENOTCONN : rc;
  }
  pthread_mutex_lock(&t->mu);
  if (t->sup_sock >= 0) close(t->sup_sock);
  t->sup_sock = s; /* the registration lasts while this stays open */
  pthread_mutex_unlock(&t->mu);
  return 0;
}

bool cxr_seal_table_enforced(const cxr_seal_table *t) { return t && t->sup_sock >= 0; }

static int check_locked(cxr_seal_table *t, cxr_seal_id id, const void *p, size_t len);

int cxr_seal_table_check(cxr_seal_table *t, cxr_seal_id id, const void *p, size_t len) {
  if (!t || t->sender || !p || len == 0) return CXR_EINVAL;
  atomic_fetch_add_explicit(&t->n_checks, 1, memory_order_relaxed);
  pthread_rwlock_rdlock(&t->peer_lock);
  int rc = check_locked(t, id, p, len);
  pthread_rwlock_unlock(&t->peer_lock);
  return rc;
}

/* The check, with the peer's fields held still (peer_lock read-held). */
static int check_locked(cxr_seal_table *t, cxr_seal_id id, const void *p, size_t len) {
  uint32_t s = ID_SLOT(id), g = ID_GEN(id);
  uint64_t a = (uintptr_t)p & ~(uint64_t)(CXR__PAGE - 1), e = (uintptr_t)p + len;
  if (e < (uintptr_t)p || e > UINT64_MAX - CXR__PAGE) return CXR_EBADPTR;
  e = (e + CXR__PAGE - 1) & ~(uint64_t)(CXR__PAGE - 1);
  if (s >= t->slots || g == 0) goto not_sealed;
  if (t->heap_hi && (a < t->heap_lo || e > t->heap_hi)) return CXR_EBADPTR;
  cxr__seal_rec *r = &t->recs[s];
  uint64_t old = atomic_load_explicit(&r->state, memory_order_acquire);
  do {
    uint64_t st = old & 0xff;
    if (st == CXR__SEAL_ACTIVE || st == CXR__SEAL_CLAIM) return CXR_EBUSY;
  } while (!atomic_compare_exchange_weak_explicit(&r->state, &old, STATE(g, CXR__SEAL_CLAIM),
                                                  memory_order_acq_rel, memory_order_acquire));
  atomic_store_explicit(&r->addr, a, memory_order_relaxed);
  atomic_store_explicit(&r->len, e - a, memory_order_relaxed);
  /* Active first, verify second: once active, the supervisor refuses raises over it. */
  atomic_store_explicit(&r->state, STATE(g, CXR__SEAL_ACTIVE), memory_order_seq_cst);
  if (t->maps_fd >= 0) {
    uint64_t off = t->ino ? t->heap_off + (a - t->heap_lo) : 0;
    int rc = cxr__vma_verify_sealed(t->maps_fd, a, e - a, t->dev, t->ino, off);
    if (rc) {
      atomic_store_explicit(&r->state, STATE(g, CXR__SEAL_FREE), memory_order_release);
      if (rc != CXR_ENOTSEALED) return rc;
      goto not_sealed;
    }
  }
  return 0;
not_sealed:
  atomic_fetch_add_explicit(&t->n_not_sealed, 1, memory_order_relaxed);
  return CXR_ENOTSEALED;
}

int cxr_seal_table_done(cxr_seal_table *t, cxr_seal_id id) {
  if (!t || t->sender) return CXR_EINVAL;
  uint32_t s = ID_SLOT(id), g = ID_GEN(id);
  if (s >= t->slots || g == 0) return CXR_EINVAL;
  uint64_t want = STATE(g, CXR__SEAL_ACTIVE);
  if (!atomic_compare_exchange_strong_explicit(&t->recs[s].state, &want, STATE(g, CXR__SEAL_DONE),
                                               memory_order_acq_rel, memory_order_acquire))
    return CXR_EINVAL;
  return 0;
}

int cxr__seal_table_reset(cxr_seal_table *t) {
  if (!t || t->sender) return CXR_EINVAL;
  pthread_mutex_lock(&t->mu);
  for (unsigned i = 0; i < t->slots; i++) {
    atomic_store_explicit(&t->recs[i].state, 0, memory_order_relaxed);
    atomic_store_explicit(&t->recs[i].addr, 0, memory_order_relaxed);
    atomic_store_explicit(&t->recs[i].len, 0, memory_order_relaxed);
  }
  atomic_thread_fence(memory_order_seq_cst);
  pthread_rwlock_wrlock(&t->peer_lock);
  if (t->maps_fd >= 0) close(t->maps_fd);
  if (t->sup_sock >= 0) close(t->sup_sock);
  t->maps_fd = t->sup_sock = -1;
  t->peer_pid = 0;
  t->heap_lo = t->heap_hi = t->dev = t->ino = t->heap_off = 0;
  pthread_rwlock_unlock(&t->peer_lock);
  pthread_mutex_unlock(&t->mu);
  return 0;
}

int cxr_seal_table_stats(const cxr_seal_table *t, cxr_seal_stats *o) {
  if (!t || !o) return CXR_EINVAL;
  memset(o, 0, sizeof *o);
  o->seals = atomic_load(&t->n_seals);
  o->releases = atomic_load(&t->n_releases);
  o->sweeps = atomic_load(&t->n_sweeps);
  o->mprotects = atomic_load(&t->n_mprotects);
  o->checks = atomic_load(&t->n_checks);
  o->not_sealed = atomic_load(&t->n_not_sealed);
  pthread_mutex_lock((pthread_mutex_t *)&t->mu);
  o->live = t->nlive;
  o->pending = t->npend;
  pthread_mutex_unlock((pthread_mutex_t *)&t->mu);
  return 0;
}

void cxr_seal_table_close(cxr_seal_table *t) {
  if (!t) return;
  if (t->sender) {
    pthread_mutex_lock(&t->mu);
    flush_locked(t);
    pthread_mutex_unlock(&t->mu);
  }
  table_free(t);
}

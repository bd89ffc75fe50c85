/* Inspection from outside the serving process (cxrpcctl channels / conns): maps the
 * channel's control heap and copies its counters; never writes its contents (opening it
 * makes this process one of the heap's holders). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rpc/internal.h"
#include "shm/proc.h"

static const char *state_name(unsigned st) {
  switch (st) {
    case CXR__SLOT_READY: return "ready";
    case CXR__SLOT_CLAIMED: return "connected";
    case CXR__SLOT_CLOSING: return "closing";
    case CXR__SLOT_RECLAIM: return "reclaim";
    case CXR__SLOT_BUSY: return "busy";
    default: return "free";
  }
}

/* A name copied for printing: any process of the pod can write the registry and the
 * channel's block, and cxrpcctl prints what they say on a terminal (escape sequences). */
static void copy_printable(char *dst, const char *src, size_t cap) {
  size_t i = 0;
  for (; i + 1 < cap && src[i] != '\0'; i++)
    dst[i] = src[i] < 0x20 || src[i] == 0x7f ? '?' : src[i];
  dst[i] = '\0';
}

/* How long ago `then` was; 0 for a time in the future or none (a block's times are
 * anyone's to write: now - then overflowed, undefined behaviour). */
static int64_t age_since(int64_t now, int64_t then) {
  return then > 0 && then <= now ? now - then : 0;
}

/* max_conns: the block's, as open_block checked it (the block is writable by every user of
 * the channel, so its fields are not read again as a bound). The name is the one the
 * channel's heap is registered under, not the block's own: one block could claim another
 * channel's name and shadow it. */
static void fill_info(const char *name, const cxr__chan_block *cb, unsigned max_conns,
                      cxr_channel_info *info) {
  memset(info, 0, sizeof *info);
  copy_printable(info->name, name, sizeof info->name);
  info->server_pid = cb->server_pid;
  cxr__proc_id id = {.pid = cb->server_pid, .start_time = cb->server_start, .host = cb->server_host};
  info->open = CXR__LD(&cb->state) == CXR__CHAN_OPEN;
  info->server_alive = cxr__proc_alive(&id);
  info->mode = cb->mode;
  info->max_conns = max_conns;
  info->pool = cb->pool;
  info->workers = cb->workers;
  info->ring_slots = cb->ring_slots;
  info->connects = CXR__LDX(&cb->connects);
  info->disconnects = CXR__LDX(&cb->disconnects);
  info->reclaimed = CXR__LDX(&cb->reclaimed);
  info->created = CXR__LDX(&cb->created);
  info->age_ns = age_since(cxr_now_ns(), CXR__LDX(&cb->opened_ns));
  for (unsigned k = 0; k < max_conns; k++) {
    unsigned st = cxr__owner_state(CXR__LD(&cb->slots[k].owner));
    if (st == CXR__SLOT_READY) info->ready++;
    if (st == CXR__SLOT_CLAIMED) info->connected++;
  }
}

/* Opens "ch.<name>" and checks its block; *max_conns is its slot count as checked. */
static int open_block(const char *heap_name, cxr_heap **h, const cxr__chan_block **out,
                      unsigned *max_conns) {
  int rc = cxr_heap_open(h, heap_name);
  if (rc != 0) return rc;
  const cxr__chan_block *cb = cxr_heap_get_root(*h);
  unsigned max = 0;
  bool ok = cxr__block_ok(*h, cb, sizeof *cb, _Alignof(cxr__chan_block));
  if (ok) max = CXR__LDX(&cb->max_conns);
  if (!ok || max == 0 || cb->magic != CXR__CHAN_MAGIC || cb->version != CXR__VERSION ||
      max > CXR__MAX_CONNS || !cxr_heap_contains(*h, cb, cxr__chan_block_size(max))) {
    cxr_heap_close(*h);
    return cb == NULL ? CXR_ENOENT : CXR_EBADMAGIC;
  }
  *out = cb;
  *max_conns = max;
  return 0;
}

int cxr_channel_list(cxr_channel_info *out, size_t max, size_t *n) {
  if (n == NULL || (out == NULL && max != 0)) return CXR_EINVAL;
  *n = 0;
  size_t cap = 256, total = 0;
  cxr_heap_info *heaps = NULL;
  for (;;) {
    heaps = calloc(cap, sizeof *heaps);
    if (heaps == NULL) return CXR_ENOMEM;
    int rc = cxr_registry_list(heaps, cap, &total);
    if (rc != 0) {
      free(heaps);
      return rc;
    }
    if (total <= cap) break;
    free(heaps);
    cap = total + 16;
  }
  for (size_t i = 0; i < total; i++) {
    if (strncmp(heaps[i].name, "ch.", 3) != 0) continue;
    cxr_heap *h;
    const cxr__chan_block *cb;
    unsigned slots;
    if (open_block(heaps[i].name, &h, &cb, &slots) != 0) continue;
    if (*n < max) fill_info(heaps[i].name + 3, cb, slots, &out[*n]);
    (*n)++;
    cxr_heap_close(h);
  }
  free(heaps);
  return 0;
}

int cxr_channel_inspect(const char *name, cxr_channel_info *info, cxr_conn_info *conns,
                        size_t max, size_t *n) {
  if (name == NULL || (conns == NULL && max != 0)) return CXR_EINVAL;
  if (n) *n = 0;
  char heap_name[CXR_NAME_MAX + 1];
  if (snprintf(heap_name, sizeof heap_name, "ch.%s", name) > CXR_NAME_MAX) return CXR_ENAMETOOLONG;
  cxr_heap *h;
  const cxr__chan_block *cb;
  unsigned slots;
  int rc = open_block(heap_name, &h, &cb, &slots);
  if (rc != 0) return rc;
  if (info) fill_info(name, cb, slots, info);
  size_t count = 0;
  int64_t now = cxr_now_ns();
  for (unsigned k = 0; k < slots; k++) {
    const cxr__cslot *s = &cb->slots[k];
    uint64_t o = CXR__LD(&s->owner);
    unsigned st = cxr__owner_state(o);
    if (st == CXR__SLOT_FREE) continue;
    if (count < max) {
      cxr_conn_info *ci = &conns[count];
      memset(ci, 0, sizeof *ci);
      ci->slot = k;
      snprintf(ci->state, sizeof ci->state, "%s", state_name(st));
      ci->client_pid = (int)cxr__owner_pid(o);
      ci->client_uid = CXR__LDX(&s->client_uid);
      if (st == CXR__SLOT_CLAIMED) {
        cxr__proc_id id = {.pid = ci->client_pid, .start_time = CXR__LDX(&s->client_start),
                           .host = cb->server_host};
        ci->client_alive = id.start_time ? cxr__proc_alive(&id) : true;
        ci->age_ns = age_since(now, CXR__LDX(&s->since_ns));
      }
      char heap[sizeof s->heap + 1] = {0};
      memcpy(heap, s->heap, sizeof s->heap);
      copy_printable(ci->heap, heap, sizeof ci->heap);
      ci->calls = CXR__LDX(&s->srv.calls);
      ci->errors = CXR__LDX(&s->srv.errors);
      ci->bytes_in = CXR__LDX(&s->srv.bytes_in);
      ci->bytes_out = CXR__LDX(&s->srv.bytes_out);
      ci->malformed = CXR__LDX(&s->srv.malformed);
      ci->expired = CXR__LDX(&s->srv.expired);
      ci->cancelled = CXR__LDX(&s->srv.cancelled);
      /* Sent by the client and not answered yet (queued or running): no counter on the
       * call path is needed for it. */
      ci->inflight = ci->calls < CXR__LDX(&s->cli.calls) ? CXR__LDX(&s->cli.calls) - ci->calls : 0;
      ci->client_calls = CXR__LDX(&s->cli.calls);
      ci->client_errors = CXR__LDX(&s->cli.errors);
      ci->timeouts = CXR__LDX(&s->cli.timeouts);
      ci->cancels = CXR__LDX(&s->cli.cancels);
      ci->peer_dead = CXR__LDX(&s->cli.peer_dead);
      ci->late = CXR__LDX(&s->cli.late);
      ci->stray = CXR__LDX(&s->cli.stray);
    }
    count++;
  }
  if (n) *n = count;
  cxr_heap_close(h);
  return 0;
}

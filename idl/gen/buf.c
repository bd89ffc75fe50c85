/* Arena and text buffers for the generator: one free at the end, no leaks on errors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idl/gen/model.h"

struct gen_chunk {
  struct gen_chunk *next;
  max_align_t data[];
};

void *ga_alloc(gen_arena *a, size_t n) {
  if (a->oom || n > ((size_t)1 << 30)) {
    a->oom = true;
    return NULL;
  }
  struct gen_chunk *c = calloc(1, sizeof *c + n);
  if (!c) {
    a->oom = true;
    return NULL;
  }
  c->next = a->head;
  a->head = c;
  return c->data;
}

char *ga_strdup(gen_arena *a, const char *s) {
  size_t n = strlen(s) + 1;
  char *d = ga_alloc(a, n);
  if (d) memcpy(d, s, n);
  return d;
}

char *ga_printf(gen_arena *a, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) return NULL;
  char *d = ga_alloc(a, (size_t)n + 1);
  if (!d) return NULL;
  va_start(ap, fmt);
  vsnprintf(d, (size_t)n + 1, fmt, ap);
  va_end(ap);
  return d;
}

void ga_free(gen_arena *a) {
  struct gen_chunk *c = a->head;
  while (c) {
    struct gen_chunk *n = c->next;
    free(c);
    c = n;
  }
  a->head = NULL;
}

void gb_vprintf(gen_buf *b, const char *fmt, va_list ap) {
  if (b->oom) return;
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  if (n < 0) {
    b->oom = true;
    return;
  }
  if (b->len + (size_t)n + 1 > b->cap) {
    size_t nc = b->cap ? b->cap : 4096;
    while (nc < b->len + (size_t)n + 1) nc *= 2;
    char *p = realloc(b->p, nc);
    if (!p) {
      b->oom = true;
      return;
    }
    b->p = p;
    b->cap = nc;
  }
  vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
  b->len += (size_t)n;
}

void gb_printf(gen_buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  gb_vprintf(b, fmt, ap);
  va_end(ap);
}

static void comment_line(gen_buf *b, const char *p, size_t n) {
  /* copy the line, defusing comment delimiters, trigraphs and control characters */
  char prev = '*'; /* the " *" before: a leading "/" must not close it */
  for (size_t i = 0; i < n; i++) {
    char ch = p[i];
    if ((unsigned char)ch < 0x20 || ch == 0x7f) ch = ' ';
    if (prev == '*' && ch == '/') ch = ' ';
    if (prev == '/' && ch == '*') ch = ' ';
    /* ??/ is a trigraph: at a line's end it reads as a line continuation (-Wtrigraphs) */
    if (prev == '?' && ch == '?') gb_printf(b, "\\");
    gb_printf(b, "%c", ch);
    prev = ch;
  }
}

void gb_comment(gen_buf *b, const char *indent, const char *text) {
  if (!text || !*text) return;
  /* one line (with or without its final newline, at most 90 columns): one line out */
  const char *nl = strchr(text, '\n');
  if ((!nl || nl[1] == 0) && strlen(text) < 90) {
    size_t n = nl ? (size_t)(nl - text) : strlen(text);
    while (n && text[0] == ' ') text++, n--;
    gb_printf(b, "%s/* ", indent);
    comment_line(b, text, n);
    gb_printf(b, " */\n");
    return;
  }
  gb_printf(b, "%s/*", indent);
  const char *p = text;
  while (*p) {
    const char *e = strchr(p, '\n');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    if (!(n == 0 && !e)) {
      gb_printf(b, "\n%s *", indent);
      comment_line(b, p, n);
    }
    if (!e) break;
    p = e + 1;
  }
  gb_printf(b, "\n%s */\n", indent);
}

void gb_free(gen_buf *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}

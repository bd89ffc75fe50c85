/* Names: ours (pkg_Outer_Inner), protobuf-c's spellings, keywords, and the global table
 * that refuses two elements mapping to one C identifier. */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "idl/gen/model.h"

#define NAME_MAX_LEN 200

bool gn_ident(const char *s) {
  if (!s || !(isalpha((unsigned char)s[0]) || s[0] == '_')) return false;
  size_t n = 0;
  for (; s[n]; n++)
    if (!(isalnum((unsigned char)s[n]) || s[n] == '_') || n >= NAME_MAX_LEN) return false;
  return true;
}

/* C11 and C++ keywords, and macros a compiler or libc predefines that a member could hit. */
static const char *const kw[] = {
    "NULL", "_Alignas", "_Alignof", "_Atomic", "_Bool", "_Complex", "_Generic",
    "_Imaginary", "_Noreturn", "_Static_assert", "_Thread_local", "alignas", "alignof",
    "and", "and_eq", "asm", "assert", "auto", "bitand", "bitor", "bool", "break", "case",
    "catch", "char", "char16_t", "char32_t", "class", "compl", "complex", "const",
    "const_cast", "constexpr", "continue", "decltype", "default", "delete", "do", "double",
    "dynamic_cast", "else", "enum", "errno", "explicit", "export", "extern", "false",
    "float", "for", "friend", "goto", "i386", "if", "imaginary", "inline", "int", "linux",
    "long", "mutable", "namespace", "new", "noexcept", "noreturn", "not", "not_eq",
    "nullptr", "offsetof", "operator", "or", "or_eq", "private", "protected", "public",
    "register", "reinterpret_cast", "restrict", "return", "short", "signed", "sizeof",
    "static", "static_assert", "static_cast", "stderr", "stdin", "stdout", "struct",
    "switch", "template", "this", "thread_local", "throw", "true", "try", "typedef",
    "typeid", "typename", "typeof", "union", "unix", "unsigned", "using", "virtual", "void",
    "volatile", "wchar_t", "while", "xor", "xor_eq",
};

static bool is_kw(const char *s, const char *const *list, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(s, list[i]) == 0) return true;
  return false;
}

/* Upper-case letters, digits and underscores, at least one letter: the shape of standard
 * macros (SIZE_MAX and INT32_MAX from <stdint.h>, which the .cxr.h includes; EOF from
 * <stdio.h>, which a user may include first). protoc-c lower-cases field names, so only
 * ours would meet them. */
static bool all_upper(const char *s) {
  bool letter = false;
  for (; *s; s++) {
    if (islower((unsigned char)*s)) return false;
    letter = letter || isupper((unsigned char)*s);
  }
  return letter;
}

const char *gn_member(gen_arena *a, const char *s) {
  if (is_kw(s, kw, sizeof kw / sizeof kw[0]) || all_upper(s)) return ga_printf(a, "%s_", s);
  return s;
}

/* protobuf-c 1.4 (protoc-c/c_helpers.cc) spellings, which its generated code uses. */
static const char *const pbkw[] = {
    "and", "and_eq", "asm", "auto", "bitand", "bitor", "bool", "break", "case", "catch",
    "char", "class", "compl", "const", "const_cast", "continue", "default", "delete", "do",
    "double", "dynamic_cast", "else", "enum", "explicit", "extern", "false", "float", "for",
    "friend", "goto", "if", "inline", "int", "long", "mutable", "namespace", "new", "not",
    "not_eq", "operator", "or", "or_eq", "private", "protected", "public", "register",
    "reinterpret_cast", "return", "short", "signed", "sizeof", "static", "static_cast",
    "struct", "switch", "template", "this", "throw", "true", "try", "typedef", "typeid",
    "typename", "union", "unsigned", "using", "virtual", "void", "volatile", "wchar_t",
    "while", "xor", "xor_eq",
};

static const char *pb_join(gen_arena *a, const char *full, int mode) {
  /* mode 0: ToCamel pieces; 1: CamelToLower pieces; joined by "__" */
  size_t n = strlen(full);
  char *out = ga_alloc(a, n * 3 + 8);
  if (!out) return "";
  size_t o = 0;
  const char *p = full;
  while (*p) {
    if (*p == '.') {
      p++;
      continue;
    }
    if (o) {
      out[o++] = '_';
      out[o++] = '_';
    }
    if (mode == 0) {
      bool up = true;
      for (; *p && *p != '.'; p++) {
        if (*p == '_') up = true;
        else if (up) out[o++] = (char)toupper((unsigned char)*p), up = false;
        else out[o++] = *p;
      }
    } else {
      bool was_upper = true;
      for (; *p && *p != '.'; p++) {
        bool is_upper = isupper((unsigned char)*p);
        if (is_upper) {
          if (!was_upper) out[o++] = '_';
          out[o++] = (char)tolower((unsigned char)*p);
        } else {
          out[o++] = *p;
        }
        was_upper = is_upper;
      }
    }
  }
  out[o] = 0;
  return out;
}

const char *gn_pb_type(gen_arena *a, const char *full) { return pb_join(a, full, 0); }

const char *gn_pb_lower(gen_arena *a, const char *full) {
  const char *l = pb_join(a, full, 1);
  return ga_printf(a, "%s__descriptor", l);
}

const char *gn_pb_field(gen_arena *a, const char *name) {
  char *l = ga_strdup(a, name);
  if (!l) return "";
  for (char *p = l; *p; p++) *p = (char)tolower((unsigned char)*p);
  if (is_kw(l, pbkw, sizeof pbkw / sizeof pbkw[0])) return ga_printf(a, "%s_", l);
  return l;
}

/* What breaks a member name in C (not C++) code compiled with -std=gnu11: the lower-case
 * keywords of C11 and GNU C, macros gcc predefines in gnu modes, and the lower-case macros
 * of <stdbool.h> and <assert.h>, which generated sources include. */
static const char *const ckw[] = {
    "asm", "auto", "bool", "break", "case", "char", "const", "continue", "default", "do",
    "double", "else", "enum", "extern", "false", "float", "for", "goto", "i386", "if",
    "inline", "int", "linux", "long", "register", "restrict", "return", "short", "signed",
    "sizeof", "static", "static_assert", "struct", "switch", "true", "typedef", "typeof",
    "union", "unix", "unsigned", "void", "volatile", "while",
};

bool gn_c_reserved(const char *s) { return is_kw(s, ckw, sizeof ckw / sizeof ckw[0]); }

const char *gn_pb_method(gen_arena *a, const char *method) { return pb_join(a, method, 1); }

uint32_t gn_fnv1a(const char *s) {
  uint32_t h = 2166136261u;
  for (; *s; s++) {
    h ^= (uint8_t)*s;
    h *= 16777619u;
  }
  return h;
}

/* ---- the global name table: open addressing over arena strings ---- */

typedef struct gm_names {
  const char **name, **what, **file;
  size_t cap, n;
} gm_names;

static bool grow(gm_model *m) {
  gm_names *t = m->names;
  size_t ncap = t->cap ? t->cap * 2 : 1024;
  const char **nn = ga_alloc(&m->arena, ncap * sizeof *nn);
  const char **nw = ga_alloc(&m->arena, ncap * sizeof *nw);
  const char **nf = ga_alloc(&m->arena, ncap * sizeof *nf);
  if (!nn || !nw || !nf) return false;
  for (size_t i = 0; i < t->cap; i++) {
    if (!t->name[i]) continue;
    size_t j = gn_fnv1a(t->name[i]) & (ncap - 1);
    while (nn[j]) j = (j + 1) & (ncap - 1);
    nn[j] = t->name[i], nw[j] = t->what[i], nf[j] = t->file[i];
  }
  t->name = nn, t->what = nw, t->file = nf, t->cap = ncap;
  return true;
}

bool gn_claim(gm_model *m, const char *cname, const char *file, const char *what) {
  if (!cname || !what) {
    gm_error(m, "%s: out of memory", file);
    return false;
  }
  if (!m->names) {
    m->names = ga_alloc(&m->arena, sizeof *m->names);
    if (!m->names) return false;
  }
  gm_names *t = m->names;
  if ((t->n + 1) * 2 > t->cap && !grow(m)) {
    gm_error(m, "%s: out of memory", file);
    return false;
  }
  size_t j = gn_fnv1a(cname) & (t->cap - 1);
  while (t->name[j]) {
    if (strcmp(t->name[j], cname) == 0) {
      gm_error(m,
               "%s: %s needs the C name '%s', already used by %s (in %s); rename one of "
               "them",
               file, what, cname, t->what[j], t->file[j]);
      return false;
    }
    j = (j + 1) & (t->cap - 1);
  }
  t->name[j] = cname, t->what[j] = what, t->file[j] = file;
  t->n++;
  return true;
}

const char *gn_pb_case(gen_arena *a, const char *oneof) {
  return ga_printf(a, "%s_case", pb_join(a, oneof, 1));
}

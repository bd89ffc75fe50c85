/* Builds the model from a CodeGeneratorRequest. Every input is treated as hostile (the
 * plugin is fuzzed): absent names, dangling type names, odd nesting all end in an error
 * that names the file and the element, never a crash. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idl/gen/model.h"

#define MAX_NEST 32        /* nesting of message declarations */
#define MAX_ELEMS 100000   /* messages + enums + fields + values over the whole request */

typedef Google__Protobuf__FileDescriptorProto FileDesc;
typedef Google__Protobuf__DescriptorProto MsgDesc;
typedef Google__Protobuf__FieldDescriptorProto FieldDesc;
typedef Google__Protobuf__EnumDescriptorProto EnumDesc;

void gm_error(gm_model *m, const char *fmt, ...) {
  if (m->err[0]) return;  /* keep the first */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m->err, sizeof m->err, fmt, ap);
  va_end(ap);
  if (!m->err[0]) snprintf(m->err, sizeof m->err, "error");
}

/* ---- lookup of types by full name ".pkg.Msg" ---- */

typedef struct tentry {
  const char *key;
  gm_msg *msg;
  gm_enum *en;
} tentry;

typedef struct build {
  gm_model *m;
  tentry *tab;
  size_t cap, n;
  size_t elems;
} build;

static bool tab_put(build *b, const char *key, gm_msg *msg, gm_enum *en, const char *file) {
  if ((b->n + 1) * 2 > b->cap) {
    size_t ncap = b->cap ? b->cap * 2 : 256;
    tentry *nt = ga_alloc(&b->m->arena, ncap * sizeof *nt);
    if (!nt) return false;
    for (size_t i = 0; i < b->cap; i++) {
      if (!b->tab[i].key) continue;
      size_t j = gn_fnv1a(b->tab[i].key) & (ncap - 1);
      while (nt[j].key) j = (j + 1) & (ncap - 1);
      nt[j] = b->tab[i];
    }
    b->tab = nt, b->cap = ncap;
  }
  size_t j = gn_fnv1a(key) & (b->cap - 1);
  while (b->tab[j].key) {
    if (strcmp(b->tab[j].key, key) == 0) {
      gm_error(b->m, "%s: %s is defined twice", file, key + 1);
      return false;
    }
    j = (j + 1) & (b->cap - 1);
  }
  b->tab[j].key = key, b->tab[j].msg = msg, b->tab[j].en = en;
  b->n++;
  return true;
}

static tentry *tab_get(build *b, const char *key) {
  if (!b->cap || !key) return NULL;
  size_t j = gn_fnv1a(key) & (b->cap - 1);
  while (b->tab[j].key) {
    if (strcmp(b->tab[j].key, key) == 0) return &b->tab[j];
    j = (j + 1) & (b->cap - 1);
  }
  return NULL;
}

/* ---- comments from SourceCodeInfo ---- */

static const char *comment_for(const FileDesc *fd, const int32_t *path, size_t n) {
  const Google__Protobuf__SourceCodeInfo *sci = fd->source_code_info;
  if (!sci) return NULL;
  for (size_t i = 0; i < sci->n_location; i++) {
    const Google__Protobuf__SourceCodeInfo__Location *l = sci->location[i];
    if (!l || l->n_path != n || memcmp(l->path, path, n * sizeof *path) != 0) continue;
    if (l->leading_comments && *l->leading_comments) return l->leading_comments;
    if (l->trailing_comments && *l->trailing_comments) return l->trailing_comments;
    return NULL;
  }
  return NULL;
}

/* ---- growable arrays in the arena ---- */

static bool push(build *b, void ***arr, size_t *n, void *item) {
  /* capacity is the next power of two >= n */
  if ((*n & (*n - 1)) == 0) {
    size_t ncap = *n ? *n * 2 : 4;
    void **na = ga_alloc(&b->m->arena, ncap * sizeof *na);
    if (!na) return false;
    if (*n) memcpy(na, *arr, *n * sizeof *na);
    *arr = na;
  }
  (*arr)[(*n)++] = item;
  return true;
}

static bool count_elem(build *b, const char *file) {
  if (++b->elems > MAX_ELEMS) {
    gm_error(b->m, "%s: too many elements (more than %d)", file, MAX_ELEMS);
    return false;
  }
  return true;
}

static bool ext_ok(const char *name) {
  /* file names go into #include lines: keep them plain */
  if (!name || !*name || name[0] == '/' || strlen(name) > 400) return false;
  for (const char *p = name; *p; p++) {
    char c = *p;
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
          c == '_' || c == '-' || c == '.' || c == '/'))
      return false;
  }
  return strstr(name, "..") == NULL;
}

static bool is_wkt_file(const char *name) { return strncmp(name, "google/protobuf/", 16) == 0; }

/* ---- pass 1: declare messages and enums ---- */

static bool reg_enum(build *b, gm_file *f, const EnumDesc *ed, const char *pfull,
                     const char *pcname, int32_t *path, size_t plen) {
  gm_model *m = b->m;
  if (!ed || !gn_ident(ed->name)) {
    gm_error(m, "%s: an enum in %s has a missing or invalid name", f->name,
             *pfull ? pfull : "the file");
    return false;
  }
  if (!count_elem(b, f->name)) return false;
  gm_enum *e = ga_alloc(&m->arena, sizeof *e);
  if (!e) return false;
  e->full = *pfull ? ga_printf(&m->arena, "%s.%s", pfull, ed->name) : ed->name;
  e->cname = *pcname ? ga_printf(&m->arena, "%s_%s", pcname, ed->name) : ed->name;
  e->comment = comment_for(f->fd, path, plen);
  e->closed = !f->proto3;
  e->file = f;
  if (!e->full || !e->cname) return false;
  if (ed->n_value == 0) {
    gm_error(m, "%s: enum %s has no values", f->name, e->full);
    return false;
  }
  e->values = ga_alloc(&m->arena, ed->n_value * sizeof *e->values);
  if (!e->values) return false;
  e->nvalues = ed->n_value;
  for (size_t i = 0; i < ed->n_value; i++) {
    const Google__Protobuf__EnumValueDescriptorProto *vd = ed->value[i];
    if (!vd || !gn_ident(vd->name) || !vd->has_number) {
      gm_error(m, "%s: enum %s has a value with a missing or invalid name or number",
               f->name, e->full);
      return false;
    }
    if (!count_elem(b, f->name)) return false;
    e->values[i].name = vd->name;
    e->values[i].number = vd->number;
    e->values[i].cname = ga_printf(&m->arena, "%s_%s", e->cname, vd->name);
    int32_t vp[MAX_NEST * 2 + 8];
    if (plen + 2 <= sizeof vp / sizeof vp[0]) {
      memcpy(vp, path, plen * sizeof *path);
      vp[plen] = 2;
      vp[plen + 1] = (int32_t)i;
      e->values[i].comment = comment_for(f->fd, vp, plen + 2);
    }
  }
  char *key = ga_printf(&m->arena, ".%s", e->full);
  if (!key || !tab_put(b, key, NULL, e, f->name)) return false;
  return push(b, (void ***)&f->enums, &f->nenums, e);
}

static bool reg_msg(build *b, gm_file *f, const MsgDesc *md, const char *pfull,
                    const char *pcname, int32_t *path, size_t plen, int depth) {
  gm_model *m = b->m;
  if (!md || !gn_ident(md->name)) {
    gm_error(m, "%s: a message in %s has a missing or invalid name", f->name,
             *pfull ? pfull : "the file");
    return false;
  }
  if (depth > MAX_NEST) {
    gm_error(m, "%s: messages nested deeper than %d in %s", f->name, MAX_NEST, pfull);
    return false;
  }
  if (!count_elem(b, f->name)) return false;
  gm_msg *g = ga_alloc(&m->arena, sizeof *g);
  if (!g) return false;
  g->full = *pfull ? ga_printf(&m->arena, "%s.%s", pfull, md->name) : md->name;
  g->cname = *pcname ? ga_printf(&m->arena, "%s_%s", pcname, md->name) : md->name;
  if (!g->full || !g->cname) return false;
  g->pbtype = gn_pb_type(&m->arena, g->full);
  g->pbdesc = gn_pb_lower(&m->arena, g->full);
  g->comment = comment_for(f->fd, path, plen);
  g->map_entry = md->options && md->options->has_map_entry && md->options->map_entry;
  g->file = f;
  char *key = ga_printf(&m->arena, ".%s", g->full);
  if (!key || !tab_put(b, key, g, NULL, f->name)) return false;
  if (!push(b, (void ***)&f->msgs, &f->nmsgs, g)) return false;
  g->desc = md;  /* pass 2 reads the fields from it */

  int32_t sub[MAX_NEST * 2 + 8];
  memcpy(sub, path, plen * sizeof *path);
  for (size_t i = 0; i < md->n_nested_type; i++) {
    sub[plen] = 3, sub[plen + 1] = (int32_t)i;
    if (!reg_msg(b, f, md->nested_type[i], g->full, g->cname, sub, plen + 2, depth + 1))
      return false;
  }
  for (size_t i = 0; i < md->n_enum_type; i++) {
    sub[plen] = 4, sub[plen + 1] = (int32_t)i;
    if (!reg_enum(b, f, md->enum_type[i], g->full, g->cname, sub, plen + 2)) return false;
  }
  return true;
}

/* ---- pass 2: fields ---- */

static const char *kind_of(int t, gm_kind *k) {
  switch (t) {
    case GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__TYPE__TYPE_DOUBLE: *k = GK_DOUBLE; break;
    case GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__TYPE__TYPE_FLOAT: *k = GK_FLOAT; break;
    case GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__TYPE__TYPE_INT64:
    case GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__TYPE__TYPE_SINT64:
    case GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__TYPE__TYPE_SFIXED64: *k = GK_INT64; break;
    case GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__TYPE__TYPE_UINT64:
    case GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__TYPE__TYPE_FIXED64: *k = GK_UINT64; break;
    case GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__TYPE__TYPE_INT32:
    case GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__TYPE__TYPE_SINT32:
    case GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__TYPE__TYPE_SFIXED32: *k = GK_INT32; break;
    case GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__TYPE__TYPE_UINT32:
    case GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__TYPE__TYPE_FIXED32: *k = GK_UINT32; break;
    case GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__TYPE__TYPE_BOOL: *k = GK_BOOL; break;
    case GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__TYPE__TYPE_STRING: *k = GK_STRING; break;
    case GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__TYPE__TYPE_BYTES: *k = GK_BYTES; break;
    case GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__TYPE__TYPE_MESSAGE: *k = GK_MESSAGE; break;
    case GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__TYPE__TYPE_ENUM: *k = GK_ENUM; break;
    case GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__TYPE__TYPE_GROUP:
      return "groups are not supported (use a nested message)";
    default: return "has an unknown field type";
  }
  return NULL;
}

/* ---- a set of names in one scope (a struct's members): open addressing ---- */

typedef struct nameset {
  const char **name, **what;  /* what: the element that took the name, for the error */
  size_t cap;
} nameset;

static bool ns_init(gm_model *m, nameset *s, size_t n) {
  s->cap = 16;
  while (s->cap < 2 * n) s->cap *= 2;
  s->name = ga_alloc(&m->arena, s->cap * sizeof *s->name);
  s->what = ga_alloc(&m->arena, s->cap * sizeof *s->what);
  return s->name && s->what;
}

/* Adds name; NULL when it was free, else what took it first. The set never fills: its
 * capacity is at least twice the names the caller announced to ns_init. */
static const char *ns_add(nameset *s, const char *name, const char *what) {
  size_t j = gn_fnv1a(name) & (s->cap - 1);
  while (s->name[j]) {
    if (strcmp(s->name[j], name) == 0) return s->what[j];
    j = (j + 1) & (s->cap - 1);
  }
  s->name[j] = name, s->what[j] = what;
  return NULL;
}

/* Member names inside one struct must be distinct (fields, has_ flags, oneofs). */
static bool member_unique(gm_model *m, gm_msg *g, const char **names, size_t n,
                          const char *name) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(names[i], name) == 0) {
      gm_error(m, "%s: message %s: two members would both be named '%s' in C; rename one",
               g->file->name, g->full, name);
      return false;
    }
  return true;
}

static bool pb_member(gm_model *m, const gm_msg *g, nameset *s, const char *name,
                      const char *what) {
  if (!name || !what) return false;
  const char *prev = ns_add(s, name, what);
  if (!prev) return true;
  gm_error(m, "%s: message %s: protoc-c would name two members of its struct '%s' (%s and %s); "
           "rename one", g->file->name, g->full, name, prev, what);
  return false;
}

/* protoc-c's struct has its own members, which must differ too or its header does not
 * compile: base, each field lower-cased (Foo and foo meet), n_<f> for a repeated field,
 * has_<f> where it keeps a flag, <oneof>_case; the oneof members sit in an anonymous
 * union, so in the same scope. */
static bool pb_members_unique(gm_model *m, const gm_msg *g) {
  gen_arena *a = &m->arena;
  nameset s;
  if (!ns_init(m, &s, 3 * g->nfields + g->noneofs + 1)) return false;
  if (!pb_member(m, g, &s, "base", "its ProtobufCMessage base")) return false;
  for (size_t i = 0; i < g->noneofs; i++)
    if (!pb_member(m, g, &s, g->oneofs[i].pbcase,
                   ga_printf(a, "the case of oneof %s", g->oneofs[i].name)))
      return false;
  for (size_t i = 0; i < g->nfields; i++) {
    const gm_field *x = &g->fields[i];
    if (!pb_member(m, g, &s, x->pbname, ga_printf(a, "field %s", x->name))) return false;
    if (x->repeated && !pb_member(m, g, &s, ga_printf(a, "n_%s", x->pbname),
                                  ga_printf(a, "the count of repeated field %s", x->name)))
      return false;
    if (x->pb_has && !pb_member(m, g, &s, ga_printf(a, "has_%s", x->pbname),
                                ga_printf(a, "the has_ flag of optional field %s", x->name)))
      return false;
  }
  return true;
}

static bool build_fields(build *b, gm_file *f, gm_msg *g, int32_t *path, size_t plen) {
  gm_model *m = b->m;
  const MsgDesc *md = g->desc;
  const char *fn = f->name;
  if (md->n_extension) {
    gm_error(m, "%s: message %s: extensions ('extend') are not supported", fn, g->full);
    return false;
  }
  if (md->options && md->options->has_message_set_wire_format &&
      md->options->message_set_wire_format) {
    gm_error(m, "%s: message %s: message_set_wire_format is not supported", fn, g->full);
    return false;
  }
  size_t nmembers = 0;
  const char **members = ga_alloc(&m->arena, (2 * md->n_field + 2 * md->n_oneof_decl + 1) *
                                                 sizeof *members);
  if (!members) return false;
  g->noneofs = md->n_oneof_decl;
  if (g->noneofs) {
    g->oneofs = ga_alloc(&m->arena, g->noneofs * sizeof *g->oneofs);
    if (!g->oneofs) return false;
  }
  for (size_t i = 0; i < md->n_oneof_decl; i++) {
    const Google__Protobuf__OneofDescriptorProto *od = md->oneof_decl[i];
    if (!od || !gn_ident(od->name)) {
      gm_error(m, "%s: message %s: a oneof has a missing or invalid name", fn, g->full);
      return false;
    }
    gm_oneof *o = &g->oneofs[i];
    o->name = od->name;
    o->cname = gn_member(&m->arena, od->name);
    o->pbcase = gn_pb_case(&m->arena, od->name);
    path[plen] = 8, path[plen + 1] = (int32_t)i;
    o->comment = comment_for(f->fd, path, plen + 2);
    const char *cs = ga_printf(&m->arena, "%s_case", o->cname);
    if (!o->cname || !cs || !member_unique(m, g, members, nmembers, o->cname)) return false;
    members[nmembers++] = o->cname;
    if (!member_unique(m, g, members, nmembers, cs)) return false;
    members[nmembers++] = cs;
  }
  g->nfields = md->n_field;
  if (g->nfields) {
    g->fields = ga_alloc(&m->arena, g->nfields * sizeof *g->fields);
    if (!g->fields) return false;
  }
  bool *oneof_used = g->noneofs ? ga_alloc(&m->arena, g->noneofs) : NULL;
  for (size_t i = 0; i < md->n_field; i++) {
    const FieldDesc *fd = md->field[i];
    gm_field *x = &g->fields[i];
    if (!count_elem(b, fn)) return false;
    if (!fd || !gn_ident(fd->name)) {
      gm_error(m, "%s: message %s: a field has a missing or invalid name", fn, g->full);
      return false;
    }
    x->name = fd->name;
    if (!fd->has_number || fd->number <= 0 || !fd->has_type || !fd->has_label) {
      gm_error(m, "%s: field %s.%s: missing number, type or label", fn, g->full, fd->name);
      return false;
    }
    x->number = fd->number;
    const char *why = kind_of(fd->type, &x->kind);
    if (!why && fd->extendee) why = "extensions are not supported";
    if (!why && fd->default_value)
      why = "explicit default values ([default = ...]) are not supported";
    if (!why && fd->has_proto3_optional && fd->proto3_optional)
      why = "proto3 'optional' is not supported (protoc-c 1.4 cannot generate it); use a "
            "oneof, a wrapper message, or proto2 syntax";
    if (!why && (strcmp(fd->name, "unix") == 0 || strcmp(fd->name, "linux") == 0 ||
                 strcmp(fd->name, "i386") == 0))
      why = "the name is a macro gcc predefines in gnu11 mode, and protoc-c's code uses it "
            "unchanged; rename the field";
    if (!why && fd->options && fd->options->has_weak && fd->options->weak)
      why = "weak fields are not supported";
    int label = fd->label;
    if (!why && label != GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__LABEL__LABEL_OPTIONAL &&
        label != GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__LABEL__LABEL_REQUIRED &&
        label != GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__LABEL__LABEL_REPEATED)
      why = "has an unknown label";
    x->repeated = label == GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__LABEL__LABEL_REPEATED;
    x->required = label == GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__LABEL__LABEL_REQUIRED;
    if (!why && x->required && f->proto3) why = "required fields do not exist in proto3";
    x->oneof = -1;
    if (!why && fd->has_oneof_index) {
      if (fd->oneof_index < 0 || (size_t)fd->oneof_index >= g->noneofs || x->repeated ||
          x->required)
        why = "has an invalid oneof index";
      else
        x->oneof = fd->oneof_index, oneof_used[x->oneof] = true;
    }
    if (!why && (x->kind == GK_MESSAGE || x->kind == GK_ENUM)) {
      tentry *t = tab_get(b, fd->type_name);
      if (!t || (x->kind == GK_MESSAGE && !t->msg) || (x->kind == GK_ENUM && !t->en)) {
        gm_error(m, "%s: field %s.%s: unknown type '%s'", fn, g->full, fd->name,
                 fd->type_name ? fd->type_name : "(none)");
        return false;
      }
      x->msg = t->msg, x->en = t->en;
      const gm_file *tf = t->msg ? t->msg->file : t->en->file;
      if (is_wkt_file(tf->name)) {
        gm_error(m,
                 "%s: field %s.%s: well-known type %s (%s) is not supported; declare "
                 "your own message",
                 fn, g->full, fd->name, fd->type_name + 1, tf->name);
        return false;
      }
      if (x->en && x->en->closed && f->proto3)
        why = "uses a closed (proto2) enum in a proto3 message";
    }
    if (why) {
      gm_error(m, "%s: field %s.%s: %s", fn, g->full, fd->name, why);
      return false;
    }
    bool optional = label == GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__LABEL__LABEL_OPTIONAL;
    bool p2opt = !f->proto3 && optional && x->oneof < 0;
    x->has_flag = p2opt && x->kind != GK_MESSAGE && !g->map_entry;
    x->pb_has = p2opt && x->kind != GK_MESSAGE && x->kind != GK_STRING;
    x->pb_ptr_presence = p2opt && x->kind == GK_STRING;
    x->cname = gn_member(&m->arena, fd->name);
    x->pbname = gn_pb_field(&m->arena, fd->name);
    path[plen] = 2, path[plen + 1] = (int32_t)i;
    x->comment = comment_for(f->fd, path, plen + 2);
    if (!x->cname || !x->pbname) return false;
    for (size_t j = 0; j < i; j++)
      if (g->fields[j].number == x->number) {
        gm_error(m, "%s: message %s: field number %d used twice", fn, g->full, x->number);
        return false;
      }
    if (x->oneof < 0) {
      if (!member_unique(m, g, members, nmembers, x->cname)) return false;
      members[nmembers++] = x->cname;
      if (x->has_flag) {
        const char *hs = ga_printf(&m->arena, "has_%s", x->cname);
        if (!hs || !member_unique(m, g, members, nmembers, hs)) return false;
        members[nmembers++] = hs;
      }
    } else {
      /* oneof members share a named union: unique among themselves */
      for (size_t j = 0; j < i; j++)
        if (g->fields[j].oneof == x->oneof && strcmp(g->fields[j].cname, x->cname) == 0) {
          gm_error(m, "%s: message %s: two oneof members would both be named '%s' in C", fn,
                   g->full, x->cname);
          return false;
        }
    }
  }
  for (size_t i = 0; i < g->noneofs; i++)
    if (!oneof_used[i]) {
      gm_error(m, "%s: message %s: oneof %s has no fields", fn, g->full, g->oneofs[i].name);
      return false;
    }
  return pb_members_unique(m, g);
}

/* Walks the declarations again in pass-1 order to give each message its path. */
static bool fields_rec(build *b, gm_file *f, size_t *idx, const MsgDesc *md, int32_t *path,
                       size_t plen) {
  if (*idx >= f->nmsgs) return false;
  gm_msg *g = f->msgs[(*idx)++];
  if (!build_fields(b, f, g, path, plen)) return false;
  for (size_t i = 0; i < md->n_nested_type; i++) {
    path[plen] = 3, path[plen + 1] = (int32_t)i;
    if (!fields_rec(b, f, idx, md->nested_type[i], path, plen + 2)) return false;
  }
  return true;
}

/* ---- services ---- */

/* protoc-c's <Svc>_Service struct: base, then one member per method, CamelToLower of its
 * name and not escaped, so a method Register gives a member 'register' and a .pb-c.h that
 * does not compile. C++-only keywords (Delete) break only C++ that includes it, which the
 * generated .cxr.h does not. */
static bool pb_methods_ok(gm_model *m, const gm_file *f, const gm_service *s) {
  nameset ns;
  const char *svc = gn_pb_type(&m->arena, s->full);
  if (!ns_init(m, &ns, s->nmethods + 1)) return false;
  ns_add(&ns, "base", "its ProtobufCService base");
  for (size_t j = 0; j < s->nmethods; j++) {
    const gm_method *x = &s->methods[j];
    const char *pm = gn_pb_method(&m->arena, x->name);
    if (pm && gn_c_reserved(pm)) {
      gm_error(m, "%s: method %s: protoc-c names its member of %s_Service '%s', a C keyword "
               "or predefined macro; rename the method", f->name, x->path, svc, pm);
      return false;
    }
    const char *what = ga_printf(&m->arena, "method %s", x->name);
    if (!pm || !what) return false;
    const char *prev = ns_add(&ns, pm, what);
    if (prev) {
      gm_error(m, "%s: service %s: protoc-c would name two members of %s_Service '%s' (%s and "
               "%s); rename one", f->name, s->full, svc, pm, prev, what);
      return false;
    }
  }
  return true;
}

/* Our <svc>_handlers has one member per method, its name escaped (gn_member), so two
 * methods can meet there (new and new_) though their C functions differ. */
static bool handler_members_ok(gm_model *m, const gm_file *f, const gm_service *s) {
  nameset ns;
  if (!ns_init(m, &ns, s->nmethods)) return false;
  for (size_t j = 0; j < s->nmethods; j++) {
    const gm_method *x = &s->methods[j];
    const char *prev = ns_add(&ns, x->member, x->name);
    if (prev) {
      gm_error(m, "%s: service %s: methods %s and %s would both be the member '%s' of "
               "%s_handlers; rename one", f->name, s->full, prev, x->name, x->member, s->cname);
      return false;
    }
  }
  return true;
}

static bool build_services(build *b, gm_file *f) {
  gm_model *m = b->m;
  const FileDesc *fd = f->fd;
  f->nservices = fd->n_service;
  if (!f->nservices) return true;
  f->services = ga_alloc(&m->arena, f->nservices * sizeof *f->services);
  if (!f->services) return false;
  for (size_t i = 0; i < fd->n_service; i++) {
    const Google__Protobuf__ServiceDescriptorProto *sd = fd->service[i];
    gm_service *s = &f->services[i];
    if (!sd || !gn_ident(sd->name)) {
      gm_error(m, "%s: a service has a missing or invalid name", f->name);
      return false;
    }
    s->name = sd->name;
    s->full = *f->package ? ga_printf(&m->arena, "%s.%s", f->package, sd->name) : sd->name;
    s->cname = *f->package ? ga_printf(&m->arena, "%s_%s", f->package, sd->name) : sd->name;
    if (!s->full || !s->cname) return false;
    for (char *p = (char *)s->cname; *p; p++)
      if (*p == '.') *p = '_';
    int32_t path[4] = {6, (int32_t)i, 2, 0};
    s->comment = comment_for(fd, path, 2);
    s->nmethods = sd->n_method;
    if (s->nmethods) {
      s->methods = ga_alloc(&m->arena, s->nmethods * sizeof *s->methods);
      if (!s->methods) return false;
    }
    for (size_t j = 0; j < sd->n_method; j++) {
      const Google__Protobuf__MethodDescriptorProto *md = sd->method[j];
      gm_method *x = &s->methods[j];
      if (!count_elem(b, f->name)) return false;
      if (!md || !gn_ident(md->name)) {
        gm_error(m, "%s: service %s: a method has a missing or invalid name", f->name,
                 s->full);
        return false;
      }
      x->name = md->name;
      if ((md->has_client_streaming && md->client_streaming) ||
          (md->has_server_streaming && md->server_streaming)) {
        gm_error(m, "%s: method %s.%s: streaming RPCs are not supported (%s streaming)",
                 f->name, s->full, md->name,
                 md->client_streaming ? "client" : "server");
        return false;
      }
      tentry *in = tab_get(b, md->input_type), *out = tab_get(b, md->output_type);
      if (!in || !in->msg || !out || !out->msg) {
        gm_error(m, "%s: method %s.%s: unknown input or output type", f->name, s->full,
                 md->name);
        return false;
      }
      x->in = in->msg, x->out = out->msg;
      if (is_wkt_file(x->in->file->name) || is_wkt_file(x->out->file->name)) {
        gm_error(m,
                 "%s: method %s.%s: well-known types (google.protobuf.*) are not supported "
                 "as arguments or results; declare your own message",
                 f->name, s->full, md->name);
        return false;
      }
      x->cname = ga_printf(&m->arena, "%s_%s", s->cname, md->name);
      x->path = ga_printf(&m->arena, "%s/%s", s->full, md->name);
      x->member = gn_member(&m->arena, md->name);
      path[2] = 2, path[3] = (int32_t)j;
      x->comment = comment_for(fd, path, 4);
      if (!x->cname || !x->path || !x->member) return false;
      x->id = gn_fnv1a(x->path);
      if (x->id == 0) {
        gm_error(m, "%s: method %s: its id hashes to 0, which is reserved; rename it",
                 f->name, x->path);
        return false;
      }
    }
    if (!pb_methods_ok(m, f, s) || !handler_members_ok(m, f, s)) return false;
  }
  return true;
}

/* ---- global C names ---- */

static bool claim_all(gm_model *m, gm_file *f) {
  gen_arena *a = &m->arena;
  static const char *const msuf[] = {"", "_vec", "_new", "_validate", "_copy", "_free",
                                     "_release", "_equal", "_ranges", "_to_pb", "_from_pb", "_pb_free",
                                     "__vin", "__cin", "__fin", "__rin", "__tpb", "__fpb",
                                     "__eq"};
  for (size_t i = 0; i < f->nmsgs; i++) {
    const gm_msg *g = f->msgs[i];
    for (size_t k = 0; k < sizeof msuf / sizeof msuf[0]; k++)
      if (!gn_claim(m, ga_printf(a, "%s%s", g->cname, msuf[k]), f->name,
                    ga_printf(a, "message %s%s%s", g->full, k ? " (" : "",
                              k ? ga_printf(a, "%s)", msuf[k] + 1) : "")))
        return false;
  }
  for (size_t i = 0; i < f->nenums; i++) {
    const gm_enum *e = f->enums[i];
    if (!gn_claim(m, e->cname, f->name, ga_printf(a, "enum %s", e->full)) ||
        !gn_claim(m, ga_printf(a, "%s_is_valid", e->cname), f->name,
                  ga_printf(a, "enum %s (is_valid)", e->full)))
      return false;
    for (size_t j = 0; j < e->nvalues; j++)
      if (!gn_claim(m, e->values[j].cname, f->name,
                    ga_printf(a, "enum value %s.%s", e->full, e->values[j].name)))
        return false;
  }
  for (size_t i = 0; i < f->nservices; i++) {
    const gm_service *s = &f->services[i];
    static const char *const ssuf[] = {"_handlers", "_server", "_serve"};
    for (size_t k = 0; k < 3; k++)
      if (!gn_claim(m, ga_printf(a, "%s%s", s->cname, ssuf[k]), f->name,
                    ga_printf(a, "service %s", s->full)))
        return false;
    static const char *const xsuf[] = {"", "_async", "_wait", "_ID", "__tramp", "__result"};
    for (size_t j = 0; j < s->nmethods; j++)
      for (size_t k = 0; k < sizeof xsuf / sizeof xsuf[0]; k++)
        if (!gn_claim(m, ga_printf(a, "%s%s", s->methods[j].cname, xsuf[k]), f->name,
                      ga_printf(a, "method %s", s->methods[j].path)))
          return false;
  }
  return true;
}

/* Method ids must differ across every service of the request (they may share a channel). */
static bool ids_unique(gm_model *m) {
  for (size_t a = 0; a < m->nfiles; a++)
    for (size_t s = 0; s < m->files[a].nservices; s++)
      for (size_t k = 0; k < m->files[a].services[s].nmethods; k++) {
        const gm_method *x = &m->files[a].services[s].methods[k];
        for (size_t b = 0; b <= a; b++)
          for (size_t t = 0; t < m->files[b].nservices; t++)
            for (size_t l = 0; l < m->files[b].services[t].nmethods; l++) {
              const gm_method *y = &m->files[b].services[t].methods[l];
              if (y == x) goto next;
              if (y->id == x->id) {
                gm_error(m, "%s: methods %s and %s hash to the same id 0x%08x; rename one",
                         m->files[a].name, x->path, y->path, x->id);
                return false;
              }
            }
      next:;
      }
  return true;
}

/* ---- files ---- */

static bool build_file(build *b, gm_file *f, const FileDesc *fd) {
  gm_model *m = b->m;
  f->fd = fd;
  if (!fd || !ext_ok(fd->name)) {
    gm_error(m, "a file has a missing or unusable name (letters, digits, _ - . / only)");
    return false;
  }
  f->name = fd->name;
  size_t n = strlen(f->name);
  f->base = (n > 6 && strcmp(f->name + n - 6, ".proto") == 0)
                ? ga_printf(&m->arena, "%.*s", (int)(n - 6), f->name)
                : f->name;
  char *guard = ga_printf(&m->arena, "CXRPC_GEN_%s_CXR_H", f->base);
  if (!guard || !f->base) return false;
  for (char *p = guard; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9')))
      *p = '_';
  f->guard = guard;
  f->package = fd->package ? fd->package : "";
  if (!*f->package && !is_wkt_file(f->name)) {
    /* Without one, a message's C name is its bare name, which protoc-c's struct also
     * takes (struct Hello in both headers), and short names meet the generated locals. */
    gm_error(m, "%s: cxrpc needs a package line (package foo;): without one the C names "
             "clash with protoc-c's", f->name);
    return false;
  }
  if (*f->package) {
    /* dotted identifiers */
    char *pk = ga_strdup(&m->arena, f->package);
    if (!pk) return false;
    for (char *save = NULL, *t = strtok_r(pk, ".", &save); t; t = strtok_r(NULL, ".", &save))
      if (!gn_ident(t)) {
        gm_error(m, "%s: invalid package name '%s'", f->name, f->package);
        return false;
      }
    if (f->package[0] == '.' || f->package[strlen(f->package) - 1] == '.' ||
        strstr(f->package, "..")) {
      gm_error(m, "%s: invalid package name '%s'", f->name, f->package);
      return false;
    }
  }
  if (!fd->syntax || strcmp(fd->syntax, "proto2") == 0 || !*fd->syntax) {
    f->proto3 = false;
  } else if (strcmp(fd->syntax, "proto3") == 0) {
    f->proto3 = true;
  } else {
    gm_error(m, "%s: syntax '%.40s' is not supported (proto2 and proto3 are)", f->name,
             fd->syntax);
    return false;
  }
  char *pc = ga_strdup(&m->arena, f->package);
  if (!pc) return false;
  for (char *p = pc; *p; p++)
    if (*p == '.') *p = '_';
  int32_t path[MAX_NEST * 2 + 8];
  for (size_t i = 0; i < fd->n_message_type; i++) {
    path[0] = 4, path[1] = (int32_t)i;
    if (!reg_msg(b, f, fd->message_type[i], f->package, pc, path, 2, 0)) return false;
  }
  for (size_t i = 0; i < fd->n_enum_type; i++) {
    path[0] = 5, path[1] = (int32_t)i;
    if (!reg_enum(b, f, fd->enum_type[i], f->package, pc, path, 2)) return false;
  }
  return true;
}

bool gm_build(gm_model *m, const Google__Protobuf__Compiler__CodeGeneratorRequest *req) {
  build b = {.m = m};
  if (!req || req->n_proto_file == 0 || req->n_file_to_generate == 0) {
    gm_error(m, "the request names no file to generate");
    return false;
  }
  m->nfiles = req->n_proto_file;
  m->files = ga_alloc(&m->arena, m->nfiles * sizeof *m->files);
  if (!m->files) goto oom;
  for (size_t i = 0; i < m->nfiles; i++) {
    if (!build_file(&b, &m->files[i], req->proto_file[i])) goto fail;
    for (size_t j = 0; j < i; j++)
      if (strcmp(m->files[j].name, m->files[i].name) == 0) {
        gm_error(m, "%s: the file appears twice in the request", m->files[i].name);
        return false;
      }
  }
  for (size_t i = 0; i < req->n_file_to_generate; i++) {
    const char *want = req->file_to_generate[i];
    bool found = false;
    for (size_t j = 0; want && j < m->nfiles; j++)
      if (strcmp(m->files[j].name, want) == 0) m->files[j].generate = found = true;
    if (!found) {
      gm_error(m, "%s: asked to generate a file the request does not describe",
               want ? want : "(null)");
      return false;
    }
  }
  for (size_t i = 0; i < m->nfiles; i++) {
    gm_file *f = &m->files[i];
    const FileDesc *fd = f->fd;
    for (size_t j = 0; j < fd->n_dependency; j++) {
      gm_file *d = NULL;
      for (size_t k = 0; k < m->nfiles && fd->dependency[j]; k++)
        if (strcmp(m->files[k].name, fd->dependency[j]) == 0) d = &m->files[k];
      if (!d || d == f) {
        gm_error(m, "%s: imports '%s', which the request does not describe", f->name,
                 fd->dependency[j] ? fd->dependency[j] : "(null)");
        return false;
      }
      if (!push(&b, (void ***)&f->deps, &f->ndeps, d)) goto oom;
    }
    /* Files we only depend on are modelled for their types; well-known-type files and
     * the like are not checked (they are never generated here). */
    if (!f->generate && is_wkt_file(f->name)) continue;
    if (f->generate && fd->n_extension) {
      gm_error(m, "%s: extensions ('extend') are not supported", f->name);
      return false;
    }
    int32_t path[MAX_NEST * 2 + 8];
    size_t idx = 0;
    for (size_t k = 0; k < fd->n_message_type; k++) {
      path[0] = 4, path[1] = (int32_t)k;
      if (!fields_rec(&b, f, &idx, fd->message_type[k], path, 2)) goto fail;
    }
    if (!build_services(&b, f) || !claim_all(m, f)) goto fail;
  }
  if (!ids_unique(m)) goto fail;
  if (m->arena.oom) goto oom;
  return true;
oom:
  gm_error(m, "protoc-gen-cxrpc: out of memory");
  return false;
fail:
  if (m->arena.oom) gm_error(m, "protoc-gen-cxrpc: out of memory");
  gm_error(m, "protoc-gen-cxrpc: invalid request");
  return false;
}

void gm_free(gm_model *m) { ga_free(&m->arena); }

/*
 * The one model of a CodeGeneratorRequest that every emitter reads: files, messages,
 * fields, enums, services, with their C names (ours and protobuf-c's) resolved and every
 * unsupported feature already refused. Everything lives in one arena.
 */
#ifndef CXR_GEN_MODEL_H
#define CXR_GEN_MODEL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "google/protobuf/compiler/plugin.pb-c.h"

/* ---- arena and text buffers (buf.c) ---- */

typedef struct gen_arena {
  struct gen_chunk *head;
  bool oom;
} gen_arena;
void *ga_alloc(gen_arena *a, size_t n);  /* zeroed; NULL only when out of memory */
char *ga_strdup(gen_arena *a, const char *s);
char *ga_printf(gen_arena *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ga_free(gen_arena *a);

typedef struct gen_buf {
  char *p;
  size_t len, cap;
  bool oom;
} gen_buf;
void gb_printf(gen_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void gb_vprintf(gen_buf *b, const char *fmt, va_list ap);
/* A C block comment from proto comment text, each line prefixed by indent. */
void gb_comment(gen_buf *b, const char *indent, const char *text);
void gb_free(gen_buf *b);

/* ---- the model ---- */

typedef enum gm_kind {
  GK_DOUBLE, GK_FLOAT, GK_INT32, GK_INT64, GK_UINT32, GK_UINT64, GK_BOOL, GK_ENUM,
  GK_STRING, GK_BYTES, GK_MESSAGE
} gm_kind;

struct gm_msg;
struct gm_enum;
struct gm_file;

typedef struct gm_field {
  const char *name;       /* as in the .proto */
  const char *cname;      /* member of our struct */
  const char *pbname;     /* member of the protobuf-c struct */
  const char *comment;
  int number;
  gm_kind kind;
  bool repeated;
  bool required;          /* proto2 required */
  bool has_flag;          /* our struct carries bool has_<cname> */
  bool pb_has;            /* protobuf-c struct carries has_<pbname> */
  bool pb_ptr_presence;   /* proto2 optional string: protobuf-c NULL means absent */
  int oneof;              /* index into msg->oneofs, or -1 */
  struct gm_msg *msg;     /* GK_MESSAGE */
  struct gm_enum *en;     /* GK_ENUM */
} gm_field;

typedef struct gm_oneof {
  const char *name;
  const char *cname;      /* our union member; cname_case is the case member */
  const char *pbcase;     /* protobuf-c <name>_case member */
  const char *comment;
} gm_oneof;

typedef struct gm_msg {
  const char *full;       /* pkg.Outer.Inner */
  const char *cname;      /* pkg_Outer_Inner */
  const char *pbtype;     /* Pkg__Outer__Inner */
  const char *pbdesc;     /* pkg__outer__inner__descriptor */
  const char *comment;
  gm_field *fields;
  size_t nfields;
  gm_oneof *oneofs;
  size_t noneofs;
  bool map_entry;
  struct gm_file *file;
  const void *desc;       /* its DescriptorProto, between the two passes */
} gm_msg;

typedef struct gm_value {
  const char *name, *cname, *comment;
  int32_t number;
} gm_value;

typedef struct gm_enum {
  const char *full, *cname, *comment;
  gm_value *values;
  size_t nvalues;
  bool closed;            /* proto2: values outside the list are invalid */
  struct gm_file *file;
} gm_enum;

typedef struct gm_method {
  const char *name, *cname, *comment;
  const char *member;     /* its handler's member name in <Svc>_handlers */
  const char *path;       /* package.Service/Method: hashed into the id */
  uint32_t id;
  gm_msg *in, *out;
} gm_method;

typedef struct gm_service {
  const char *name, *full, *cname, *comment;
  gm_method *methods;
  size_t nmethods;
} gm_service;

typedef struct gm_file {
  const char *name;       /* dir/foo.proto */
  const char *base;       /* dir/foo */
  const char *package;    /* may be "" */
  const char *guard;      /* include guard */
  bool proto3;
  bool generate;
  gm_msg **msgs;          /* every message, nested ones included, parents first */
  size_t nmsgs;
  gm_enum **enums;
  size_t nenums;
  gm_service *services;
  size_t nservices;
  struct gm_file **deps;
  size_t ndeps;
  const Google__Protobuf__FileDescriptorProto *fd;
} gm_file;

typedef struct gm_model {
  gen_arena arena;
  gm_file *files;
  size_t nfiles;
  char err[1024];         /* first error: "file.proto: element: why" */
  struct gm_names *names; /* global C names (names.c) */
} gm_model;

/* Builds the model; false with m->err set on any error. */
bool gm_build(gm_model *m, const Google__Protobuf__Compiler__CodeGeneratorRequest *req);
void gm_free(gm_model *m);
void gm_error(gm_model *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- names (names.c) ---- */

/* Is s a proto identifier ([A-Za-z_][A-Za-z0-9_]*, bounded length)? */
bool gn_ident(const char *s);
/* s, or s + "_" when s is a C or C++ keyword, a predefined macro or all upper-case. */
const char *gn_member(gen_arena *a, const char *s);
/* protobuf-c's spellings: FullNameToC, FullNameToLower, ToLower(field) + keyword escape. */
const char *gn_pb_type(gen_arena *a, const char *full);
const char *gn_pb_lower(gen_arena *a, const char *full);
const char *gn_pb_field(gen_arena *a, const char *name);
const char *gn_pb_case(gen_arena *a, const char *oneof);  /* CamelToLower + "_case" */
/* protoc-c's member for a method in <Svc>_Service: CamelToLower, not escaped. */
const char *gn_pb_method(gen_arena *a, const char *method);
/* Is s a keyword or predefined macro of C (gnu11), which no member may be named? */
bool gn_c_reserved(const char *s);
/* Claims a global C identifier for an element; false (with m->err) when taken. */
bool gn_claim(gm_model *m, const char *cname, const char *file, const char *what);
/* 32-bit FNV-1a, the method id hash (same as cxr_method_id in the runtime). */
uint32_t gn_fnv1a(const char *s);

/* ---- emitters: each appends to the header (h) and source (c) of one file ---- */

void emit_prologue(gen_buf *h, gen_buf *c, const gm_file *f);
void emit_structs(gen_buf *h, gen_buf *c, const gm_file *f);
void emit_validate(gen_buf *h, gen_buf *c, const gm_file *f);
void emit_copy(gen_buf *h, gen_buf *c, const gm_file *f);
void emit_pb(gen_buf *h, gen_buf *c, const gm_file *f);
void emit_service(gen_buf *h, gen_buf *c, const gm_file *f);
void emit_epilogue(gen_buf *h, gen_buf *c, const gm_file *f);

/* C type of one element of a field (not the repeated wrapper). */
const char *gm_elem_ctype(const gm_field *fd);
/* The vector type of a repeated field: cxr_vec_* or <Msg>_vec. */
void gm_vec_ctype(gen_buf *b, const gm_field *fd);

#endif

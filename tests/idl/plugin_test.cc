// protoc-gen-cxrpc run by the real protoc on small .proto files: each unsupported feature
// fails with a message naming the file and the element, and malformed requests fed to the
// generator directly give an error response, not a crash.
#include <gtest/gtest.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

extern "C" {
#include "idl/gen/gen.h"
#include "google/protobuf/compiler/plugin.pb-c.h"
}

namespace {

std::string tmpdir() {
  const char *t = getenv("TEST_TMPDIR");
  static std::string d = std::string(t ? t : "/tmp") + "/plugin-" + std::to_string(getpid());
  mkdir(d.c_str(), 0777);
  return d;
}

// A file of the test's runfiles, by its workspace path.
std::string runfile(const std::string &path) {
  char buf[4096];
  if (!getcwd(buf, sizeof buf)) return "";
  return std::string(buf) + "/" + path;
}

std::string plugin_path() { return runfile("idl/protoc-gen-cxrpc"); }

struct ProtocRun {
  int status;
  std::string out;
};

// Runs a shell command; its exit status and output (stderr included by the command).
ProtocRun run(const std::string &cmd) {
  FILE *p = popen(cmd.c_str(), "r");
  ProtocRun r{-1, ""};
  if (!p) return r;
  char buf[4096];
  size_t k;
  while ((k = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, k);
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// Writes the files, runs protoc with the plugin on the first, returns status and stderr.
ProtocRun protoc(const std::vector<std::pair<std::string, std::string>> &files) {
  static int n;
  std::string dir = tmpdir() + "/case" + std::to_string(++n);
  mkdir(dir.c_str(), 0777);
  mkdir((dir + "/out").c_str(), 0777);
  for (auto &f : files) std::ofstream(dir + "/" + f.first) << f.second;
  std::string cmd = "cd " + dir + " && timeout 60 protoc -I. -I/usr/include --plugin=protoc-gen-cxrpc=" +
                    plugin_path() + " --cxrpc_out=out " + files[0].first + " 2>&1";
  return run(cmd);
}

void expect_error(const std::string &proto, const std::vector<std::string> &needles,
                  const std::vector<std::pair<std::string, std::string>> &more = {}) {
  std::vector<std::pair<std::string, std::string>> files = {{"bad.proto", proto}};
  files.insert(files.end(), more.begin(), more.end());
  ProtocRun r = protoc(files);
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("bad.proto"), std::string::npos) << r.out;
  for (auto &n : needles) EXPECT_NE(r.out.find(n), std::string::npos) << "want '" << n << "' in: " << r.out;
}

TEST(Plugin, GeneratesAGoodFile) {
  ProtocRun r = protoc({{"good.proto",
                   "syntax = \"proto3\";\npackage g;\nmessage A { string s = 1; repeated A kids = 2; }\n"
                   "service S { rpc M(A) returns (A); }\n"}});
  EXPECT_EQ(r.status, 0) << r.out;
  struct stat st;
  std::string d = tmpdir() + "/case1/out/";
  EXPECT_EQ(stat((d + "good.cxr.h").c_str(), &st), 0);
  EXPECT_EQ(stat((d + "good.cxr.c").c_str(), &st), 0);
}

TEST(Plugin, StreamingIsRefused) {
  expect_error("syntax = \"proto3\";\npackage p;\nmessage A {}\nservice Svc { rpc Up(stream A) returns (A); }\n",
               {"method p.Svc.Up", "streaming RPCs are not supported", "client"});
  expect_error("syntax = \"proto3\";\npackage p;\nmessage A {}\nservice Svc { rpc Down(A) returns (stream A); }\n",
               {"method p.Svc.Down", "server streaming"});
}

TEST(Plugin, GroupsAreRefused) {
  expect_error("syntax = \"proto2\";\npackage p;\nmessage M { optional group G = 1 { optional int32 a = 2; } }\n",
               {"field p.M.g", "groups are not supported"});
}

// cxrpc_proto_library's step (idl/protoc_gen.sh) on a group: the plugin's error, not
// protoc-c's crash (protoc-c 1.4.1 segfaults on groups and ran first).
TEST(Plugin, TheBuildStepGivesThePluginsErrorFirst) {
  std::string dir = tmpdir() + "/gen_step";
  mkdir(dir.c_str(), 0777);
  mkdir((dir + "/out").c_str(), 0777);
  std::ofstream(dir + "/bad.proto")
      << "syntax = \"proto2\";\npackage p;\n"
         "message M { optional group G = 1 { optional int32 a = 2; } }\n";
  ProtocRun r = run("cd " + dir + " && timeout 60 sh " + runfile("idl/protoc_gen.sh") + " " +
                    plugin_path() + " out bad.proto 2>&1");
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("groups are not supported"), std::string::npos) << r.out;
}

TEST(Plugin, ExtensionsAreRefused) {
  expect_error("syntax = \"proto2\";\npackage p;\nmessage M { extensions 100 to 200; }\n"
               "extend M { optional int32 x = 100; }\n",
               {"extensions"});
  expect_error("syntax = \"proto2\";\npackage p;\nmessage M { extensions 100 to 200; }\n"
               "message N { extend M { optional int32 y = 101; } }\n",
               {"message p.N", "extensions"});
}

TEST(Plugin, DefaultValuesAreRefused) {
  expect_error("syntax = \"proto2\";\npackage p;\nmessage M { optional int32 a = 1 [default = 5]; }\n",
               {"field p.M.a", "default values"});
}

TEST(Plugin, Proto3OptionalIsRefused) {
  expect_error("syntax = \"proto3\";\npackage p;\nmessage M { optional int32 a = 1; }\n",
               {"field p.M.a", "proto3 'optional' is not supported"});
}

TEST(Plugin, WellKnownTypesAreRefused) {
  expect_error("syntax = \"proto3\";\npackage p;\nimport \"google/protobuf/timestamp.proto\";\n"
               "message M { google.protobuf.Timestamp t = 1; }\n",
               {"field p.M.t", "well-known type google.protobuf.Timestamp"});
}

TEST(Plugin, CollidingCNamesAreRefused) {
  // p.A_B and p.A.B would both be p_A_B in C.
  expect_error("syntax = \"proto3\";\npackage p;\nmessage A_B {}\nmessage A { message B {} }\n",
               {"p_A_B", "message p.A.B", "message p.A_B"});
  // A nested type named like a generated function.
  expect_error("syntax = \"proto3\";\npackage p;\nmessage M { message new {} }\n", {"p_M_new"});
  // Members: a field has_x next to an optional x.
  expect_error("syntax = \"proto2\";\npackage p;\nmessage M { optional int32 x = 1; optional int32 has_x = 2; }\n",
               {"message p.M", "has_x"});
  // Predefined macros as field names.
  expect_error("syntax = \"proto3\";\npackage p;\nmessage M { int32 unix = 1; }\n", {"field p.M.unix", "macro"});
}

// Without a package a message's C name is its bare name, which protoc-c's struct takes too.
TEST(Plugin, AFileWithoutAPackageIsRefused) {
  expect_error("syntax = \"proto3\";\nmessage Hello { int32 x = 1; }\n",
               {"cxrpc needs a package line"});
  expect_error("syntax = \"proto3\";\nmessage bool {}\n", {"cxrpc needs a package line"});
  // An imported file needs one too: its types appear in the importer's C.
  ProtocRun r = protoc({{"top.proto", "syntax = \"proto3\";\npackage t;\nimport \"dep.proto\";\n"
                                      "message T { D d = 1; }\n"},
                        {"dep.proto", "syntax = \"proto3\";\nmessage D { int32 x = 1; }\n"}});
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("dep.proto: cxrpc needs a package line"), std::string::npos) << r.out;
}

// protoc-c's struct has members of its own; two equal names there break its header.
TEST(Plugin, NamesThatMeetInProtocCsStructAreRefused) {
  expect_error("syntax = \"proto3\";\npackage p;\nmessage M { int32 base = 1; }\n",
               {"message p.M", "'base'", "field base"});
  expect_error("syntax = \"proto3\";\npackage p;\n"
               "message M { repeated int32 x = 1; int32 n_x = 2; }\n",
               {"message p.M", "'n_x'", "field n_x", "repeated field x"});
  expect_error("syntax = \"proto2\";\npackage p;\n"
               "message M { optional int32 X = 1; optional int32 has_x = 2; }\n",
               {"message p.M", "'has_x'", "field has_x", "optional field X"});
  expect_error("syntax = \"proto3\";\npackage p;\n"
               "message M { oneof MyOne { int32 a = 1; } int32 my_one_case = 2; }\n",
               {"message p.M", "'my_one_case'", "oneof MyOne", "field my_one_case"});
  // (proto3 refuses these itself: their JSON names meet)
  expect_error("syntax = \"proto2\";\npackage p;\n"
               "message M { required int32 Foo = 1; required int32 foo = 2; }\n",
               {"message p.M", "'foo'", "field Foo", "field foo"});
}

// protoc-c writes a method's member of <Svc>_Service lower-cased and unescaped.
TEST(Plugin, MethodsProtocCCannotNameAreRefused) {
  const std::string head = "syntax = \"proto3\";\npackage p;\nmessage A {}\nservice S {\n";
  for (const char *kw :
       {"Register", "Continue", "Default", "Return", "Switch", "Do", "Unix", "Bool"}) {
    std::string lower = kw;
    lower[0] = (char)tolower(lower[0]);
    expect_error(head + "  rpc " + kw + "(A) returns (A);\n}\n",
                 {std::string("method p.S/") + kw, "'" + lower + "'", "C keyword"});
  }
  expect_error(head + "  rpc FooBar(A) returns (A);\n  rpc foo_bar(A) returns (A);\n}\n",
               {"service p.S", "'foo_bar'", "method FooBar", "method foo_bar"});
  expect_error(head + "  rpc Base(A) returns (A);\n}\n", {"service p.S", "'base'"});
  // C++-only keywords are fine: the .cxr.h does not include protoc-c's header.
  ProtocRun r = protoc(
      {{"cxx.proto", head + "  rpc Delete(A) returns (A);\n  rpc New(A) returns (A);\n}\n"}});
  EXPECT_EQ(r.status, 0) << r.out;
}

TEST(Plugin, CollidingServiceNamesAreRefused) {
  // A message named like a method's static result helper (p_S_M__result).
  expect_error("syntax = \"proto3\";\npackage p;\nmessage A {}\nmessage S_M__result {}\n"
               "service S { rpc M(A) returns (A); }\n",
               {"p_S_M__result", "method p.S/M", "message p.S_M__result"});
  // Two methods whose handler members meet once escaped: new -> new_.
  expect_error("syntax = \"proto3\";\npackage p;\nmessage A {}\n"
               "service S { rpc new(A) returns (A); rpc new_(A) returns (A); }\n",
               {"service p.S", "methods new and new_", "'new_'", "p_S_handlers"});
}

TEST(Plugin, ImportsOfOtherFilesWork) {
  ProtocRun r = protoc({{"top.proto", "syntax = \"proto3\";\npackage t;\nimport \"dep.proto\";\nmessage T { d.D d = 1; }\n"},
                  {"dep.proto", "syntax = \"proto3\";\npackage d;\nmessage D { int32 x = 1; }\n"}});
  EXPECT_EQ(r.status, 0) << r.out;
}

// ---- the generator as a library, on malformed requests ----

std::vector<uint8_t> pack(Google__Protobuf__Compiler__CodeGeneratorRequest *rq) {
  std::vector<uint8_t> b(google__protobuf__compiler__code_generator_request__get_packed_size(rq));
  google__protobuf__compiler__code_generator_request__pack(rq, b.data());
  return b;
}

std::string run_error(const std::vector<uint8_t> &req) {
  uint8_t *out = nullptr;
  size_t n = 0;
  EXPECT_EQ(cxr_gen_run(req.data(), req.size(), &out, &n), 0);
  Google__Protobuf__Compiler__CodeGeneratorResponse *r =
      google__protobuf__compiler__code_generator_response__unpack(nullptr, n, out);
  free(out);
  EXPECT_NE(r, nullptr);
  std::string e = r && r->error ? r->error : "";
  google__protobuf__compiler__code_generator_response__free_unpacked(r, nullptr);
  return e;
}

TEST(Generator, MalformedRequestsGiveErrors) {
  EXPECT_NE(run_error({0xff, 0xff, 0xff}).find("cannot decode"), std::string::npos);
  EXPECT_NE(run_error({}).find("no file"), std::string::npos);

  Google__Protobuf__Compiler__CodeGeneratorRequest rq =
      GOOGLE__PROTOBUF__COMPILER__CODE_GENERATOR_REQUEST__INIT;
  Google__Protobuf__FileDescriptorProto fd = GOOGLE__PROTOBUF__FILE_DESCRIPTOR_PROTO__INIT;
  Google__Protobuf__FileDescriptorProto *fds[] = {&fd};
  char *gen[] = {(char *)"x.proto"};
  rq.n_proto_file = 1, rq.proto_file = fds;
  rq.n_file_to_generate = 1, rq.file_to_generate = gen;
  // No file name.
  EXPECT_NE(run_error(pack(&rq)).find("name"), std::string::npos);
  fd.name = (char *)"x.proto";
  // No package.
  EXPECT_NE(run_error(pack(&rq)).find("needs a package line"), std::string::npos);
  fd.package = (char *)"x";
  // A field whose type points nowhere.
  Google__Protobuf__DescriptorProto md = GOOGLE__PROTOBUF__DESCRIPTOR_PROTO__INIT;
  Google__Protobuf__DescriptorProto *mds[] = {&md};
  Google__Protobuf__FieldDescriptorProto f = GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__INIT;
  Google__Protobuf__FieldDescriptorProto *fs[] = {&f};
  md.name = (char *)"M";
  md.n_field = 1, md.field = fs;
  f.name = (char *)"f";
  f.has_number = 1, f.number = 1;
  f.has_label = 1, f.label = GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__LABEL__LABEL_OPTIONAL;
  f.has_type = 1, f.type = GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__TYPE__TYPE_MESSAGE;
  f.type_name = (char *)".nowhere.X";
  fd.n_message_type = 1, fd.message_type = mds;
  EXPECT_NE(run_error(pack(&rq)).find("unknown type '.nowhere.X'"), std::string::npos);
  // A file name that would break an #include line.
  fd.name = (char *)"x\".proto";
  gen[0] = fd.name;
  EXPECT_NE(run_error(pack(&rq)).find("unusable name"), std::string::npos);
  // An oneof index out of bounds.
  fd.name = gen[0] = (char *)"x.proto";
  f.type = GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__TYPE__TYPE_INT32;
  f.has_oneof_index = 1, f.oneof_index = 3;
  EXPECT_NE(run_error(pack(&rq)).find("oneof"), std::string::npos);
  f.has_oneof_index = 0;
  // And now a valid request.
  EXPECT_EQ(run_error(pack(&rq)), "");
}

TEST(Generator, RandomMutationsOfARealRequestNeverCrash) {
  // Build a real request through the library, then flip bytes: errors or output, no crash
  // (the libFuzzer target in tests/fuzz goes much further).
  Google__Protobuf__Compiler__CodeGeneratorRequest rq =
      GOOGLE__PROTOBUF__COMPILER__CODE_GENERATOR_REQUEST__INIT;
  Google__Protobuf__FileDescriptorProto fd = GOOGLE__PROTOBUF__FILE_DESCRIPTOR_PROTO__INIT;
  Google__Protobuf__FileDescriptorProto *fds[] = {&fd};
  char *gen[] = {(char *)"y.proto"};
  fd.name = gen[0];
  fd.package = (char *)"pk";
  Google__Protobuf__DescriptorProto md = GOOGLE__PROTOBUF__DESCRIPTOR_PROTO__INIT;
  Google__Protobuf__DescriptorProto *mds[] = {&md};
  Google__Protobuf__FieldDescriptorProto f1 = GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__INIT,
                                         f2 = GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__INIT;
  Google__Protobuf__FieldDescriptorProto *fs[] = {&f1, &f2};
  md.name = (char *)"M";
  md.n_field = 2, md.field = fs;
  f1.name = (char *)"s", f1.has_number = 1, f1.number = 1, f1.has_label = 1, f1.label = GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__LABEL__LABEL_REPEATED;
  f1.has_type = 1, f1.type = GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__TYPE__TYPE_STRING;
  f2.name = (char *)"m", f2.has_number = 1, f2.number = 2, f2.has_label = 1, f2.label = GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__LABEL__LABEL_OPTIONAL;
  f2.has_type = 1, f2.type = GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__TYPE__TYPE_MESSAGE;
  f2.type_name = (char *)".pk.M";
  fd.n_message_type = 1, fd.message_type = mds;
  rq.n_proto_file = 1, rq.proto_file = fds;
  rq.n_file_to_generate = 1, rq.file_to_generate = gen;
  std::vector<uint8_t> good = pack(&rq);
  EXPECT_EQ(run_error(good), "");
  std::mt19937 rng(1);
  for (int i = 0; i < 3000; i++) {
    std::vector<uint8_t> b = good;
    for (int k = 0; k < 1 + (int)(rng() % 4); k++) b[rng() % b.size()] = (uint8_t)rng();
    uint8_t *out = nullptr;
    size_t n = 0;
    ASSERT_EQ(cxr_gen_run(b.data(), b.size(), &out, &n), 0);
    free(out);
  }
}

}  // namespace

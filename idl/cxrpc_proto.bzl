"""cxrpc_proto_library: a .proto file to a cc_library of generated cxrpc code.

    load("//idl:cxrpc_proto.bzl", "cxrpc_proto_library")
    cxrpc_proto_library(name = "kv_proto", src = "kv.proto")
    cxrpc_proto_library(name = "app_proto", src = "app.proto", deps = [":kv_proto"])

`src` is one .proto file of this package; imports are written from the workspace root
(import "examples/kv/kv.proto";) and each imported file needs its own
cxrpc_proto_library in `deps` (labels with an explicit ":name").

It runs protoc with protoc-gen-cxrpc (foo.cxr.h/.c), then protoc-c (protobuf-c structs:
foo.pb-c.h/.c) in one genrule (idl/protoc_gen.sh): the plugin's errors come first.
Include "<package>/foo.cxr.h". The generated cxrpc code builds with -Wall -Wextra
-Werror; protoc-c's own code is compiled in a separate library with its warnings left
alone.
"""

load("//:cxrpc.bzl", "CXR_COPTS")

def cxrpc_proto_library(name, src, deps = [], visibility = None, testonly = False):
    if not src.endswith(".proto"):
        fail("cxrpc_proto_library: src must be a .proto file")
    base = src[:-len(".proto")]
    native.filegroup(
        name = name + "_protos",
        srcs = [src] + [d + "_protos" for d in deps],
        visibility = visibility,
        testonly = testonly,
    )
    plugin = "//idl:protoc-gen-cxrpc"
    script = "//idl:protoc_gen.sh"
    native.genrule(
        name = name + "_gen",
        srcs = [src, ":" + name + "_protos"],
        outs = [base + ".pb-c.c", base + ".pb-c.h", base + ".cxr.c", base + ".cxr.h"],
        tools = [plugin, script],
        cmd = "sh $(location {script}) $(location {plugin}) $(GENDIR) $(location {src})".format(
            script = script,
            plugin = plugin,
            src = src,
        ),
        testonly = testonly,
    )
    native.cc_library(
        name = name + "_pbc",
        srcs = [base + ".pb-c.c"],
        hdrs = [base + ".pb-c.h"],
        linkopts = ["-lprotobuf-c"],
        deps = [d + "_pbc" for d in deps],
        visibility = visibility,
        testonly = testonly,
    )
    native.cc_library(
        name = name,
        srcs = [base + ".cxr.c"],
        hdrs = [base + ".cxr.h"],
        # Strict on purpose: generated code must not warn (no -Wno-unused-parameter).
        copts = ["-Wall", "-Wextra", "-Werror"],
        deps = deps + [":" + name + "_pbc", "//idl"],
        visibility = visibility,
        testonly = testonly,
    )

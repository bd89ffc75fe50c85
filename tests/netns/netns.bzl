"""The one rule shape of the multi-host suites, so each BUILD entry says only what differs."""

load("//:cxrpc.bzl", "cxr_test")
load("//tests/rdma:ucx_env.bzl", "ucx_test_env")

def netns_test(name, peers, deps = [], data = []):
    """The suite name + ".cc" on the fixture of fixture.h, its actors the binaries `peers`, each
    run in a namespace: UCX over TCP on the veth "cx0", outside Bazel's sandbox (there
    `ip netns add` fails), and alone ("exclusive"): several processes of UCX over TCP with
    keepalive timeouts fail spuriously when other suites load the two cores at once."""
    cxr_test(
        name = name,
        srcs = [name + ".cc"],
        data = peers + data,
        env = ucx_test_env("cx0"),
        tags = ["no-sandbox", "exclusive"],
        deps = [":fixture"] + deps,
    )

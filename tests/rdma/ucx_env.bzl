"""The environment of every test process that talks UCX (tests/rdma on loopback, tests/netns on
the veth of each namespace): one list, so the two kinds of suite cannot drift apart."""

def ucx_test_env(device):
    """UCX over TCP on `device` only (without UCX_TLS=tcp UCX would use shared memory between
    processes of one machine). UCX's malloc/mmap hooks are off: they patch the allocator, which
    clashes with the sanitizers' interceptors, and cxrpc needs no memory-type cache."""
    return {
        "UCX_TLS": "tcp",
        "UCX_NET_DEVICES": device,
        "UCX_MEM_MALLOC_HOOKS": "no",
        "UCX_MEM_MMAP_HOOK_MODE": "none",
        "UCX_WARN_UNUSED_ENV_VARS": "n",
        # A server restarted on its port does not wait for the old connections' TIME_WAIT.
        "UCX_TCP_CM_REUSEADDR": "y",
        # UCX logs to stdout by default: keep its lines out of the peers' answer lines. The
        # keyword, not /dev/stderr: UCX opens a path for writing, which truncated test.log (the
        # test's own stderr) and hid everything printed before.
        "UCX_LOG_FILE": "stderr",
    }

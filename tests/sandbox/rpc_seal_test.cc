// Sealed calls and sandboxed handlers through the rpc layer (rpc/seal_glue.c): a channel
// served on background threads and a client connection, in one process (the seal check
// still asks the kernel about the client's pages, here our own).
#include <gtest/gtest.h>

#include "tests/root.h"
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <seccomp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>
#include <sys/stat.h>

#include <atomic>
#include <string>
#include <thread>

#include <cxrpc/seal.h>

#include "rpc/internal.h"

namespace {

enum { M_SUM = 1, M_POKE = 2, M_FOLLOW = 3, M_OPEN = 4, M_HOLD = 5 };

// Tries to open a file from the handler: 0 if it could, else -errno.
int h_open(cxr_call *call, const void *args, void **result, void *user) {
  int fd = open("/proc/self/status", O_RDONLY);
  if (fd < 0) return errno == EPERM ? CXR_EPERM : CXR_EIO;
  close(fd);
  return 0;
}

std::atomic<int> g_handler_check{-1}, g_handler_write{-1};

// Holds its (sealed) argument until the test lets go, at most 10 s.
std::atomic<int> g_held{0}, g_let_go{0};
int h_hold(cxr_call *call, const void *args, void **result, void *user) {
  g_held = 1;
  for (int i = 0; i < 100000 && !g_let_go; i++) usleep(100);
  return 0;
}

// Sums the bytes of the sealed argument; records whether the seal covers them and whether
// the argument is read-only while the handler runs.
int store_one(void *p) {
  *(volatile char *)p = 1;
  return 0;
}
int h_sum(cxr_call *call, const void *args, void **result, void *user) {
  size_t n = cxr_call_arg_len(call);
  g_handler_check = cxr_call_check_sealed(call, args, n);
  g_handler_write = cxr_sandbox_run(store_one, (void *)args);
  const unsigned char *b = (const unsigned char *)args;
  uint64_t s = 0;
  for (size_t i = 0; i < n; i++) s += b[i];
  uint64_t *r = (uint64_t *)cxr_heap_alloc(cxr_call_heap(call), sizeof *r);
  if (!r) return CXR_ENOMEM;
  *r = s;
  *result = r;
  return 0;
}
// Follows the pointer the caller put in its argument, without checking it (bad handler).
__attribute__((no_sanitize("address", "undefined", "thread"))) int h_follow(
    cxr_call *call, const void *args, void **result, void *user) {
  const volatile int *p = *(const volatile int *const *)args;
  return *p == 7 ? 0 : 1;
}

// Makes seccomp filters fail to load on the calling thread and the threads it creates (a
// kernel that refuses the workers' policy).
bool deny_seccomp() {
  scmp_filter_ctx f = seccomp_init(SCMP_ACT_ALLOW);
  if (!f) return false;
  bool ok = seccomp_rule_add(f, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(seccomp), 0) == 0 &&
            seccomp_rule_add(f, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(prctl), 1,
                             SCMP_A0(SCMP_CMP_EQ, PR_SET_SECCOMP)) == 0 &&
            seccomp_attr_set(f, SCMP_FLTATR_CTL_TSYNC, 0) == 0 && seccomp_load(f) == 0;
  seccomp_release(f);
  return ok;
}

// Heap files of the root whose name contains `part` (not those an unlink moved aside as
// ".<name>.<generation>.unlinked": they go when their last user unmaps them).
int files_named(const std::string &dir, const std::string &part) {
  int n = 0;
  DIR *d = opendir(dir.c_str());
  if (!d) return -1;
  while (struct dirent *e = readdir(d))
    n += e->d_name[0] != '.' && strstr(e->d_name, part.c_str()) != nullptr;
  closedir(d);
  return n;
}

// A descriptor claiming CXR_CALL_SEAL with `seal` for 64 bytes at p (raw ring access: what
// a hostile client could write).
cxr__desc sealed_desc(uint64_t call_id, uint32_t method, uint32_t seal, const void *p) {
  cxr__desc d;
  memset(&d, 0, sizeof d);
  d.call_id = call_id;
  d.method = method;
  d.flags = CXR_CALL_SEAL;
  d.seal = seal;
  d.ptr = (uint64_t)(uintptr_t)p;
  d.len = 64;
  return d;
}

struct RpcSeal : ::testing::Test {
  std::string name, root;
  cxr_channel *ch = nullptr;
  cxr_conn *c = nullptr;
  // An open channel with the handlers registered, not started.
  void open_channel(bool untrusted, const char *batch, unsigned workers = 1) {
    static int n;
    root = cxrt::setup_root("rpcseal");
    ASSERT_TRUE(batch ? cxrt::setenv_alone("CXRPC_SEAL_BATCH", batch)
                      : cxrt::unsetenv_alone("CXRPC_SEAL_BATCH"));
    name = "sl" + std::to_string(getpid() % 100000) + "-" + std::to_string(++n);
    cxr_channel_opts o;
    cxr_channel_opts_init(&o);
    o.untrusted = untrusted;
    o.conn_heap_size = 8u << 20;
    o.max_conns = 4;
    o.pool = 1;
    o.workers = workers;
    ASSERT_EQ(cxr_channel_open(&ch, name.c_str(), &o), 0);
    ASSERT_EQ(cxr_channel_on(ch, M_SUM, h_sum, nullptr), 0);
    ASSERT_EQ(cxr_channel_on(ch, M_FOLLOW, h_follow, nullptr), 0);
    ASSERT_EQ(cxr_channel_on(ch, M_OPEN, h_open, nullptr), 0);
    ASSERT_EQ(cxr_channel_on(ch, M_HOLD, h_hold, nullptr), 0);
  }
  void open(bool untrusted, const char *batch, unsigned workers = 1) {
    open_channel(untrusted, batch, workers);
    ASSERT_EQ(cxr_channel_start(ch), 0);
    ASSERT_EQ(cxr_connect(&c, name.c_str(), nullptr), 0);
  }
  // CXRPC_SANDBOX_THREADS=1 for this test's channel. Read when the channel opens, and set
  // and cleared while no thread of ours runs: cleared right after the open, it raced the
  // workers' and the seal helper's getenv (setenv may move environ under them).
  bool sandbox_threads = false;
  void restrict_workers() {
    ASSERT_TRUE(cxrt::setenv_alone("CXRPC_SANDBOX_THREADS", "1"));
    sandbox_threads = true;
  }
  void TearDown() override {
    cxr_conn_close(c);
    cxr_channel_close(ch);
    if (sandbox_threads) {
      EXPECT_TRUE(cxrt::unsetenv_alone("CXRPC_SANDBOX_THREADS")) << "threads outlived the close";
    }
  }
  // A sealed call on a fresh page holding v: the handler sums it.
  void sum_one_page(unsigned char v) {
    unsigned char *a = (unsigned char *)cxr_heap_alloc_pages(cxr_conn_heap(c), 4096);
    ASSERT_NE(a, nullptr);
    a[0] = v;
    uint64_t sum = 0;
    ASSERT_EQ(call_sum(a, 1, &sum), 0);
    EXPECT_EQ(sum, v);
    cxr_heap_free(cxr_conn_heap(c), a);
  }
  int call_sum(void *args, size_t len, uint64_t *out, unsigned flags = CXR_CALL_SEAL) {
    cxr_call_opts o;
    cxr_call_opts_init(&o);
    o.flags = flags;
    o.arg_len = len;
    void *r = nullptr;
    int rc = cxr_conn_call(c, M_SUM, args, &r, &o);
    if (rc == 0 && r) *out = *(uint64_t *)r;
    if (r) cxr_heap_free(cxr_conn_heap(c), r);
    return rc;
  }
};

TEST_F(RpcSeal, SealedCallIsCheckedReadOnlyAndReleased) {
  open(false, "1");
  unsigned char *a = (unsigned char *)cxr_heap_alloc_pages(cxr_conn_heap(c), 2 * 4096);
  ASSERT_NE(a, nullptr);
  memset(a, 1, 5000);
  uint64_t sum = 0;
  ASSERT_EQ(call_sum(a, 5000, &sum), 0);
  EXPECT_EQ(sum, 5000u);
  EXPECT_EQ(g_handler_check.load(), 0);               // the handler saw a checked seal
  EXPECT_EQ(g_handler_write.load(), CXR_EBADPTR);     // and read-only arguments
  a[0] = 2;                                           // batch 1: writable again at once
  cxr_seal_stats st;
  ASSERT_EQ(cxr_conn_seal_stats(c, &st), 0);
  EXPECT_EQ(st.seals, 1u);
  EXPECT_EQ(st.releases, 1u);
  // Unsealed calls are not "sealed" to the handler.
  ASSERT_EQ(call_sum(a, 10, &sum, 0), 0);
  EXPECT_EQ(g_handler_check.load(), CXR_ENOTSEALED);
  cxr_heap_free(cxr_conn_heap(c), a);
}

TEST_F(RpcSeal, BatchedReleaseKeepsPagesReadOnlyUntilTheSweep) {
  open(false, "4");
  unsigned char *p[4];
  for (int i = 0; i < 4; i++) {
    p[i] = (unsigned char *)cxr_heap_alloc_pages(cxr_conn_heap(c), 4096);
    ASSERT_NE(p[i], nullptr);
    p[i][0] = 3;
  }
  uint64_t sum = 0;
  for (int i = 0; i < 3; i++) ASSERT_EQ(call_sum(p[i], 1, &sum), 0);
  EXPECT_EQ(cxr_sandbox_run(store_one, p[0]), CXR_EBADPTR);  // released, not swept
  ASSERT_EQ(call_sum(p[3], 1, &sum), 0);                      // the 4th release sweeps
  for (int i = 0; i < 4; i++) EXPECT_EQ(cxr_sandbox_run(store_one, p[i]), 0);
  // Calling again with pages whose release is pending sweeps them first.
  ASSERT_EQ(call_sum(p[0], 1, &sum), 0);
  ASSERT_EQ(call_sum(p[0], 1, &sum), 0);
  ASSERT_EQ(cxr_conn_seal_flush(c), 0);
  EXPECT_EQ(cxr_sandbox_run(store_one, p[0]), 0);
}

TEST_F(RpcSeal, AnOversizedBatchTakesTheDefaultNotRefused) {
  // Over what a table takes (2^20): once every sealed call failed with CXR_EINVAL, then it
  // was clamped to 2^20; now it is the default (1024) with a warning, like every bad number.
  open(false, "2000000");
  ASSERT_NO_FATAL_FAILURE(sum_one_page(5));
  cxr_seal_stats st;
  ASSERT_EQ(cxr_conn_seal_stats(c, &st), 0);
  EXPECT_EQ(st.pending, 1u);  // batched, not swept at once
}

TEST_F(RpcSeal, ArgumentsMustStartOnAPage) {
  open(false, "1");
  void *a = cxr_heap_alloc(cxr_conn_heap(c), 64);
  uint64_t sum;
  EXPECT_EQ(call_sum((char *)a + 16, 8, &sum), CXR_EINVAL);
  cxr_heap_free(cxr_conn_heap(c), a);
}

TEST_F(RpcSeal, FalseSealClaimIsRejected) {
  open(false, "1");
  // A descriptor that claims CXR_CALL_SEAL for pages nobody sealed (raw ring access: what a
  // hostile client could write).
  unsigned char *a = (unsigned char *)cxr_heap_alloc_pages(cxr_conn_heap(c), 4096);
  ASSERT_NE(a, nullptr);
  cxr__desc d = sealed_desc((1ull << 32) | 0, M_SUM, (1u << 20) | 3, a);
  ASSERT_EQ(cxr__conn_push_raw(c, &d), 0);
  cxr__desc r;
  ASSERT_EQ(cxr__conn_pop_raw(c, &r, 5000000000ll), 0);
  EXPECT_EQ(r.status, CXR_ENOTSEALED);
  d.seal = 0;  // "sealed" with no seal at all
  d.call_id = (1ull << 32) | 1;
  ASSERT_EQ(cxr__conn_push_raw(c, &d), 0);
  ASSERT_EQ(cxr__conn_pop_raw(c, &r, 5000000000ll), 0);
  EXPECT_EQ(r.status, CXR_ENOTSEALED);
}

TEST_F(RpcSeal, UntrustedHandlerFaultBecomesEBADPTRAndServingGoesOn) {
  open(true, "1024");
  const int **arg = (const int **)cxr_heap_alloc_pages(cxr_conn_heap(c), 4096);
  ASSERT_NE(arg, nullptr);
  static int seven = 7;
  cxr_call_opts o;
  cxr_call_opts_init(&o);
  o.arg_len = sizeof *arg;
  void *r = nullptr;
  const uintptr_t bad[] = {0, 16, 0xffff888000000000ull};
  for (int round = 0; round < 3; round++) {
    for (uintptr_t b : bad) {
      *arg = (const int *)b;
      EXPECT_EQ(cxr_conn_call(c, M_FOLLOW, arg, &r, &o), CXR_EBADPTR);
    }
    *arg = &seven;  // a good call right after: the server still serves
    EXPECT_EQ(cxr_conn_call(c, M_FOLLOW, arg, &r, &o), 0);
  }
  // Sealed and sandboxed together.
  o.flags = CXR_CALL_SEAL;
  *arg = nullptr;
  EXPECT_EQ(cxr_conn_call(c, M_FOLLOW, arg, &r, &o), CXR_EBADPTR);
  ASSERT_EQ(cxr_conn_seal_flush(c), 0);
  *arg = &seven;
  EXPECT_EQ(cxr_conn_call(c, M_FOLLOW, arg, &r, &o), 0);
}

TEST_F(RpcSeal, RestrictedWorkersCannotOpenFilesButKeepServing) {
  ASSERT_NO_FATAL_FAILURE(restrict_workers());
  open(true, "1");
  void *r = nullptr;
  for (int i = 0; i < 20; i++) EXPECT_EQ(cxr_conn_call(c, M_OPEN, nullptr, &r, nullptr), CXR_EPERM);
  unsigned char *a = (unsigned char *)cxr_heap_alloc_pages(cxr_conn_heap(c), 4096);
  ASSERT_NE(a, nullptr);
  a[0] = 4;
  uint64_t sum = 0;
  ASSERT_EQ(call_sum(a, 1, &sum), 0);  // sealed calls still work on restricted workers
  EXPECT_EQ(sum, 4u);
}

TEST_F(RpcSeal, ServeLeavesTheCallersThreadUnrestricted) {
  ASSERT_NO_FATAL_FAILURE(restrict_workers());
  open_channel(true, "1");
  int serve_rc = 1, open_rc = 1, unlink_rc = 1;
  std::string probe = root + "/probe";
  ::close(::open(probe.c_str(), O_CREAT | O_WRONLY, 0600));
  std::thread app([&] {  // the application's thread (main, say): serves, then goes on
    serve_rc = cxr_channel_serve(ch);
    int fd = ::open("/proc/self/status", O_RDONLY);
    open_rc = fd >= 0 ? 0 : -errno;
    if (fd >= 0) ::close(fd);
    unlink_rc = ::unlink(probe.c_str()) == 0 ? 0 : -errno;
    cxr_channel_close(ch);
  });
  ASSERT_EQ(cxr_connect(&c, name.c_str(), nullptr), 0);
  void *r = nullptr;
  EXPECT_EQ(cxr_conn_call(c, M_OPEN, nullptr, &r, nullptr), CXR_EPERM);  // a worker's policy
  cxr_conn_close(c);
  c = nullptr;
  cxr_channel_stop(ch);
  app.join();
  ch = nullptr;
  EXPECT_EQ(serve_rc, 0);
  EXPECT_EQ(open_rc, 0) << "the thread that called serve is still restricted";
  EXPECT_EQ(unlink_rc, 0);
  EXPECT_EQ(files_named(root, name), 0) << "the close left heap files behind";
}

TEST_F(RpcSeal, AWorkerTheKernelWillNotRestrictRefusesUntrustedCalls) {
  ASSERT_NO_FATAL_FAILURE(restrict_workers());
  open_channel(true, "1");
  bool denied = false;
  int start_rc = 1;
  std::thread([&] {  // the workers inherit this thread's filter
    denied = deny_seccomp();
    start_rc = cxr_channel_start(ch);
  }).join();
  ASSERT_TRUE(denied);
  ASSERT_EQ(start_rc, 0);
  ASSERT_EQ(cxr_connect(&c, name.c_str(), nullptr), 0);
  unsigned char *a = (unsigned char *)cxr_heap_alloc_pages(cxr_conn_heap(c), 4096);
  ASSERT_NE(a, nullptr);
  uint64_t sum = 0;
  EXPECT_EQ(call_sum(a, 1, &sum, 0), CXR_EPERM);  // not run with the process's rights
  EXPECT_EQ(call_sum(a, 1, &sum, 0), CXR_EPERM);  // nor on the next try
}

// A seal the server held when its call ended, and which it then lets go of without marking
// it done (here: a late check under another id of its slot, done as that id), is
// cancelled at the next retry, not forgotten with its pages read-only and its slot taken.
TEST_F(RpcSeal, AHeldSealTheServerLetsGoOfUndoneIsCancelled) {
  open(false, "1", 2);
  unsigned char *a = (unsigned char *)cxr_heap_alloc_pages(cxr_conn_heap(c), 4096);
  ASSERT_NE(a, nullptr);
  // A descriptor naming slot 0 (the next seal's) under a generation of its own, for pages
  // made read-only by hand: the server checks it and holds the slot while the handler runs.
  ASSERT_EQ(mprotect(a, 4096, PROT_READ), 0);
  g_held = 0, g_let_go = 0;
  cxr__desc d = sealed_desc((77ull << 32) | 5, M_HOLD, (100u << 20) | 0, a);
  ASSERT_EQ(cxr__conn_push_raw(c, &d), 0);
  for (int i = 0; i < 100000 && !g_held; i++) usleep(100);
  ASSERT_TRUE(g_held.load());
  uint64_t sum = 0;
  EXPECT_EQ(call_sum(a, 1, &sum), CXR_EBUSY);  // slot 0 is the server's: the seal is kept
  g_let_go = 1;
  cxr__desc r;
  ASSERT_EQ(cxr__conn_pop_raw(c, &r, 5000000000ll), 0);
  EXPECT_EQ(r.status, 0);
  ASSERT_EQ(cxr_conn_seal_flush(c), 0);  // retries the kept seal: never done, so cancelled
  EXPECT_EQ(cxr_sandbox_run(store_one, a), 0) << "the kept seal's pages stay read-only";
  cxr_seal_stats st;
  ASSERT_EQ(cxr_conn_seal_stats(c, &st), 0);
  EXPECT_EQ(st.live, 0u);
}

TEST_F(RpcSeal, ReconnectGetsAFreshTable) {
  open(false, "1");
  for (int i = 0; i < 5; i++) {
    ASSERT_NO_FATAL_FAILURE(sum_one_page(9));
    cxr_conn_close(c);
    c = nullptr;
    cxr_conn_opts co;  // a pool of 1: wait (up to 20 s) for the server to recycle the slot
    cxr_conn_opts_init(&co);
    co.connect_timeout_ns = 20000000000;
    ASSERT_EQ(cxr_connect(&c, name.c_str(), &co), 0);
  }
}

}  // namespace

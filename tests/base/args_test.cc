// Every public function of <cxrpc/cxrpc.h> given bad arguments: NULL for each pointer,
// sizes, indices and flags out of range, zeroed handles where that is safe to express.
// Each case asserts the code its header comment or man page documents (CXR_EINVAL and
// friends, or NULL / false with cxr_last_error() set). Functions that need a live object
// get a real one, made cheaply here: a heap, a channel serving one method on a connection,
// seal tables in this process, and two rdma engines talking over TCP on loopback.
#include <gtest/gtest.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <vector>

#include <cxrpc/cxrpc.h>
#include "shm/log.h"  // cxr__set_error: clears the last error between cases
#include "tests/rdma/proc.h"
#include "tests/root.h"

namespace {

const int64_t kSec = 1000000000;

std::string uniq(const char *base) {
  static int n;
  return std::string(base) + std::to_string(getpid() % 100000) + "-" + std::to_string(++n);
}

// A handle-sized block of zeros: what a closed or never-opened handle looks like to a
// function that checks its handles (heaps carry a magic number).
struct Zeroed {
  alignas(64) unsigned char bytes[4096] = {0};
  cxr_heap *heap() { return reinterpret_cast<cxr_heap *>(bytes); }
};

// A pointer-returning (or bool) function that fails: NULL (false) with `code` in
// cxr_last_error(), which is cleared first so that a stale code cannot pass.
#define EXPECT_NULL_WITH(expr, code)                   \
  do {                                                 \
    cxr__set_error(0);                                 \
    EXPECT_EQ((expr), nullptr) << #expr;               \
    EXPECT_EQ(cxr_last_error(), (code)) << #expr;      \
  } while (0)
#define EXPECT_FALSE_WITH(expr, code)                  \
  do {                                                 \
    cxr__set_error(0);                                 \
    EXPECT_FALSE(expr) << #expr;                       \
    EXPECT_EQ(cxr_last_error(), (code)) << #expr;      \
  } while (0)

class Args : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { cxrt::setup_root("args"); }
};

// ---------------------------------------------------------------------------- base.h

TEST_F(Args, BaseArgs) {
  EXPECT_STREQ(cxr_strerror(1), "unknown error");
  EXPECT_STREQ(cxr_strerror(CXR_ERRNO_MIN - 1), "unknown error");
  EXPECT_STREQ(cxr_strerror(INT_MIN), "unknown error");
  EXPECT_STREQ(cxr_strerror(INT_MAX), "unknown error");
  EXPECT_NE(cxr_strerror(0), nullptr);
  for (int e = CXR_ERRNO_MIN; e <= 0; e++) EXPECT_NE(cxr_strerror(e), nullptr) << e;
  EXPECT_GE(cxr_now_ns(), 0);
  int lvl = cxr_log_level();
  cxr_log_set_level(-1);
  EXPECT_EQ(cxr_log_level(), lvl);
  cxr_log_set_level(4);
  EXPECT_EQ(cxr_log_level(), lvl);
  cxr_log_set_level(INT_MIN);
  cxr_log_set_level(INT_MAX);
  EXPECT_EQ(cxr_log_level(), lvl);
  EXPECT_GE(cxr_log_level(), CXR_LOG_ERROR);
  EXPECT_LE(cxr_log_level(), CXR_LOG_DEBUG);
  cxr__set_error(CXR_EBUSY);
  EXPECT_EQ(cxr_last_error(), CXR_EBUSY);
}

// ---------------------------------------------------------------------------- shm.h

TEST_F(Args, RuntimeArgs) {
  cxr_init_opts_init(nullptr);  // no crash
  cxr_init_opts o;
  cxr_init_opts_init(&o);
  o.pod = o.pod_slices = 4;  // pod must be below pod_slices
  EXPECT_EQ(cxr_init(&o), CXR_EINVAL);
  cxr_init_opts_init(&o);
  o.window_base = 0x600000000001;  // not a multiple of 2 MiB
  o.window_size = 1ul << 30;
  EXPECT_EQ(cxr_init(&o), CXR_EINVAL);
  cxr_init_opts_init(&o);
  o.window_base = 0x7fff00000000;  // ends above 0x800000000000
  o.window_size = 1ul << 40;
  EXPECT_EQ(cxr_init(&o), CXR_EINVAL);
  cxr_init_opts_init(&o);
  o.pod = 0;
  o.pod_slices = 1u << 30;  // slices of less than 2 MiB
  EXPECT_EQ(cxr_init(&o), CXR_EINVAL);
  o.pod_slices = UINT_MAX;
  EXPECT_EQ(cxr_init(&o), CXR_EINVAL);
  EXPECT_EQ(cxr_init(nullptr), 0);  // defaults: sets the runtime up
  EXPECT_NE(cxr_root(), nullptr);
  uintptr_t base;
  size_t size;
  // Either out pointer may be NULL (cxr_window(3)).
  EXPECT_EQ(cxr_window(nullptr, nullptr), 0);
  EXPECT_EQ(cxr_window(&base, &size), 0);
  EXPECT_EQ(cxr_pod_slice(0, nullptr, nullptr), 0);
  EXPECT_EQ(cxr_pod_slice(16, &base, &size), CXR_EINVAL);
  EXPECT_EQ(cxr_pod_slice(UINT_MAX, &base, &size), CXR_EINVAL);
  EXPECT_EQ(cxr_pod_slice(CXR_POD_DEFAULT, &base, &size), CXR_EINVAL);
  EXPECT_EQ(cxr_pod_slice(0, &base, &size), 0);
}

TEST_F(Args, HeapArgs) {
  Zeroed z;
  cxr_heap_opts_init(nullptr);
  cxr_heap *h = reinterpret_cast<cxr_heap *>(1);
  std::string name = uniq("args-heap");
  // create
  EXPECT_EQ(cxr_heap_create(nullptr, name.c_str(), 1 << 20, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_heap_create(&h, nullptr, 1 << 20, nullptr), CXR_EINVAL);
  EXPECT_EQ(h, nullptr);
  EXPECT_EQ(cxr_heap_create(&h, "", 1 << 20, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_heap_create(&h, "a/b", 1 << 20, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_heap_create(&h, ".hidden", 1 << 20, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_heap_create(&h, std::string(64, 'x').c_str(), 1 << 20, nullptr),
            CXR_ENAMETOOLONG);
  EXPECT_EQ(cxr_heap_create(&h, name.c_str(), 0, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_heap_create(&h, name.c_str(), (128 << 10) - 1, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_heap_create(&h, name.c_str(), SIZE_MAX, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_heap_create(&h, name.c_str(), (16ul << 40) + 4096, nullptr), CXR_EINVAL);
  cxr_heap_opts ho;
  cxr_heap_opts_init(&ho);
  ho.addr = 0x600000000123;
  EXPECT_EQ(cxr_heap_create(&h, name.c_str(), 1 << 20, &ho), CXR_EINVAL);
  cxr_heap_opts_init(&ho);
  std::string long_path = "/tmp/" + std::string(300, 'p');
  ho.path = long_path.c_str();
  EXPECT_EQ(cxr_heap_create(&h, name.c_str(), 1 << 20, &ho), CXR_ENAMETOOLONG);
  // open / unlink
  EXPECT_EQ(cxr_heap_open(nullptr, name.c_str()), CXR_EINVAL);
  EXPECT_EQ(cxr_heap_open(&h, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_heap_open(&h, ""), CXR_EINVAL);
  EXPECT_EQ(cxr_heap_open(&h, "../x"), CXR_EINVAL);
  EXPECT_EQ(cxr_heap_open(&h, std::string(64, 'x').c_str()), CXR_ENAMETOOLONG);
  EXPECT_EQ(cxr_heap_open(&h, name.c_str()), CXR_ENOENT);
  EXPECT_EQ(h, nullptr);
  EXPECT_EQ(cxr_heap_unlink(nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_heap_unlink(""), CXR_EINVAL);
  EXPECT_EQ(cxr_heap_unlink("a/b"), CXR_EINVAL);
  EXPECT_EQ(cxr_heap_unlink(std::string(64, 'x').c_str()), CXR_ENAMETOOLONG);
  EXPECT_EQ(cxr_heap_unlink(name.c_str()), CXR_ENOENT);

  // Every handle function with NULL and with a zeroed handle.
  for (cxr_heap *bad : {static_cast<cxr_heap *>(nullptr), z.heap()}) {
    SCOPED_TRACE(bad ? "zeroed handle" : "NULL handle");
    cxr_heap_close(bad);  // no crash
    int dummy;
    EXPECT_NULL_WITH(cxr_heap_alloc(bad, 16), CXR_EINVAL);
    EXPECT_NULL_WITH(cxr_heap_alloc_aligned(bad, 64, 16), CXR_EINVAL);
    EXPECT_NULL_WITH(cxr_heap_alloc_pages(bad, 4096), CXR_EINVAL);
    EXPECT_NULL_WITH(cxr_heap_realloc(bad, nullptr, 16), CXR_EINVAL);
    cxr__set_error(0);
    cxr_heap_free(bad, &dummy);
    EXPECT_EQ(cxr_last_error(), CXR_EINVAL);
    cxr_heap_free(bad, nullptr);
    EXPECT_EQ(cxr_heap_usable_size(bad, &dummy), 0u);
    EXPECT_EQ(cxr_heap_adopt(bad, &dummy), CXR_EINVAL);
    EXPECT_FALSE_WITH(cxr_heap_contains(bad, &dummy, 1), CXR_EINVAL);
    EXPECT_NULL_WITH(cxr_heap_base(bad), CXR_EINVAL);
    EXPECT_EQ(cxr_heap_size(bad), 0u);
    EXPECT_NULL_WITH(cxr_heap_name(bad), CXR_EINVAL);
    EXPECT_EQ(cxr_heap_set_root(bad, nullptr), CXR_EINVAL);
    EXPECT_NULL_WITH(cxr_heap_get_root(bad), CXR_EINVAL);
    EXPECT_EQ(cxr_heap_persist(bad, &dummy, 1), CXR_EINVAL);
    cxr_heap_stats st;
    EXPECT_EQ(cxr_heap_get_stats(bad, &st), CXR_EINVAL);
    EXPECT_EQ(cxr_heap_renew(bad), CXR_EINVAL);
    EXPECT_EQ(cxr_heap_reap(bad), CXR_EINVAL);
  }

  // A live heap with bad pointers and sizes.
  ASSERT_EQ(cxr_heap_create(&h, name.c_str(), 1 << 20, nullptr), 0);
  cxr_heap_stats st;
  EXPECT_EQ(cxr_heap_get_stats(h, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_heap_stats(h, &st), 0);
  EXPECT_NULL_WITH(cxr_heap_alloc(h, SIZE_MAX), CXR_ENOMEM);
  EXPECT_NULL_WITH(cxr_heap_alloc(h, 2 << 20), CXR_ENOMEM);  // bigger than the heap
  for (size_t align : {size_t(0), size_t(3), size_t(48), size_t(8192), SIZE_MAX}) {
    SCOPED_TRACE(align);
    EXPECT_NULL_WITH(cxr_heap_alloc_aligned(h, align, 16), CXR_EINVAL);
  }
  EXPECT_NULL_WITH(cxr_heap_alloc_aligned(h, 64, SIZE_MAX), CXR_ENOMEM);
  EXPECT_NULL_WITH(cxr_heap_alloc_pages(h, 0), CXR_EINVAL);
  EXPECT_NULL_WITH(cxr_heap_alloc_pages(h, SIZE_MAX), CXR_ENOMEM);
  EXPECT_NULL_WITH(cxr_heap_alloc_pages(h, SIZE_MAX - 4095), CXR_ENOMEM);

  int outside;
  char *p = (char *)cxr_heap_alloc(h, 100);
  ASSERT_NE(p, nullptr);
  // realloc: pointers not of this heap, inside a block, huge sizes.
  EXPECT_NULL_WITH(cxr_heap_realloc(h, &outside, 16), CXR_EBADPTR);
  EXPECT_NULL_WITH(cxr_heap_realloc(h, p + 16, 16), CXR_EBADPTR);
  EXPECT_NULL_WITH(cxr_heap_realloc(h, p, SIZE_MAX), CXR_ENOMEM);
  // free: pointers not of this heap, inside a block (errors logged, no crash).
  cxr__set_error(0);
  cxr_heap_free(h, &outside);
  EXPECT_EQ(cxr_last_error(), CXR_EBADPTR);
  cxr__set_error(0);
  cxr_heap_free(h, p + 16);
  EXPECT_EQ(cxr_last_error(), CXR_EBADPTR);
  EXPECT_EQ(cxr_heap_usable_size(h, nullptr), 0u);
  EXPECT_EQ(cxr_heap_usable_size(h, &outside), 0u);
  EXPECT_EQ(cxr_heap_usable_size(h, p + 16), 0u);
  EXPECT_EQ(cxr_heap_adopt(h, nullptr), CXR_EBADPTR);
  EXPECT_EQ(cxr_heap_adopt(h, &outside), CXR_EBADPTR);
  EXPECT_EQ(cxr_heap_adopt(h, p + 16), CXR_EBADPTR);
  // contains: NULL, wrap-around, past the end, without setting the error.
  cxr__set_error(0);
  EXPECT_FALSE(cxr_heap_contains(h, nullptr, 1));
  EXPECT_FALSE(cxr_heap_contains(h, p, SIZE_MAX));
  EXPECT_FALSE(cxr_heap_contains(h, &outside, 1));
  EXPECT_FALSE(cxr_heap_contains(h, cxr_heap_base(h), cxr_heap_size(h) + 1));
  EXPECT_EQ(cxr_last_error(), 0);
  // root
  EXPECT_EQ(cxr_heap_set_root(h, &outside), CXR_EBADPTR);
  EXPECT_EQ(cxr_heap_set_root(h, (char *)cxr_heap_base(h) + cxr_heap_size(h)), CXR_EBADPTR);
  EXPECT_NULL_WITH(cxr_heap_get_root(h), CXR_ENOENT);
  EXPECT_EQ(cxr_heap_set_root(h, nullptr), 0);  // NULL clears it
  // persist
  EXPECT_EQ(cxr_heap_persist(h, nullptr, 1), CXR_EBADPTR);
  EXPECT_EQ(cxr_heap_persist(h, &outside, 1), CXR_EBADPTR);
  EXPECT_EQ(cxr_heap_persist(h, p, SIZE_MAX), CXR_EBADPTR);
  EXPECT_EQ(cxr_heap_persist(h, p, 1), 0);
  EXPECT_EQ(cxr_heap_renew(h), 0);
  EXPECT_GE(cxr_heap_reap(h), 0);
  cxr_heap_free(h, p);
  cxr__set_error(0);
  cxr_heap_free(h, p);  // double free
  EXPECT_EQ(cxr_last_error(), CXR_EINVAL);
  cxr_heap_free(h, nullptr);  // no-op

  // registry
  size_t n = 99;
  cxr_heap_info info[2];
  EXPECT_EQ(cxr_registry_list(info, 2, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_registry_list(nullptr, 1, &n), CXR_EINVAL);
  EXPECT_EQ(cxr_registry_list(nullptr, SIZE_MAX, &n), CXR_EINVAL);
  EXPECT_EQ(cxr_registry_list(nullptr, 0, &n), 0);
  EXPECT_GE(n, 1u);
  cxr_heap_close(h);
  EXPECT_EQ(cxr_heap_unlink(name.c_str()), 0);
}

// ---------------------------------------------------------------------------- sandbox.h

int ok_fn(void *) { return 7; }

void *restrict_twice(void *arg) {
  int *rc = static_cast<int *>(arg);
  rc[0] = cxr_sandbox_restrict_thread();
  rc[1] = cxr_sandbox_restrict_thread();
  return nullptr;
}

TEST_F(Args, SealTableArgs) {
  cxr_seal_opts_init(nullptr);
  cxr_seal_opts so;
  cxr_seal_table *t = reinterpret_cast<cxr_seal_table *>(1);
  cxr_seal_opts_init(&so);
  so.slots = 0;
  EXPECT_EQ(cxr_seal_table_create(&t, &so), CXR_EINVAL);
  so.slots = CXR_SEAL_SLOTS_MAX + 1;
  EXPECT_EQ(cxr_seal_table_create(&t, &so), CXR_EINVAL);
  so.slots = UINT_MAX;
  EXPECT_EQ(cxr_seal_table_create(&t, &so), CXR_EINVAL);
  cxr_seal_opts_init(&so);
  so.addr = 0x12345;
  EXPECT_EQ(cxr_seal_table_create(&t, &so), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_create(nullptr, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_attach(nullptr, 0, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_attach(&t, -1, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_attach(&t, INT_MIN, nullptr), CXR_EINVAL);

  // Every table function with a NULL table.
  cxr_seal_id id = 0;
  cxr_range rg;
  cxr_seal_stats sst;
  char page[1] = {0};
  EXPECT_EQ(cxr_seal_table_fd(nullptr), CXR_EINVAL);
  cxr_seal_table_close(nullptr);
  EXPECT_EQ(cxr_seal_table_set_peer(nullptr, getpid(), page, 4096), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_enforce(nullptr, nullptr), CXR_EINVAL);
  EXPECT_FALSE(cxr_seal_table_enforced(nullptr));
  EXPECT_EQ(cxr_seal_table_seal(nullptr, page, 1, &id), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_release(nullptr, 1), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_flush(nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_cancel(nullptr, 1), CXR_EINVAL);
  cxr_seal_table_peer_dead(nullptr);
  EXPECT_EQ(cxr_seal_table_range(nullptr, 1, &rg), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_check(nullptr, 1, page, 1), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_done(nullptr, 1), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_stats(nullptr, &sst), CXR_EINVAL);

  // A receiver's table and a sender's handle on it, each given the other's calls.
  cxr_seal_table *rt = nullptr, *st = nullptr;
  ASSERT_EQ(cxr_seal_table_create(&rt, nullptr), 0);
  int fd = cxr_seal_table_fd(rt);
  ASSERT_GE(fd, 0);
  cxr_seal_opts_init(&so);
  so.release_batch = 0;
  EXPECT_EQ(cxr_seal_table_attach(&st, fd, &so), CXR_EINVAL);
  cxr_seal_opts_init(&so);
  so.addr = 0x12345;
  EXPECT_EQ(cxr_seal_table_attach(&st, fd, &so), CXR_EINVAL);
  // Descriptors that are not a seal table: closed, a pipe, an empty or zeroed memfd.
  EXPECT_EQ(cxr_seal_table_attach(&st, 1 << 20, nullptr), CXR_EIO);  // not open
  int pfd[2];
  ASSERT_EQ(pipe(pfd), 0);
  EXPECT_EQ(cxr_seal_table_attach(&st, pfd[0], nullptr), CXR_ECORRUPT);
  close(pfd[0]);
  close(pfd[1]);
  int mfd = memfd_create("args-not-a-table", MFD_CLOEXEC);
  ASSERT_GE(mfd, 0);
  EXPECT_EQ(cxr_seal_table_attach(&st, mfd, nullptr), CXR_ECORRUPT);
  ASSERT_EQ(ftruncate(mfd, 1 << 16), 0);
  EXPECT_EQ(cxr_seal_table_attach(&st, mfd, nullptr), CXR_EBADMAGIC);
  close(mfd);
  EXPECT_EQ(st, nullptr);
  // A release batch above CXR_SEAL_SLOTS_MAX (its array is allocated whole at attach).
  cxr_seal_opts_init(&so);
  so.release_batch = CXR_SEAL_SLOTS_MAX + 1;
  EXPECT_EQ(cxr_seal_table_attach(&st, fd, &so), CXR_EINVAL);
  so.release_batch = UINT_MAX;
  EXPECT_EQ(cxr_seal_table_attach(&st, fd, &so), CXR_EINVAL);
  ASSERT_EQ(cxr_seal_table_attach(&st, fd, nullptr), 0);
  EXPECT_EQ(cxr_seal_table_stats(rt, nullptr), CXR_EINVAL);

  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  void *mem = mmap(nullptr, 4 * pg, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  char *m = (char *)mem;
  // set_peer (receiver only)
  EXPECT_EQ(cxr_seal_table_set_peer(st, getpid(), m, pg), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_set_peer(rt, 0, m, pg), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_set_peer(rt, -1, m, pg), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_set_peer(rt, getpid(), m + 1, pg), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_set_peer(rt, getpid(), m, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_set_peer(rt, getpid(), m, SIZE_MAX), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_set_peer(rt, getpid(), (void *)4096, pg), CXR_EINVAL);  // unmapped
  // enforce: a sender's table, or no peer set (none of the above set one)
  EXPECT_EQ(cxr_seal_table_enforce(st, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_enforce(rt, nullptr), CXR_EINVAL);
  // A NULL heap (with size 0) is allowed: no heap bound (cxr_seal_table_set_peer(3)).
  EXPECT_EQ(cxr_seal_table_set_peer(rt, getpid(), nullptr, 0), 0);
  EXPECT_FALSE(cxr_seal_table_enforced(rt));
  // seal (sender only)
  EXPECT_EQ(cxr_seal_table_seal(rt, m, pg, &id), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_seal(st, nullptr, pg, &id), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_seal(st, m, pg, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_seal(st, m, 0, &id), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_seal(st, m + 1, pg, &id), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_seal(st, m, SIZE_MAX, &id), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_seal(st, (void *)(UINTPTR_MAX & ~(pg - 1)), 2 * pg, &id),
            CXR_EINVAL);
  // range: no live seal, or NULL out
  EXPECT_EQ(cxr_seal_table_range(st, 0, &rg), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_range(st, 0xffffffffu, &rg), CXR_EINVAL);
  // release / cancel (sender only; ids never made)
  for (cxr_seal_id bad : {0u, 1u, 1u << 20, 0xffffffffu, (1u << 20) | 5u}) {
    EXPECT_EQ(cxr_seal_table_release(rt, bad), CXR_EINVAL) << bad;
    EXPECT_EQ(cxr_seal_table_release(st, bad), CXR_EINVAL) << bad;
    EXPECT_EQ(cxr_seal_table_cancel(rt, bad), CXR_EINVAL) << bad;
    EXPECT_EQ(cxr_seal_table_cancel(st, bad), CXR_EINVAL) << bad;
  }
  EXPECT_EQ(cxr_seal_table_flush(rt), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_flush(st), 0);
  // check / done (receiver only)
  EXPECT_EQ(cxr_seal_table_check(st, 1u << 20, m, pg), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_check(rt, 1u << 20, nullptr, pg), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_check(rt, 1u << 20, m, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_check(rt, 0, m, pg), CXR_ENOTSEALED);
  EXPECT_EQ(cxr_seal_table_check(rt, 0xffffffffu, m, pg), CXR_ENOTSEALED);
  EXPECT_EQ(cxr_seal_table_check(rt, 1u << 20, m, SIZE_MAX), CXR_EBADPTR);
  EXPECT_EQ(cxr_seal_table_done(st, 1u << 20), CXR_EINVAL);
  EXPECT_NE(cxr_seal_table_done(rt, 0), 0);
  EXPECT_NE(cxr_seal_table_done(rt, 0xffffffffu), 0);
  // A real seal: its range with NULL out, then a double release.
  ASSERT_EQ(cxr_seal_table_seal(st, m, pg, &id), 0);
  EXPECT_EQ(cxr_seal_table_range(st, id, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_range(st, id, &rg), 0);
  EXPECT_EQ(cxr_seal_table_seal(st, m, pg, &id), CXR_EBUSY);
  EXPECT_EQ(cxr_seal_table_cancel(st, id), 0);
  EXPECT_EQ(cxr_seal_table_cancel(st, id), CXR_EINVAL);
  EXPECT_EQ(cxr_seal_table_release(st, id), CXR_EINVAL);
  cxr_seal_table_peer_dead(rt);  // a receiver's table: nothing to do, no crash
  cxr_seal_table_close(st);
  cxr_seal_table_close(rt);
  munmap(mem, 4 * pg);
}

TEST_F(Args, SandboxArgs) {
  EXPECT_EQ(cxr_sandbox_run(nullptr, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_sandbox_run(ok_fn, nullptr), 7);
  (void)cxr_sandbox_fault_addr();
  (void)cxr_sandbox_faults();
  // range checks: every bad argument is CXR_EBADPTR
  char outer[80];
  char *buf = outer + 8;  // the range is 64 bytes inside outer
  cxr_range r = {buf, 64};
  cxr_range null_p = {nullptr, 64};
  cxr_range wraps = {(void *)(UINTPTR_MAX - 8), 64};
  EXPECT_EQ(cxr_range_check(nullptr, buf, 1, 0), CXR_EBADPTR);
  EXPECT_EQ(cxr_range_check(&null_p, buf, 1, 0), CXR_EBADPTR);
  EXPECT_EQ(cxr_range_check(&wraps, (void *)(UINTPTR_MAX - 4), 1, 0), CXR_EBADPTR);
  EXPECT_EQ(cxr_range_check(&r, nullptr, 1, 0), CXR_EBADPTR);
  EXPECT_EQ(cxr_range_check(&r, buf, SIZE_MAX, 0), CXR_EBADPTR);
  EXPECT_EQ(cxr_range_check(&r, buf + 1, 64, 0), CXR_EBADPTR);
  EXPECT_EQ(cxr_range_check(&r, buf - 1, 1, 0), CXR_EBADPTR);
  EXPECT_EQ(cxr_range_check(&r, buf + 1, 1, 2), CXR_EBADPTR);
  char *not3 = buf + ((uintptr_t)buf % 3 == 0 ? 1 : 0);  // not a multiple of 3
  EXPECT_EQ(cxr_range_check(&r, not3, 1, 3), CXR_EBADPTR);
  EXPECT_EQ(cxr_range_check(&r, buf, 1, SIZE_MAX), CXR_EBADPTR);
  EXPECT_EQ(cxr_range_check(&r, buf, 64, 1), 0);
  EXPECT_EQ(cxr_range_check(&r, buf + 64, 0, 0), 0);
  // domains
  bool pk = cxr_domain_supported();
  int want = pk ? CXR_EINVAL : CXR_ENOSYS;
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  void *mem = mmap(nullptr, pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  EXPECT_EQ(cxr_domain_protect(nullptr, pg), CXR_EINVAL);
  EXPECT_EQ(cxr_domain_protect((char *)mem + 1, pg), CXR_EINVAL);
  EXPECT_EQ(cxr_domain_protect(mem, 0), CXR_EINVAL);
  if (!pk) {
    EXPECT_EQ(cxr_domain_protect(mem, pg), want);
  }
  munmap(mem, pg);
  // cxr_sandbox_restrict_thread takes no argument; it is irreversible, so it runs on a
  // thread of its own, and a second call there fails as documented.
  // A pthread, not std::thread: std::thread's state is destroyed (a virtual call that
  // UBSan's vptr check resolves through system calls the policy forbids) on that thread.
  int rc[2] = {1, 1};
  pthread_t th;
  ASSERT_EQ(pthread_create(&th, nullptr, restrict_twice, rc), 0);
  ASSERT_EQ(pthread_join(th, nullptr), 0);
  EXPECT_EQ(rc[0], 0);
  EXPECT_EQ(rc[1], CXR_EIO);
}

// ---------------------------------------------------------------------------- idl.h

TEST_F(Args, IdlArgs) {
  Zeroed z;
  std::string name = uniq("args-idl");
  cxr_heap *h;
  ASSERT_EQ(cxr_heap_create(&h, name.c_str(), 1 << 20, nullptr), 0);
  cxr_str s = {nullptr, 0};
  cxr_bytes b = {nullptr, 0};
  // str / bytes builders: the same contract, so one list of cases for both.
  auto builder = [&](auto set, auto *obj) {
    EXPECT_EQ(set(nullptr, obj, "a", 1), CXR_EINVAL);
    EXPECT_EQ(set(z.heap(), obj, "a", 1), CXR_EINVAL);
    EXPECT_EQ(set(h, nullptr, "a", 1), CXR_EINVAL);
    EXPECT_EQ(set(h, obj, nullptr, 1), CXR_EINVAL);
    EXPECT_EQ(set(h, obj, "a", SIZE_MAX), CXR_EINVAL);
    EXPECT_EQ(set(h, obj, "a", SIZE_MAX - 1), CXR_ENOMEM);
    EXPECT_EQ(set(h, obj, nullptr, 0), 0);
    EXPECT_EQ(obj->len, 0u);
  };
  builder(cxr_str_set, &s);
  builder(cxr_bytes_set, &b);
  EXPECT_EQ(cxr_str_setz(nullptr, &s, "a"), CXR_EINVAL);
  EXPECT_EQ(cxr_str_setz(z.heap(), &s, "a"), CXR_EINVAL);
  EXPECT_EQ(cxr_str_setz(h, nullptr, "a"), CXR_EINVAL);
  EXPECT_EQ(cxr_str_setz(h, &s, nullptr), CXR_EINVAL);
  EXPECT_FALSE(cxr_str_eq(s, nullptr));
  // vectors
  EXPECT_NULL_WITH(cxr_vec_alloc(nullptr, 8, 1), CXR_EINVAL);
  EXPECT_NULL_WITH(cxr_vec_alloc(z.heap(), 8, 1), CXR_EINVAL);
  EXPECT_NULL_WITH(cxr_vec_alloc(h, 0, 1), CXR_EINVAL);
  EXPECT_NULL_WITH(cxr_vec_alloc(h, 8, UINT64_MAX), CXR_ENOMEM);
  EXPECT_NULL_WITH(cxr_vec_alloc(h, SIZE_MAX, 2), CXR_ENOMEM);
  EXPECT_NULL_WITH(cxr_vec_alloc(h, 1, 4u << 20), CXR_ENOMEM);  // more than the heap
  cxr_vec_u64 v = {nullptr, 5};
  EXPECT_EQ(CXR_VEC_ALLOC(h, v, UINT64_MAX), nullptr);
  EXPECT_EQ(v.count, 0u);
  // limits, reasons, method ids
  cxr_limits_init(nullptr);
  EXPECT_STREQ(cxr_invalid_str(-1), "unknown reason");
  EXPECT_STREQ(cxr_invalid_str(CXR_INVALID_NULL + 1), "unknown reason");
  EXPECT_STREQ(cxr_invalid_str(INT_MIN), "unknown reason");
  EXPECT_STREQ(cxr_invalid_str(INT_MAX), "unknown reason");
  EXPECT_STREQ(cxr_invalid_str(CXR_INVALID_NONE), "valid");
  int reason = cxr_invalid_reason();
  EXPECT_GE(reason, CXR_INVALID_NONE);
  EXPECT_LE(reason, CXR_INVALID_NULL);
  EXPECT_EQ(cxr_method_id(nullptr), 2166136261u);
  EXPECT_EQ(cxr_method_id(""), 2166136261u);
  // ranges
  cxr_ranges_init(nullptr);
  EXPECT_EQ(cxr_ranges_add(nullptr, &s, 1), CXR_EINVAL);
  cxr_ranges_merge(nullptr);
  EXPECT_EQ(cxr_ranges_bytes(nullptr), 0u);
  cxr_ranges_free(nullptr);
  cxr_ranges rg;
  cxr_ranges_init(&rg);
  EXPECT_EQ(cxr_ranges_add(&rg, &s, 0), 0);  // ignored
  EXPECT_EQ(rg.count, 0u);
  EXPECT_EQ(cxr_ranges_add(&rg, nullptr, 0), 0);
  // p is not checked (cxr_ranges_add(3)): a call shipping such a range refuses it
  // (cxr_conn_call checks each range against the connection heap: CXR_EBADPTR).
  EXPECT_EQ(cxr_ranges_add(&rg, (void *)(UINTPTR_MAX - 4), 64), 0);
  EXPECT_EQ(cxr_ranges_add(&rg, nullptr, 8), 0);
  cxr_ranges_merge(&rg);
  EXPECT_EQ(cxr_ranges_bytes(&rg), 72u);
  cxr_ranges_free(&rg);
  cxr_heap_close(h);
  EXPECT_EQ(cxr_heap_unlink(name.c_str()), 0);
}

// The internal helpers generated code calls (declared in <cxrpc/idl.h>): the arguments
// their man pages call invalid. (NULL is a documented precondition of the copy, compare,
// free and range walks, so those are not given NULL.)
int no_fields(cxr__vctx *, const void *) { return 0; }
bool no_enum(int32_t) { return false; }
int walk_fails(const void *, cxr_ranges *, unsigned) { return CXR_EPROTO; }

TEST_F(Args, IdlInternalArgs) {
  alignas(16) static char mem[256];
  cxr_range r = {mem, sizeof mem};
  cxr_range null_p = {nullptr, 8};
  cxr_range wraps = {(void *)(UINTPTR_MAX - 8), 64};
  cxr__vctx v;
  EXPECT_EQ(cxr__v_begin(nullptr, &r, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr__v_begin(&v, nullptr, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr__v_begin(&v, &null_p, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr__v_begin(&v, &wraps, nullptr), CXR_EINVAL);
  cxr__v_end(nullptr);
  cxr_limits lim = {1, 2, 16};  // depth 1, 2 nodes, 16 bytes
  ASSERT_EQ(cxr__v_begin(&v, &r, &lim), 0);
  EXPECT_EQ(cxr__v_root(&v, nullptr, 16, 8, no_fields), CXR_EBADPTR);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_NULL);
  EXPECT_EQ(cxr__v_root(&v, mem + sizeof mem, 16, 8, no_fields), CXR_EBADPTR);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_RANGE);
  EXPECT_EQ(cxr__v_root(&v, mem + 1, 16, 8, no_fields), CXR_EBADPTR);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_ALIGN);
  EXPECT_EQ(cxr__v_root(&v, mem + 250, 16, 1, no_fields), CXR_EBADPTR);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_LENGTH);
  EXPECT_EQ(cxr__v_block(&v, nullptr, 1, 8, 8), CXR_EBADPTR);
  EXPECT_EQ(cxr__v_block(&v, nullptr, 0, 8, 8), 0);
  EXPECT_EQ(cxr__v_block(&v, mem, UINT64_MAX, 8, 8), CXR_EBADPTR);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_LENGTH);
  EXPECT_EQ(cxr__v_block(&v, mem, 3, 8, 8), CXR_EBADPTR);  // 24 bytes > max_len 16
  EXPECT_EQ(cxr__v_block(&v, mem, 1, 0, 8), CXR_EINVAL);
  EXPECT_EQ(cxr__v_msgs(&v, mem, 1, 0, 8, no_fields), CXR_EINVAL);
  EXPECT_EQ(cxr__v_count(&v, UINT64_MAX), CXR_EPROTO);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_NODES);
  cxr_str s = {nullptr, 5};
  EXPECT_EQ(cxr__v_str(&v, &s), CXR_EBADPTR);
  cxr_bytes b = {nullptr, 1};
  EXPECT_EQ(cxr__v_bytes(&v, &b), CXR_EBADPTR);
  bool two;
  memset(&two, 2, 1);
  EXPECT_EQ(cxr__v_bool(&v, &two), CXR_EPROTO);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_BOOL);
  cxr_vec_bool vb = {nullptr, 1};
  EXPECT_EQ(cxr__v_bools(&v, &vb), CXR_EBADPTR);
  cxr_vec_str vstr = {nullptr, 1};
  EXPECT_EQ(cxr__v_strs(&v, &vstr), CXR_EBADPTR);
  cxr_vec_bytes vbytes = {nullptr, 1};
  EXPECT_EQ(cxr__v_bytess(&v, &vbytes), CXR_EBADPTR);
  alignas(16) static int32_t en[1] = {7};
  cxr_range er = {en, sizeof en};
  cxr__vctx ve;
  ASSERT_EQ(cxr__v_begin(&ve, &er, nullptr), 0);
  cxr_vec_i32 ve32 = {en, 1};
  EXPECT_EQ(cxr__v_enums(&ve, &ve32, no_enum), CXR_EPROTO);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_ENUM);
  cxr__v_end(&ve);
  EXPECT_EQ(cxr__v_msg(&v, nullptr, 16, 8, no_fields, true), CXR_EPROTO);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_REQUIRED);
  EXPECT_EQ(cxr__v_msg(&v, nullptr, 16, 8, no_fields, false), 0);  // absent
  v.depth = lim.max_depth;
  EXPECT_EQ(cxr__v_msg(&v, mem, 16, 8, no_fields, false), CXR_EPROTO);
  EXPECT_EQ(cxr_invalid_reason(), CXR_INVALID_DEPTH);
  v.depth = 0;
  EXPECT_EQ(cxr__v_fail(&v, -1), CXR_EPROTO);
  EXPECT_EQ(cxr__v_fail(nullptr, CXR_INVALID_NULL), CXR_EBADPTR);
  cxr__v_end(&v);
  // Copies and limits.
  cxr_limits tmp, zero = {0, 0, 0};
  EXPECT_EQ(cxr__limits(nullptr, &tmp), &tmp);
  EXPECT_EQ(cxr__limits(&zero, &tmp), &tmp);
  EXPECT_EQ(tmp.max_depth, 64u);
  EXPECT_EQ(cxr__limits(&lim, &tmp), &lim);
  cxr__set_error(CXR_EBUSY);
  EXPECT_EQ(cxr__cp_mem(nullptr, mem, 0), nullptr);  // n 0: no allocation, error untouched
  EXPECT_EQ(cxr_last_error(), CXR_EBUSY);
  EXPECT_NULL_WITH(cxr__cp_mem(nullptr, mem, 8), CXR_EINVAL);
  cxr_str d;
  cxr_str src = {"abc", 3};
  EXPECT_EQ(cxr__cp_str(nullptr, &d, &src, nullptr), CXR_EINVAL);
  cxr_bytes db, sb = {(const uint8_t *)"abc", 3};
  EXPECT_EQ(cxr__cp_bytes(nullptr, &db, &sb, nullptr), CXR_EINVAL);
  // Arrays into no heap: CXR_ENOMEM, the allocator's CXR_EINVAL in cxr_last_error.
  cxr_str one_s[1] = {{"abc", 3}};
  cxr_bytes one_b[1] = {{(const uint8_t *)"abc", 3}};
  cxr_vec_str vs1 = {one_s, 1}, vsd;
  cxr_vec_bytes vb1 = {one_b, 1}, vbd;
  cxr__set_error(0);
  EXPECT_EQ(cxr__cp_strs(nullptr, &vsd, &vs1, nullptr), CXR_ENOMEM);
  EXPECT_EQ(cxr_last_error(), CXR_EINVAL);
  cxr__set_error(0);
  EXPECT_EQ(cxr__cp_bytess(nullptr, &vbd, &vb1, nullptr), CXR_ENOMEM);
  EXPECT_EQ(cxr_last_error(), CXR_EINVAL);
  cxr_vec_str vs = {nullptr, 0};
  cxr_vec_bytes vb0 = {nullptr, 0};
  EXPECT_EQ(cxr__rg_strs(nullptr, &vs), CXR_EINVAL);
  EXPECT_EQ(cxr__rg_bytess(nullptr, &vb0), CXR_EINVAL);
  EXPECT_TRUE(cxr__eq_mem(nullptr, 0, mem, 0));
  EXPECT_TRUE(cxr__eq_strs(&vs, &vs));
  EXPECT_FALSE(cxr__eq_strs(&vs, &vs1));
  EXPECT_TRUE(cxr__eq_bytess(&vb0, &vb0));
  EXPECT_FALSE(cxr__eq_bytess(&vb0, &vb1));
  std::string hn = uniq("args-int");
  cxr_heap *h = nullptr;
  ASSERT_EQ(cxr_heap_create(&h, hn.c_str(), 1 << 20, nullptr), 0);
  cxr__free_strs(h, &vs);  // empty: nothing to free, no crash
  cxr__free_bytess(h, &vb0);
  cxr_heap_close(h);
  EXPECT_EQ(cxr_heap_unlink(hn.c_str()), 0);
  // A walk that fails: its code, and the list left empty.
  cxr_ranges rg;
  EXPECT_EQ(cxr__graph_ranges(mem, 16, walk_fails, &rg), CXR_EPROTO);
  EXPECT_EQ(rg.count, 0u);
  // Stub options without a connection: not remote, so o itself (NULL: the defaults).
  cxr_call_opts ctmp;
  int err = 1;
  EXPECT_EQ(cxr__stub_opts(nullptr, mem, 16, walk_fails, nullptr, &ctmp, &rg, &err), nullptr);
  EXPECT_EQ(err, 0);
  cxr_ranges_free(&rg);
  // Call helpers outside a call (NULL call): the widest safe answers.
  cxr_range ext = cxr__call_arg_extent(nullptr, mem);
  EXPECT_EQ(ext.p, nullptr);
  EXPECT_EQ(ext.len, 0u);
  EXPECT_EQ(cxr__skel_result(nullptr, nullptr, 16, nullptr), 0);  // NULL result: nothing
}

// ---------------------------------------------------------------------------- rpc.h

const uint32_t kCheck = 0xa1;  // a handler that checks the in-call functions' arguments
const uint32_t kEcho = 0xa2;   // answers at once
const uint32_t kPositive = 0xa3;  // returns a positive value (not a CXR_E* code)

// Runs inside a real call: each in-call function with bad arguments. Returns 0 if every
// answer was the documented one, else the line that failed (the client reports it).
int check_handler(cxr_call *call, const void *args, void **result, void *user) {
#define CHECK(cond) \
  if (!(cond)) return -1000 - __LINE__
  CHECK(cxr_call_set_result_ranges(call, nullptr, 1) == CXR_EINVAL);
  CHECK(cxr_call_set_result_ranges(call, nullptr, SIZE_MAX) == CXR_EINVAL);
  CHECK(cxr_call_set_result_ranges(call, nullptr, 0) == 0);
  CHECK(cxr_call_peer(call, nullptr) == CXR_EINVAL);
  CHECK(cxr_call_check_sealed(call, nullptr, 1) == CXR_ENOTSEALED);
  CHECK(cxr_call_check_sealed(call, args, 1) == CXR_ENOTSEALED);  // not a sealed call
  CHECK(cxr_call_check_sealed(call, args, SIZE_MAX) == CXR_ENOTSEALED);
  cxr_range ar = cxr_call_arg_range(call);
  CHECK(ar.p != nullptr);
  CHECK(cxr_call_heap(call) != nullptr);
  *result = nullptr;
  return 0;
#undef CHECK
}

int echo_handler(cxr_call *, const void *, void **result, void *) {
  *result = nullptr;
  return 0;
}

int positive_handler(cxr_call *, const void *, void **result, void *) {
  *result = nullptr;
  return 5;
}

void never_cb(int, void *, void *) {}

TEST_F(Args, ChannelArgs) {
  cxr_channel_opts_init(nullptr);
  cxr_conn_opts_init(nullptr);
  cxr_call_opts_init(nullptr);
  std::string name = uniq("argch");
  cxr_channel *ch = reinterpret_cast<cxr_channel *>(1);
  cxr_channel_opts o;
  EXPECT_EQ(cxr_channel_open(nullptr, name.c_str(), nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_channel_open(&ch, nullptr, nullptr), CXR_EINVAL);
  EXPECT_EQ(ch, nullptr);
  EXPECT_EQ(cxr_channel_open(&ch, "", nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_channel_open(&ch, "a b", nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_channel_open(&ch, std::string(33, 'c').c_str(), nullptr), CXR_ENAMETOOLONG);
  struct Bad {
    const char *what;
    void (*set)(cxr_channel_opts *);
  } bad[] = {
      // (0 means the default for ring_slots, max_conns, workers, pool, conn_heap_size)
      {"ring_slots 1", [](cxr_channel_opts *p) { p->ring_slots = 1; }},
      {"ring_slots 3", [](cxr_channel_opts *p) { p->ring_slots = 3; }},
      {"ring_slots 1<<17", [](cxr_channel_opts *p) { p->ring_slots = 1u << 17; }},
      {"ring_slots max", [](cxr_channel_opts *p) { p->ring_slots = UINT_MAX; }},
      {"max_conns 1025", [](cxr_channel_opts *p) { p->max_conns = 1025; }},
      {"max_conns max", [](cxr_channel_opts *p) { p->max_conns = UINT_MAX; }},
      {"pool > max_conns", [](cxr_channel_opts *p) { p->max_conns = 2, p->pool = 3; }},
      {"workers 65", [](cxr_channel_opts *p) { p->workers = 65; }},
      {"workers max", [](cxr_channel_opts *p) { p->workers = UINT_MAX; }},
      {"mode 01000", [](cxr_channel_opts *p) { p->mode = 01000; }},
      {"peer_timeout -1", [](cxr_channel_opts *p) { p->peer_timeout_ns = -1; }},
      {"peer_timeout min", [](cxr_channel_opts *p) { p->peer_timeout_ns = INT64_MIN; }},
      {"conn_heap_size 1", [](cxr_channel_opts *p) { p->conn_heap_size = 1; }},
      {"conn_heap_size max", [](cxr_channel_opts *p) { p->conn_heap_size = SIZE_MAX; }},
      {"listen tcp://", [](cxr_channel_opts *p) { p->listen = "tcp://127.0.0.1:1"; }},
      {"listen no port", [](cxr_channel_opts *p) { p->listen = "ucx://127.0.0.1"; }},
      {"listen port 70000", [](cxr_channel_opts *p) { p->listen = "ucx://127.0.0.1:70000"; }},
      {"listen empty", [](cxr_channel_opts *p) { p->listen = ""; }},
  };
  for (const Bad &b : bad) {
    cxr_channel_opts_init(&o);
    o.conn_heap_size = 4u << 20;
    b.set(&o);
    ch = reinterpret_cast<cxr_channel *>(1);
    EXPECT_EQ(cxr_channel_open(&ch, name.c_str(), &o), CXR_EINVAL) << b.what;
    EXPECT_EQ(ch, nullptr) << b.what;
    if (ch != nullptr) cxr_channel_close(ch);
  }
  // NULL channel everywhere.
  EXPECT_EQ(cxr_channel_on(nullptr, 1, echo_handler, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_channel_serve(nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_channel_start(nullptr), CXR_EINVAL);
  cxr_channel_stop(nullptr);
  cxr_channel_close(nullptr);
  // Inspection.
  size_t n = 99;
  cxr_channel_info ci;
  cxr_conn_info conns[2];
  EXPECT_EQ(cxr_channel_list(&ci, 1, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_channel_list(nullptr, 1, &n), CXR_EINVAL);
  EXPECT_EQ(cxr_channel_list(nullptr, SIZE_MAX, &n), CXR_EINVAL);
  EXPECT_EQ(cxr_channel_list(nullptr, 0, &n), 0);
  EXPECT_EQ(cxr_channel_inspect(nullptr, &ci, conns, 2, &n), CXR_EINVAL);
  EXPECT_EQ(cxr_channel_inspect(name.c_str(), &ci, nullptr, 1, &n), CXR_EINVAL);
  EXPECT_EQ(cxr_channel_inspect(std::string(61, 'c').c_str(), &ci, conns, 2, &n),
            CXR_ENAMETOOLONG);
  EXPECT_EQ(cxr_channel_inspect(name.c_str(), &ci, conns, 2, &n), CXR_ENOENT);
  {  // A heap in the place of a channel's control block ("ch.<name>"): not a channel.
    std::string fake = uniq("fakech");
    cxr_heap *fh = nullptr;
    ASSERT_EQ(cxr_heap_create(&fh, ("ch." + fake).c_str(), 1 << 20, nullptr), 0);
    EXPECT_EQ(cxr_channel_inspect(fake.c_str(), &ci, conns, 2, &n), CXR_ENOENT);  // no root
    void *junk = cxr_heap_alloc(fh, 4096);  // zeros: no channel magic
    ASSERT_NE(junk, nullptr);
    memset(junk, 0, 4096);
    ASSERT_EQ(cxr_heap_set_root(fh, junk), 0);
    EXPECT_EQ(cxr_channel_inspect(fake.c_str(), &ci, conns, 2, &n), CXR_EBADMAGIC);
    cxr_conn *fc = reinterpret_cast<cxr_conn *>(1);
    int frc = cxr_connect(&fc, fake.c_str(), nullptr);
    EXPECT_TRUE(frc == CXR_EBADMAGIC || frc == CXR_ENOENT) << frc;
    EXPECT_EQ(fc, nullptr);
    cxr_heap_close(fh);
    EXPECT_EQ(cxr_heap_unlink(("ch." + fake).c_str()), 0);
  }

  // A real channel.
  cxr_channel_opts_init(&o);
  o.conn_heap_size = 4u << 20;
  o.pool = 1;
  o.max_conns = 2;
  ASSERT_EQ(cxr_channel_open(&ch, name.c_str(), &o), 0);
  EXPECT_EQ(cxr_channel_on(ch, kEcho, nullptr, nullptr), CXR_EINVAL);
  ASSERT_EQ(cxr_channel_on(ch, kCheck, check_handler, nullptr), 0);
  ASSERT_EQ(cxr_channel_on(ch, kEcho, echo_handler, nullptr), 0);
  ASSERT_EQ(cxr_channel_on(ch, kPositive, positive_handler, nullptr), 0);
  // info and n may be NULL (cxr_channel_inspect(3) names only name and conns).
  EXPECT_EQ(cxr_channel_inspect(name.c_str(), nullptr, conns, 2, &n), 0);
  EXPECT_EQ(cxr_channel_inspect(name.c_str(), &ci, conns, 2, nullptr), 0);
  EXPECT_EQ(cxr_channel_inspect(name.c_str(), &ci, nullptr, 0, &n), 0);
  ASSERT_EQ(cxr_channel_start(ch), 0);
  EXPECT_EQ(cxr_channel_start(ch), CXR_EBUSY);
  EXPECT_EQ(cxr_channel_serve(ch), CXR_EBUSY);
  EXPECT_EQ(cxr_channel_on(ch, 7, echo_handler, nullptr), CXR_EBUSY);

  // connect
  cxr_conn *c = reinterpret_cast<cxr_conn *>(1);
  cxr_conn_opts co;
  EXPECT_EQ(cxr_connect(nullptr, name.c_str(), nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_connect(&c, nullptr, nullptr), CXR_EINVAL);
  EXPECT_EQ(c, nullptr);
  EXPECT_EQ(cxr_connect(&c, "", nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_connect(&c, "tcp://x:1/y", nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_connect(&c, "ucx://127.0.0.1:1", nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_connect(&c, "ucx://127.0.0.1:1/", nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_connect(&c, std::string(33, 'c').c_str(), nullptr), CXR_ENAMETOOLONG);
  EXPECT_EQ(cxr_connect(&c, ("ucx://" + std::string(80, 'h') + ":1/x").c_str(), nullptr),
            CXR_ENAMETOOLONG);
  EXPECT_EQ(cxr_connect(&c, uniq("nochan").c_str(), nullptr), CXR_ENOENT);
  for (int which = 0; which < 3; which++) {
    cxr_conn_opts_init(&co);
    int64_t *f[] = {&co.default_deadline_ns, &co.connect_timeout_ns, &co.peer_timeout_ns};
    *f[which] = -1;
    EXPECT_EQ(cxr_connect(&c, name.c_str(), &co), CXR_EINVAL) << which;
    EXPECT_EQ(c, nullptr);
  }
  ASSERT_EQ(cxr_connect(&c, name.c_str(), nullptr), 0);
  cxr_heap *h = cxr_conn_heap(c);
  ASSERT_NE(h, nullptr);

  // NULL connection everywhere.
  void *res = nullptr;
  cxr_future *f = reinterpret_cast<cxr_future *>(1);
  EXPECT_NULL_WITH(cxr_conn_heap(nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_conn_call(nullptr, kEcho, nullptr, &res, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_conn_call_async(nullptr, kEcho, nullptr, &f, nullptr), CXR_EINVAL);
  EXPECT_EQ(f, nullptr);
  cxr_conn_close(nullptr);
  cxr_conn_free(nullptr, nullptr);
  cxr_conn_free(nullptr, h);  // a NULL connection: nothing freed, no crash
  EXPECT_FALSE(cxr_conn_is_remote(nullptr));
  cxr_range rr = cxr_conn_result_range(nullptr);
  EXPECT_EQ(rr.p, nullptr);
  EXPECT_EQ(rr.len, 0u);
  EXPECT_EQ(cxr_conn_seal_flush(nullptr), CXR_EINVAL);
  cxr_seal_stats sst;
  EXPECT_EQ(cxr_conn_seal_stats(nullptr, &sst), CXR_EINVAL);
  EXPECT_EQ(cxr_conn_seal_stats(c, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_conn_seal_flush(c), 0);
  EXPECT_FALSE(cxr_conn_is_remote(c));
  EXPECT_NE(cxr_conn_result_range(c).p, nullptr);

  // Calls with bad options.
  cxr_call_opts cal;
  cxr_call_opts_init(&cal);
  cal.deadline_ns = -1;
  EXPECT_EQ(cxr_conn_call(c, kEcho, nullptr, &res, &cal), CXR_EINVAL);
  cal.deadline_ns = INT64_MIN;
  EXPECT_EQ(cxr_conn_call(c, kEcho, nullptr, &res, &cal), CXR_EINVAL);
  cxr_call_opts_init(&cal);
  cal.flags = 1u << 7;
  EXPECT_EQ(cxr_conn_call(c, kEcho, nullptr, &res, &cal), CXR_EINVAL);
  cal.flags = UINT_MAX;
  EXPECT_EQ(cxr_conn_call(c, kEcho, nullptr, &res, &cal), CXR_EINVAL);
  cxr_call_opts_init(&cal);
  cal.nranges = 1;
  EXPECT_EQ(cxr_conn_call(c, kEcho, nullptr, &res, &cal), CXR_EINVAL);
  cxr_call_opts_init(&cal);
  cal.arg_len = 16;  // args NULL with a length
  EXPECT_EQ(cxr_conn_call(c, kEcho, nullptr, &res, &cal), CXR_EINVAL);
  cal.flags = CXR_CALL_INLINE;
  EXPECT_EQ(cxr_conn_call(c, kEcho, nullptr, &res, &cal), CXR_EINVAL);
  cxr_call_opts_init(&cal);
  EXPECT_EQ(cxr_conn_call_async(c, kEcho, nullptr, nullptr, &cal), CXR_EINVAL);
  cal.flags = 1u << 9;
  f = reinterpret_cast<cxr_future *>(1);
  EXPECT_EQ(cxr_conn_call_async(c, kEcho, nullptr, &f, &cal), CXR_EINVAL);
  EXPECT_EQ(f, nullptr);
  // Inline and sealed calls with arguments that cannot be copied or sealed.
  char *page = (char *)cxr_heap_alloc_pages(h, 4096);
  ASSERT_NE(page, nullptr);
  cxr_call_opts_init(&cal);
  cal.flags = CXR_CALL_INLINE;
  cal.arg_len = 65;
  EXPECT_EQ(cxr_conn_call(c, kEcho, page, &res, &cal), CXR_EINVAL);
  cal.arg_len = SIZE_MAX;
  EXPECT_EQ(cxr_conn_call(c, kEcho, page, &res, &cal), CXR_EINVAL);
  cal.flags = CXR_CALL_INLINE | CXR_CALL_SEAL;
  cal.arg_len = 8;
  EXPECT_EQ(cxr_conn_call(c, kEcho, page, &res, &cal), CXR_EINVAL);
  cal.flags = CXR_CALL_SEAL;
  EXPECT_EQ(cxr_conn_call(c, kEcho, page + 16, &res, &cal), CXR_EINVAL);  // not on a page
  cal.arg_len = 0;
  EXPECT_EQ(cxr_conn_call(c, kEcho, nullptr, &res, &cal), CXR_EINVAL);  // no argument bytes
  cal.arg_len = SIZE_MAX;
  EXPECT_EQ(cxr_conn_call(c, kEcho, page, &res, &cal), CXR_EBADPTR);
  cxr_call_opts_init(&cal);
  int outside[4];
  EXPECT_EQ(cxr_conn_call(c, kEcho, outside, &res, nullptr), CXR_EBADPTR);
  cal.arg_len = SIZE_MAX;
  EXPECT_EQ(cxr_conn_call(c, kEcho, page, &res, &cal), CXR_EBADPTR);
  cxr_heap_free(h, page);
  // A handler's positive code reaches the client as CXR_EIO.
  EXPECT_EQ(cxr_conn_call(c, kPositive, nullptr, &res, nullptr), CXR_EIO);
  // A method nobody serves, then the in-call checks.
  EXPECT_EQ(cxr_conn_call(c, 0xdead, nullptr, &res, nullptr), CXR_ENOMETHOD);
  void *args = cxr_heap_alloc(h, 64);
  ASSERT_NE(args, nullptr);
  EXPECT_EQ(cxr_conn_call(c, kCheck, args, &res, nullptr), 0);
  EXPECT_EQ(cxr_conn_call(c, kEcho, args, nullptr, nullptr), 0);  // result not wanted

  // In-call functions outside a call (NULL call).
  EXPECT_NULL_WITH(cxr_call_heap(nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_call_arg_len(nullptr), 0u);
  EXPECT_FALSE(cxr_call_cancelled(nullptr));
  cxr_range ar = cxr_call_arg_range(nullptr);
  EXPECT_EQ(ar.p, nullptr);
  EXPECT_EQ(ar.len, 0u);
  EXPECT_EQ(cxr_call_set_result_ranges(nullptr, nullptr, 0), CXR_EINVAL);
  cxr_peer peer;
  EXPECT_EQ(cxr_call_peer(nullptr, &peer), CXR_EINVAL);
  EXPECT_EQ(cxr_call_check_sealed(nullptr, args, 1), CXR_ENOTSEALED);
  bool untrusted = false, remote = true;
  cxr__call_kind(nullptr, &untrusted, &remote);
  EXPECT_TRUE(untrusted);  // an unknown call counts as untrusted
  cxr__call_kind(nullptr, nullptr, nullptr);

  // Futures: NULL, bad timeouts, NULL callback, a callback twice.
  EXPECT_EQ(cxr_future_wait(nullptr, 0, &res), CXR_EINVAL);
  EXPECT_EQ(cxr_future_poll(nullptr, &res), CXR_EINVAL);
  EXPECT_EQ(cxr_future_then(nullptr, never_cb, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_future_cancel(nullptr), CXR_EINVAL);
  cxr_future_free(nullptr);
  ASSERT_EQ(cxr_conn_call_async(c, kEcho, args, &f, nullptr), 0);
  EXPECT_EQ(cxr_future_wait(f, -1, &res), CXR_EINVAL);
  EXPECT_EQ(cxr_future_wait(f, INT64_MIN, &res), CXR_EINVAL);
  EXPECT_EQ(cxr_future_then(f, nullptr, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_future_wait(f, 5 * kSec, nullptr), 0);  // result not wanted
  EXPECT_EQ(cxr_future_poll(f, nullptr), 0);
  EXPECT_EQ(cxr_future_cancel(f), CXR_EBUSY);
  std::atomic<int> ran{0};
  EXPECT_EQ(cxr_future_then(
                f, [](int, void *, void *u) { static_cast<std::atomic<int> *>(u)->fetch_add(1); },
                &ran),
            0);
  EXPECT_EQ(cxr_future_then(f, never_cb, nullptr), CXR_EBUSY);
  cxr_future_free(f);
  EXPECT_EQ(ran.load(), 1);
  // Huge timeouts: no overflow into the past (an immediate CXR_EAGAIN or CXR_ETIMEDOUT).
  cxr_call_opts_init(&cal);
  cal.deadline_ns = INT64_MAX;
  EXPECT_EQ(cxr_conn_call(c, kEcho, args, &res, &cal), 0);
  ASSERT_EQ(cxr_conn_call_async(c, kEcho, args, &f, &cal), 0);
  EXPECT_EQ(cxr_future_wait(f, INT64_MAX, &res), 0);
  cxr_future_free(f);
  cxr_conn *c2 = nullptr;
  cxr_conn_opts_init(&co);
  co.default_deadline_ns = co.connect_timeout_ns = co.peer_timeout_ns = INT64_MAX;
  ASSERT_EQ(cxr_connect(&c2, name.c_str(), &co), 0);
  EXPECT_EQ(cxr_conn_call(c2, kEcho, nullptr, &res, nullptr), 0);
  cxr_conn_close(c2);
  cxr_heap_free(h, args);
  cxr_conn_free(c, nullptr);  // NULL result: no-op
  cxr_conn_close(c);
  cxr_channel_stop(ch);
  cxr_channel_stop(ch);  // twice: no-op
  cxr_channel_close(ch);
  // A channel with the longest dead-client bound opens, serves and closes.
  cxr_channel_opts_init(&o);
  o.conn_heap_size = 4u << 20;
  o.pool = 1;
  o.peer_timeout_ns = INT64_MAX;
  ASSERT_EQ(cxr_channel_open(&ch, name.c_str(), &o), 0);
  ASSERT_EQ(cxr_channel_on(ch, kEcho, echo_handler, nullptr), 0);
  ASSERT_EQ(cxr_channel_start(ch), 0);
  ASSERT_EQ(cxr_connect(&c, name.c_str(), nullptr), 0);
  EXPECT_EQ(cxr_conn_call(c, kEcho, nullptr, &res, nullptr), 0);
  cxr_conn_close(c);
  cxr_channel_close(ch);
}

// A connection to another rack: tests/netns/remote_peer serves channel "kv" on loopback
// (its own pod, 1: the replicas of each side's heaps then fit at the same addresses).
const uint32_t kRemoteNoop = 2;  // remote_peer's M_NOOP

TEST_F(Args, RemoteConnArgs) {
  std::string root = std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") +
                     "/args-remote";
  mkdir(root.c_str(), 0700);
  cxrt::Proc server;
  std::string host;
  ASSERT_TRUE(cxrt::start_kv_server(server, &host, root, 7919));
  cxr_conn *c = nullptr;
  std::string target = "ucx://" + host + "/kv";
  EXPECT_EQ(cxr_connect(&c, ("ucx://" + host + "/nochannel").c_str(), nullptr), CXR_ENOENT);
  EXPECT_EQ(c, nullptr);
  ASSERT_EQ(cxr_connect(&c, target.c_str(), nullptr), 0);
  EXPECT_TRUE(cxr_conn_is_remote(c));
  cxr_range rr = cxr_conn_result_range(c);
  EXPECT_NE(rr.p, nullptr);
  cxr_heap *h = cxr_conn_heap(c);
  ASSERT_NE(h, nullptr);
  char *args = (char *)cxr_heap_alloc(h, 64);
  ASSERT_NE(args, nullptr);
  void *res = nullptr;
  cxr_call_opts o;
  // Ranges: NULL with a count, too many, outside the heap, more bytes than the heap.
  cxr_call_opts_init(&o);
  o.nranges = 1;
  EXPECT_EQ(cxr_conn_call(c, kRemoteNoop, args, &res, &o), CXR_EINVAL);
  std::vector<cxr_range> many(65537, cxr_range{args, 8});
  o.ranges = many.data();
  o.nranges = many.size();
  EXPECT_EQ(cxr_conn_call(c, kRemoteNoop, args, &res, &o), CXR_EINVAL);
  int outside[4];
  cxr_range bad[2] = {{args, 8}, {outside, sizeof outside}};
  o.ranges = bad;
  o.nranges = 2;
  EXPECT_EQ(cxr_conn_call(c, kRemoteNoop, args, &res, &o), CXR_EBADPTR);
  cxr_range wraps[1] = {{(void *)(UINTPTR_MAX - 4), 64}};
  o.ranges = wraps;
  o.nranges = 1;
  EXPECT_EQ(cxr_conn_call(c, kRemoteNoop, args, &res, &o), CXR_EBADPTR);
  std::vector<cxr_range> whole(2, cxr_range{cxr_heap_base(h), cxr_heap_size(h)});
  o.ranges = whole.data();
  o.nranges = whole.size();
  int rc = cxr_conn_call(c, kRemoteNoop, args, &res, &o);
  EXPECT_TRUE(rc == CXR_EINVAL || rc == CXR_EBADPTR) << rc;
  // Arguments outside the heap, flags, inline sizes, negative deadline.
  EXPECT_EQ(cxr_conn_call(c, kRemoteNoop, outside, &res, nullptr), CXR_EBADPTR);
  cxr_call_opts_init(&o);
  o.flags = CXR_CALL_SEAL | CXR_CALL_INLINE;
  EXPECT_EQ(cxr_conn_call(c, kRemoteNoop, args, &res, &o), CXR_EINVAL);
  o.flags = CXR_CALL_INLINE;
  o.arg_len = 65;
  EXPECT_EQ(cxr_conn_call(c, kRemoteNoop, args, &res, &o), CXR_EINVAL);
  cxr_call_opts_init(&o);
  o.deadline_ns = -1;
  EXPECT_EQ(cxr_conn_call(c, kRemoteNoop, nullptr, &res, &o), CXR_EINVAL);
  // The longest deadline and wait still complete.
  o.deadline_ns = INT64_MAX;
  EXPECT_EQ(cxr_conn_call(c, kRemoteNoop, nullptr, &res, &o), 0);
  cxr_future *f = nullptr;
  ASSERT_EQ(cxr_conn_call_async(c, kRemoteNoop, nullptr, &f, &o), 0);
  EXPECT_EQ(cxr_future_wait(f, -1, &res), CXR_EINVAL);
  EXPECT_EQ(cxr_future_wait(f, INT64_MAX, &res), 0);
  EXPECT_EQ(cxr_future_cancel(f), CXR_EBUSY);
  cxr_future_free(f);
  // Freeing what is no result: ignored.
  cxr_conn_free(c, outside);
  cxr_conn_free(c, nullptr);
  cxr_conn_free(c, args);  // a block of our own heap: freed there
  EXPECT_EQ(cxr_conn_call(c, kRemoteNoop, nullptr, &res, nullptr), 0);
  EXPECT_EQ(cxr_conn_seal_flush(c), 0);
  cxr_conn_close(c);
  EXPECT_EQ(server.stop(3000), 0);  // EOF on its stdin: it exits
}

// ---------------------------------------------------------------------------- rdma.h

void am_noop(cxr_rdma_msg *, void *) {}

// Runs on srv's progress thread for each message to id 20: the message functions with bad
// arguments. Stores 0 (all as documented) or the failing line, then counts the message.
struct MsgChecks {
  std::atomic<int> bad{-1};
  std::atomic<int> seen{0};
};
void am_check(cxr_rdma_msg *m, void *user) {
  MsgChecks *mc = static_cast<MsgChecks *>(user);
  int bad = 0;
#define MCHECK(cond) \
  if (bad == 0 && !(cond)) bad = __LINE__
  char h[1025] = {0};
  MCHECK(cxr_rdma_msg_id(m) == 20);
  MCHECK(cxr_rdma_msg_hdr(m, nullptr) != nullptr);  // len may be NULL
  MCHECK(cxr_rdma_msg_data(m, nullptr) != nullptr);  // never NULL, even for 0 bytes
  MCHECK(cxr_rdma_reply(m, 15, h, 1, nullptr, 0, 0) == CXR_EINVAL);
  MCHECK(cxr_rdma_reply(m, 256, h, 1, nullptr, 0, 0) == CXR_EINVAL);
  MCHECK(cxr_rdma_reply(m, 21, h, 1025, nullptr, 0, 0) == CXR_EINVAL);
  MCHECK(cxr_rdma_reply(m, 21, nullptr, 1, nullptr, 0, 0) == CXR_EINVAL);
  MCHECK(cxr_rdma_reply(m, 21, h, 1, nullptr, 1, 0) == CXR_EINVAL);
  struct iovec nb[1] = {{nullptr, 4}};
  MCHECK(cxr_rdma_reply(m, 21, h, 1, nb, 1, 0) == CXR_EINVAL);
  MCHECK(cxr_rdma_reply(m, 21, h, 0, nullptr, 0, 0) == 0);
#undef MCHECK
  mc->bad.store(bad);
  mc->seen.fetch_add(1);
}
void defer_noop(void *) {}

TEST_F(Args, RdmaArgs) {
  cxr_rdma_opts_init(nullptr);
  cxr_rdma_opts o;
  cxr_rdma *r = reinterpret_cast<cxr_rdma *>(1);
  EXPECT_EQ(cxr_rdma_open(nullptr, nullptr), CXR_EINVAL);
  struct Bad {
    const char *what;
    void (*set)(cxr_rdma_opts *);
  } bad[] = {
      {"pool 9", [](cxr_rdma_opts *p) { p->pool = 9; }},
      {"pool max", [](cxr_rdma_opts *p) { p->pool = UINT_MAX; }},
      {"spin -1", [](cxr_rdma_opts *p) { p->spin_ns = -1; }},
      {"pin_mode 3", [](cxr_rdma_opts *p) { p->pin_mode = 3; }},
      {"pin_mode -1", [](cxr_rdma_opts *p) { p->pin_mode = -1; }},
      {"listen no port", [](cxr_rdma_opts *p) { p->listen = "127.0.0.1"; }},
      {"listen port 65536", [](cxr_rdma_opts *p) { p->listen = "127.0.0.1:65536"; }},
      {"listen port -1", [](cxr_rdma_opts *p) { p->listen = "127.0.0.1:-1"; }},
      {"listen empty", [](cxr_rdma_opts *p) { p->listen = ""; }},
      {"bounce < page", [](cxr_rdma_opts *p) {
         p->pin_mode = CXR_RDMA_PIN_ALWAYS;
         p->bounce_size = 100;
       }},
      {"bounce > budget", [](cxr_rdma_opts *p) {
         p->pin_mode = CXR_RDMA_PIN_ALWAYS;
         p->pin_budget = 512 << 10;
         p->bounce_size = 768 << 10;
       }},
  };
  for (const Bad &b : bad) {
    cxr_rdma_opts_init(&o);
    b.set(&o);
    r = reinterpret_cast<cxr_rdma *>(1);
    EXPECT_EQ(cxr_rdma_open(&r, &o), CXR_EINVAL) << b.what;
  }
  // NULL engine, endpoint, message everywhere.
  cxr_rdma_ep *ep = reinterpret_cast<cxr_rdma_ep *>(1);
  cxr_rdma_mr *mr = reinterpret_cast<cxr_rdma_mr *>(1);
  cxr_rdma_rkey *rk = reinterpret_cast<cxr_rdma_rkey *>(1);
  cxr_rdma_stats rs;
  char buf[64];
  uint64_t old = 0, base = 0;
  size_t len = 0;
  cxr_rdma_close(nullptr);
  EXPECT_EQ(cxr_rdma_port(nullptr), 0);
  EXPECT_EQ(cxr_rdma_connect(nullptr, "127.0.0.1:1", 0, &ep), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_ep_status(nullptr), CXR_EINVAL);
  EXPECT_STREQ(cxr_rdma_ep_host(nullptr), "");
  EXPECT_EQ(cxr_rdma_ep_on_error(nullptr, nullptr, nullptr), CXR_EINVAL);
  cxr_rdma_ep_close(nullptr);
  cxr_rdma_forget(nullptr, "127.0.0.1:1");
  EXPECT_EQ(cxr_rdma_am_set(nullptr, 20, am_noop, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_am_send(nullptr, 20, buf, 1, nullptr, 0, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_am_post(nullptr, 20, buf, 1, nullptr, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_reply(nullptr, 20, buf, 1, nullptr, 0, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_msg_id(nullptr), 0u);
  len = 77;
  EXPECT_EQ(cxr_rdma_msg_hdr(nullptr, &len), nullptr);
  EXPECT_EQ(cxr_rdma_msg_data(nullptr, &len), nullptr);
  EXPECT_EQ(len, 77u);
  EXPECT_EQ(cxr_rdma_msg_hdr(nullptr, nullptr), nullptr);
  cxr_rdma_msg_keep(nullptr);
  cxr_rdma_msg_free(nullptr);
  EXPECT_EQ(cxr_rdma_defer(nullptr, defer_noop, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_reg(nullptr, buf, sizeof buf, &mr), CXR_EINVAL);
  cxr_rdma_dereg(nullptr);
  EXPECT_EQ(cxr_rdma_export(nullptr, "x", buf, sizeof buf, &mr), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_rkey_get(nullptr, "x", &rk, &base, &len), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_refresh(nullptr, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_put(nullptr, rk, 0, buf, 8, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_get(nullptr, rk, 0, buf, 8, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_fadd64(nullptr, rk, 0, 1, &old, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_cswap64(nullptr, rk, 0, 0, 1, &old, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_swap64(nullptr, rk, 0, 1, &old, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_stats_get(nullptr, &rs), CXR_EINVAL);
  // devices
  cxr_rdma_dev_info dev[1];
  size_t n = 99;
  char why[64];
  EXPECT_EQ(cxr_rdma_devices(dev, 1, nullptr, why, sizeof why), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_devices(nullptr, 1, &n, why, sizeof why), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_devices(nullptr, SIZE_MAX, &n, why, sizeof why), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_devices(nullptr, 0, &n, nullptr, 0), 0);
  EXPECT_EQ(cxr_rdma_devices(nullptr, 0, &n, nullptr, 64), 0);
  EXPECT_EQ(cxr_rdma_devices(nullptr, 0, &n, why, 0), 0);
  EXPECT_EQ(cxr_rdma_devices(nullptr, 0, &n, why, 1), 0);

  // Two live engines over TCP on loopback: a listener that exports, a client.
  cxr_rdma *srv = nullptr, *cli = nullptr;
  cxr_rdma_opts_init(&o);
  o.listen = "127.0.0.1:0";
  ASSERT_EQ(cxr_rdma_open(&srv, &o), 0);
  ASSERT_EQ(cxr_rdma_open(&cli, nullptr), 0);
  EXPECT_EQ(cxr_rdma_port(cli), 0);
  int port = cxr_rdma_port(srv);
  ASSERT_GT(port, 0);
  std::string hp = "127.0.0.1:" + std::to_string(port);
  alignas(64) static uint64_t mem[512];
  cxr_rdma_mr *emr = nullptr;
  EXPECT_EQ(cxr_rdma_export(srv, nullptr, mem, sizeof mem, &emr), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_export(srv, "mem", nullptr, sizeof mem, &emr), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_export(srv, "mem", mem, sizeof mem, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_export(srv, "", mem, sizeof mem, &emr), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_export(srv, "mem", mem, 0, &emr), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_export(srv, std::string(32, 'n').c_str(), mem, sizeof mem, &emr),
            CXR_ENAMETOOLONG);
  ASSERT_EQ(cxr_rdma_export(srv, "mem", mem, sizeof mem, &emr), 0);
  MsgChecks mc;
  ASSERT_EQ(cxr_rdma_am_set(srv, 20, am_check, &mc), 0);
  cxr_rdma_mr *emr2 = nullptr;
  EXPECT_EQ(cxr_rdma_export(srv, "mem", mem, sizeof mem, &emr2), CXR_EEXIST);
  EXPECT_EQ(emr2, nullptr);
  // reg
  EXPECT_EQ(cxr_rdma_reg(cli, nullptr, 8, &mr), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_reg(cli, buf, 0, &mr), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_reg(cli, buf, 8, nullptr), CXR_EINVAL);
  EXPECT_EQ(mr, nullptr);
  // am_set, defer, stats
  EXPECT_EQ(cxr_rdma_am_set(cli, 15, am_noop, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_am_set(cli, 256, am_noop, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_am_set(cli, UINT_MAX, am_noop, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_am_set(cli, 0, am_noop, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_am_set(cli, 20, nullptr, nullptr), 0);  // removes (none there)
  EXPECT_EQ(cxr_rdma_defer(cli, nullptr, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_stats_get(cli, nullptr), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_stats_get(cli, &rs), 0);
  // connect
  EXPECT_EQ(cxr_rdma_connect(cli, nullptr, 0, &ep), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_connect(cli, hp.c_str(), 0, nullptr), CXR_EINVAL);
  for (const char *b : {"", "127.0.0.1", "127.0.0.1:", "127.0.0.1:65536", "127.0.0.1:-1",
                        ":1", "127.0.0.1:x"}) {
    ep = reinterpret_cast<cxr_rdma_ep *>(1);
    EXPECT_EQ(cxr_rdma_connect(cli, b, 0, &ep), CXR_EINVAL) << b;
    EXPECT_EQ(ep, nullptr) << b;
  }
  EXPECT_EQ(cxr_rdma_connect(cli, (std::string(80, 'h') + ":1").c_str(), 0, &ep),
            CXR_ENAMETOOLONG);
  cxr_rdma_forget(cli, nullptr);
  cxr_rdma_forget(cli, "");
  cxr_rdma_forget(cli, "no-such-host:1");
  ASSERT_EQ(cxr_rdma_connect(cli, hp.c_str(), INT64_MAX, &ep), 0);
  EXPECT_EQ(cxr_rdma_ep_status(ep), 0);
  EXPECT_EQ(cxr_rdma_ep_on_error(ep, nullptr, nullptr), 0);  // NULL cb clears it
  // messages: ids, header size, NULL buffers with lengths
  EXPECT_EQ(cxr_rdma_am_send(ep, 15, buf, 1, nullptr, 0, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_am_send(ep, 256, buf, 1, nullptr, 0, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_am_send(ep, 20, nullptr, 1, nullptr, 0, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_am_send(ep, 20, buf, 1025, nullptr, 0, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_am_send(ep, 20, buf, SIZE_MAX, nullptr, 0, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_am_send(ep, 20, buf, 1, nullptr, 1, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_am_post(ep, 15, buf, 1, nullptr, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_am_post(ep, 256, buf, 1, nullptr, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_am_post(ep, 20, nullptr, 1, nullptr, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_am_post(ep, 20, buf, 1025, nullptr, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_am_post(ep, 20, buf, 1, nullptr, 1), CXR_EINVAL);
  struct iovec null_base[2] = {{buf, 8}, {nullptr, 8}};
  EXPECT_EQ(cxr_rdma_am_send(ep, 22, buf, 1, null_base, 2, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_am_post(ep, 22, buf, 1, null_base, 2), CXR_EINVAL);
  struct iovec huge[2] = {{buf, 8}, {buf, SIZE_MAX}};
  EXPECT_EQ(cxr_rdma_am_send(ep, 22, buf, 1, huge, 2, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_am_post(ep, 22, buf, 1, huge, 2), CXR_EINVAL);
  // Registrations of ranges that wrap around the address space.
  mr = reinterpret_cast<cxr_rdma_mr *>(1);
  EXPECT_EQ(cxr_rdma_reg(cli, buf, SIZE_MAX, &mr), CXR_EINVAL);
  EXPECT_EQ(mr, nullptr);
  EXPECT_EQ(cxr_rdma_export(cli, "wrap", buf, SIZE_MAX, &mr), CXR_EINVAL);
  // keys and one-sided ops
  rk = reinterpret_cast<cxr_rdma_rkey *>(1);
  EXPECT_EQ(cxr_rdma_rkey_get(ep, nullptr, &rk, &base, &len), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_rkey_get(ep, "mem", nullptr, &base, &len), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_rkey_get(ep, "nope", &rk, &base, &len), CXR_ENOENT);
  EXPECT_EQ(rk, nullptr);
  int rrc = cxr_rdma_refresh(ep, -1);  // a deadline long past: no hang
  EXPECT_TRUE(rrc == 0 || rrc == CXR_ETIMEDOUT) << rrc;
  ASSERT_EQ(cxr_rdma_rkey_get(ep, "mem", &rk, nullptr, nullptr), 0);
  ASSERT_EQ(cxr_rdma_rkey_get(ep, "mem", &rk, &base, &len), 0);
  ASSERT_EQ(len, sizeof mem);
  uint64_t end = base + len;
  EXPECT_EQ(cxr_rdma_put(ep, nullptr, base, buf, 8, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_put(ep, rk, base, nullptr, 8, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_put(ep, rk, base - 8, buf, 8, 0), CXR_ERANGE);
  EXPECT_EQ(cxr_rdma_put(ep, rk, end - 4, buf, 8, 0), CXR_ERANGE);
  EXPECT_EQ(cxr_rdma_put(ep, rk, base, buf, SIZE_MAX, 0), CXR_ERANGE);
  EXPECT_EQ(cxr_rdma_put(ep, rk, UINT64_MAX - 4, buf, 8, 0), CXR_ERANGE);
  EXPECT_EQ(cxr_rdma_get(ep, nullptr, base, buf, 8, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_get(ep, rk, base, nullptr, 8, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_get(ep, rk, end, buf, 1, 0), CXR_ERANGE);
  EXPECT_EQ(cxr_rdma_get(ep, rk, base, buf, SIZE_MAX, 0), CXR_ERANGE);
  EXPECT_EQ(cxr_rdma_get(ep, rk, UINT64_MAX - 4, buf, 8, 0), CXR_ERANGE);
  EXPECT_EQ(cxr_rdma_get(ep, rk, base, buf, 0, 0), 0);
  EXPECT_EQ(cxr_rdma_fadd64(ep, nullptr, base, 1, &old, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_fadd64(ep, rk, base + 4, 1, &old, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_fadd64(ep, rk, end, 1, &old, 0), CXR_ERANGE);
  EXPECT_EQ(cxr_rdma_fadd64(ep, rk, UINT64_MAX - 7, 1, &old, 0), CXR_ERANGE);
  EXPECT_EQ(cxr_rdma_fadd64(ep, rk, base, 1, nullptr, 0), 0);  // old not wanted
  EXPECT_EQ(cxr_rdma_cswap64(ep, nullptr, base, 0, 1, &old, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_cswap64(ep, rk, base + 1, 0, 1, &old, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_cswap64(ep, rk, end, 0, 1, &old, 0), CXR_ERANGE);
  EXPECT_EQ(cxr_rdma_cswap64(ep, rk, base, 5, 1, nullptr, 0), 0);
  EXPECT_EQ(cxr_rdma_swap64(ep, nullptr, base, 1, &old, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_swap64(ep, rk, base + 2, 1, &old, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_swap64(ep, rk, end, 1, &old, 0), CXR_ERANGE);
  EXPECT_EQ(cxr_rdma_swap64(ep, rk, base, 0, nullptr, 0), 0);
  EXPECT_EQ(cxr_rdma_get(ep, rk, base, buf, 8, INT64_MAX), 0);
  EXPECT_EQ(cxr_rdma_am_send(ep, 20, buf, 1, nullptr, 0, INT64_MAX), 0);
  for (int64_t end = cxr_now_ns() + 5 * kSec; mc.seen.load() == 0 && cxr_now_ns() < end;)
    usleep(1000);
  ASSERT_EQ(mc.seen.load(), 1);
  EXPECT_EQ(mc.bad.load(), 0) << "the message check that failed is at this line";

  // ALock: bad locks and refs.
  EXPECT_EQ(cxr_alock_init(nullptr, 0), CXR_EINVAL);
  static cxr_alock lock;
  EXPECT_EQ(cxr_alock_init(reinterpret_cast<cxr_alock *>(reinterpret_cast<char *>(&lock) + 8),
                           0),
            CXR_EINVAL);
  ASSERT_EQ(cxr_alock_init(&lock, 0), 0);
  EXPECT_EQ(cxr_alock_lock(nullptr, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_alock_unlock(nullptr), CXR_EINVAL);
  cxr_alock_ref ref = {};
  ref.local = &lock;
  ref.slot = CXR_ALOCK_SLOTS;
  EXPECT_EQ(cxr_alock_lock(&ref, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_alock_unlock(&ref), CXR_EINVAL);
  ref.slot = UINT_MAX;
  EXPECT_EQ(cxr_alock_lock(&ref, 0), CXR_EINVAL);
  cxr_alock_ref rem = {};  // remote: ep and rk required
  EXPECT_EQ(cxr_alock_lock(&rem, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_alock_unlock(&rem), CXR_EINVAL);
  rem.ep = ep;
  EXPECT_EQ(cxr_alock_lock(&rem, 0), CXR_EINVAL);
  rem.ep = nullptr;
  rem.rk = rk;
  EXPECT_EQ(cxr_alock_lock(&rem, 0), CXR_EINVAL);
  // A deadline already past: the lock is free, so taking it may still succeed at once;
  // either way no hang and a documented code.
  ref.slot = 0;
  int rc = cxr_alock_lock(&ref, 1);
  EXPECT_TRUE(rc == 0 || rc == CXR_ETIMEDOUT) << rc;
  if (rc == 0) {
    EXPECT_EQ(cxr_alock_unlock(&ref), 0);
  }
  EXPECT_EQ(cxr_alock_lock(&ref, INT64_MAX), 0);
  EXPECT_EQ(cxr_alock_unlock(&ref), 0);
  // Unlocks of a lock not held: again, from a slot never used, while another slot holds it,
  // and from another rack (the lock exported by srv) while nobody holds it.
  EXPECT_EQ(cxr_alock_unlock(&ref), CXR_EINVAL);
  cxr_alock_ref other = ref;
  other.slot = 5;
  EXPECT_EQ(cxr_alock_unlock(&other), CXR_EINVAL);
  ASSERT_EQ(cxr_alock_lock(&ref, 0), 0);
  EXPECT_EQ(cxr_alock_unlock(&other), CXR_EINVAL);
  EXPECT_EQ(cxr_alock_unlock(&ref), 0);
  cxr_rdma_mr *lmr = nullptr;
  ASSERT_EQ(cxr_rdma_export(srv, "lock", &lock, sizeof lock, &lmr), 0);
  ASSERT_EQ(cxr_rdma_refresh(ep, 0), 0);
  cxr_rdma_rkey *lrk = nullptr;
  ASSERT_EQ(cxr_rdma_rkey_get(ep, "lock", &lrk, nullptr, nullptr), 0);
  cxr_alock_ref far = {};
  far.ep = ep;
  far.rk = lrk;
  far.addr = (uint64_t)(uintptr_t)&lock;
  EXPECT_EQ(cxr_alock_unlock(&far), CXR_EINVAL);
  far.rk = rk;  // the key of another export: the lock is outside it
  EXPECT_EQ(cxr_alock_lock(&far, 0), CXR_ERANGE);

  // A key on another endpoint: CXR_EINVAL.
  cxr_rdma_ep *ep2 = nullptr;
  ASSERT_EQ(cxr_rdma_connect(cli, hp.c_str(), 0, &ep2), 0);
  EXPECT_EQ(cxr_rdma_get(ep2, rk, base, buf, 8, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_put(ep2, rk, base, buf, 8, 0), CXR_EINVAL);
  EXPECT_EQ(cxr_rdma_fadd64(ep2, rk, base, 1, &old, 0), CXR_EINVAL);
  cxr_alock_ref far2 = {};  // a key got on another endpoint
  far2.ep = ep2;
  far2.rk = lrk;
  far2.addr = (uint64_t)(uintptr_t)&lock;
  EXPECT_EQ(cxr_alock_lock(&far2, 0), CXR_EINVAL);
  cxr_rdma_ep_close(ep2);
  cxr_rdma_ep_close(ep);
  cxr_rdma_dereg(lmr);
  cxr_rdma_dereg(emr);
  cxr_rdma_close(cli);
  cxr_rdma_close(srv);
  // An engine that pins, with a budget smaller than a registration or an export.
  cxr_rdma_opts_init(&o);
  o.pin_mode = CXR_RDMA_PIN_ALWAYS;
  o.pin_budget = 64 << 10;
  o.bounce_size = 8 << 10;
  ASSERT_EQ(cxr_rdma_open(&r, &o), 0);
  static char pinme[256 << 10];
  mr = reinterpret_cast<cxr_rdma_mr *>(1);
  EXPECT_EQ(cxr_rdma_reg(r, pinme, sizeof pinme, &mr), CXR_EFULL);
  EXPECT_EQ(mr, nullptr);
  EXPECT_EQ(cxr_rdma_export(r, "big", pinme, sizeof pinme, &mr), CXR_EFULL);
  cxr_rdma_close(r);
  // The longest busy-poll: the engine still closes (its progress thread is told to stop).
  cxr_rdma_opts_init(&o);
  o.spin_ns = INT64_MAX;
  ASSERT_EQ(cxr_rdma_open(&r, &o), 0);
  cxr_rdma_close(r);
}

}  // namespace

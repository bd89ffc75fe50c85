// `cxrpcctl heaps`: lists heaps with address, size, use, holders and lease state, and
// --reap recovers a dead holder.
#include <gtest/gtest.h>

#include <cxrpc/shm.h>

#include "tests/shm/util.h"
#include "tools/heaps.h"

using namespace shmtest;

static std::string g_root = setup_root("ctl_test");

static std::string run_heaps(std::vector<const char *> args) {
  char *buf = nullptr;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  args.insert(args.begin(), "heaps");
  int rc = cxr__ctl_heaps((int)args.size(), (char **)args.data(), f);
  fclose(f);
  std::string out(buf, len);
  free(buf);
  return rc == 0 ? out : "rc=" + std::to_string(rc);
}

TEST(Ctl, HeapsShowsHoldersAndDeadLeases) {
  EXPECT_NE(run_heaps({}).find("0 heap(s)"), std::string::npos);
  EXPECT_EQ(run_heaps({"--bogus"}), "rc=2");
  std::string name = uniq("ctl");
  cxr_heap *h = nullptr;
  ASSERT_EQ(cxr_heap_create(&h, name.c_str(), 4 << 20, nullptr), 0);
  ASSERT_NE(cxr_heap_alloc_pages(h, 1 << 20), nullptr);
  pid_t pid = spawn([&]() -> int {
    cxr_heap *c;
    if (cxr_heap_open(&c, name.c_str()) != 0) return 10;
    cxr_heap_alloc(c, 100);
    kill(getpid(), SIGKILL);
    return 0;
  });
  EXPECT_EQ(wait_child(pid), 128 + SIGKILL);
  std::string out = run_heaps({});
  EXPECT_NE(out.find(name), std::string::npos) << out;
  EXPECT_NE(out.find("dead:1"), std::string::npos) << out;
  EXPECT_NE(out.find("4.0 MiB"), std::string::npos) << out;
  EXPECT_NE(out.find("1 heap(s)"), std::string::npos) << out;
  out = run_heaps({"--reap"});
  EXPECT_NE(out.find("reaped 1 dead holder(s) of " + name), std::string::npos) << out;
  EXPECT_EQ(out.find("dead:"), std::string::npos) << out;
  EXPECT_NE(out.find(" ok "), std::string::npos) << out;
  cxr_heap_close(h);
  out = run_heaps({});
  EXPECT_NE(out.find("unheld"), std::string::npos) << out;
  EXPECT_EQ(cxr_heap_unlink(name.c_str()), 0);
  EXPECT_NE(run_heaps({}).find("0 heap(s)"), std::string::npos);
  EXPECT_TRUE(list_dir(g_root).empty());
}

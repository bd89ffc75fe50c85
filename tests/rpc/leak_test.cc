// 1000 connect/disconnect cycles (each with a call) against a server process leak no
// files, mappings or descriptors, in the client or in the server.
#include <gtest/gtest.h>

#include "tests/rpc/methods.h"
#include "tests/rpc/util.h"

using namespace rpctest;

namespace {

struct Usage {
  int fds, maps, heap_maps, files;
};

// Mappings of files under the root (heaps), counted exactly; all mappings, which
// sanitizers' own shadow mappings make move a little, are compared loosely.
int count_maps_of(const std::string &maps, const std::string &root) {
  FILE *f = fopen(maps.c_str(), "r");
  if (!f) return -1;
  int n = 0;
  char line[4096];
  while (fgets(line, sizeof line, f))
    if (strstr(line, root.c_str())) n++;
  fclose(f);
  return n;
}

Usage usage(int pid, const std::string &root) {
  std::string p = "/proc/" + std::to_string(pid);
  return Usage{count_dir((p + "/fd").c_str()), count_lines((p + "/maps").c_str()),
               count_maps_of(p + "/maps", root), count_dir(root.c_str())};
}

TEST(Leak, ThousandConnectCyclesLeakNothing) {
  std::string root = setup_root("rpc-leak");
  std::string name = uniq("lk");
  Peer srv = start_server(name, 1);
  ASSERT_GT(srv.pid, 0);
  auto cycle = [&](int i) {
    cxr_conn *c;
    int rc = connect_patiently(&c, name);
    if (rc != 0) return rc;
    add_args a = {i, 1};
    cxr_call_opts o = inline_opts(sizeof a);
    void *r = nullptr;
    rc = cxr_conn_call(c, M_ADD, &a, &r, &o);
    if (rc == 0 && (r == nullptr || *(int64_t *)r != i + 1)) rc = CXR_EPROTO;
    if (r) cxr_heap_free(cxr_conn_heap(c), r);
    cxr_conn_close(c);
    return rc;
  };
  for (int i = 0; i < 20; i++) ASSERT_EQ(cycle(i), 0);  // warm up: pool and caches
  usleep(200000);
  Usage me0 = usage(getpid(), root), srv0 = usage(srv.pid, root);
  int failures = 0;
  int64_t t0 = cxr_now_ns();
  for (int i = 0; i < 1000 && ms_since(t0) < 60000; i++)
    if (cycle(i) != 0) failures++;
  printf("1000 connect+call+close cycles in %lld ms\n", (long long)ms_since(t0));
  EXPECT_EQ(failures, 0);
  usleep(200000);  // the server recycles the last connections
  Usage me1 = usage(getpid(), root), srv1 = usage(srv.pid, root);
  // Client descriptors: exactly as before. Heaps: a slow server may ready one more slot for
  // its pool during a burst, and the client keeps up to 8 spare mappings (rpc/conn.c), so
  // heap files and mappings may grow by a bounded few, never with the number of cycles. The
  // server's descriptors likewise: each slot it ever readies keeps its seal table (a memfd)
  // for the channel's life (TSan once saw +2 after a burst).
  EXPECT_EQ(me1.fds, me0.fds);
  EXPECT_LE(me1.heap_maps, 1 + 8);
  EXPECT_LE(me1.maps, me0.maps + 8 + 8);
  EXPECT_LE(srv1.fds, srv0.fds + 3);
  EXPECT_LE(srv1.heap_maps, srv0.heap_maps + 3);
  EXPECT_LE(srv1.maps, srv0.maps + 8 + 3);
  EXPECT_LE(me1.files, me0.files + 3);
  printf("client fds %d maps %d (heaps %d); server fds %d maps %d (heaps %d); files %d\n",
         me1.fds, me1.maps, me1.heap_maps, srv1.fds, srv1.maps, srv1.heap_maps, me1.files);
  stop_peer(srv);
}

}  // namespace

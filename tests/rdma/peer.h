// The rdma_peer server process of the rdma tests: started on a free loopback port, it
// exports "mem" (4 MiB, byte i is i & 0xff) and "spare", and echoes message 20 as 21.
#pragma once
#include <stdint.h>
#include <stdio.h>

#include <string>

#include "tests/rdma/proc.h"

namespace cxrt {

struct Peer {
  Proc p;
  int port = 0;
  uintptr_t mem = 0;
  bool start() {
    if (!p.start({"tests/rdma/rdma_peer", "serve", "127.0.0.1:0"})) return false;
    std::string l = p.line(10000);
    void *m = nullptr;
    if (sscanf(l.c_str(), "READY %d %p", &port, &m) != 2) return false;
    mem = (uintptr_t)m;
    return true;
  }
  std::string addr() const { return "127.0.0.1:" + std::to_string(port); }
};

}  // namespace cxrt

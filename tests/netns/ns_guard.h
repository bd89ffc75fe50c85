// Moves the calling thread into a network namespace for a scope (threads it starts there,
// such as the rdma progress thread, stay in it), and back at the end.
#pragma once
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <string>

namespace cxrt {

struct NsGuard {
  int orig = -1;
  bool ok = false;
  explicit NsGuard(const std::string &ns) {
    orig = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    int fd = open(("/var/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
    ok = orig >= 0 && fd >= 0 && setns(fd, CLONE_NEWNET) == 0;
    if (fd >= 0) close(fd);
  }
  ~NsGuard() {
    if (orig >= 0) {
      if (ok) setns(orig, CLONE_NEWNET);
      close(orig);
    }
  }
};

}  // namespace cxrt

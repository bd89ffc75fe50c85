// The one piece every suite needs first: a CXRPC_ROOT of the test binary's own
// ($TEST_TMPDIR/<tag>-<pid>), set before the first cxr_* call. Header-only (//tests:root).
#ifndef CXRPC_TESTS_ROOT_H
#define CXRPC_TESTS_ROOT_H

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

namespace cxrt {

inline std::string setup_root(const char *tag) {
  const char *t = getenv("TEST_TMPDIR");
  std::string root = std::string(t ? t : "/tmp") + "/" + tag + "-" + std::to_string(getpid());
  mkdir(root.c_str(), 0777);
  setenv("CXRPC_ROOT", root.c_str(), 1);
  return root;
}

}  // namespace cxrt

#endif

// The default cxrpcd socket lies in the root the process runs with: a root given through
// cxr_init_opts.root wins over $CXRPC_ROOT, as everywhere else (it used to be read from the
// environment alone, so such a process looked for cxrpcd in the wrong folder).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <string>

#include <cxrpc/shm.h>

#include "sandbox/internal.h"

namespace {

TEST(CxrpcdPath, FollowsTheRootOfCxrInit) {
  // Short folders: the socket path must fit a sockaddr_un ($TEST_TMPDIR may not). The
  // environment names another folder (never created: cxr_init takes o.root instead).
  setenv("CXRPC_ROOT", "/tmp/cxrpcd-path-env", 1);
  char tmpl[] = "/tmp/cxrpcd-path-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string root = tmpl;
  unsetenv("CXRPC_CXRPCD");
  cxr_init_opts o;
  cxr_init_opts_init(&o);
  o.root = root.c_str();
  ASSERT_EQ(cxr_init(&o), 0);
  char path[108];
  ASSERT_EQ(cxr__cxrpcd_path(nullptr, path, sizeof path), 0);
  EXPECT_EQ(std::string(path), root + "/cxrpcd.sock");
  // An explicit path and $CXRPC_CXRPCD still come first.
  ASSERT_EQ(cxr__cxrpcd_path("/x/s.sock", path, sizeof path), 0);
  EXPECT_STREQ(path, "/x/s.sock");
  setenv("CXRPC_CXRPCD", "/y/s.sock", 1);
  ASSERT_EQ(cxr__cxrpcd_path(nullptr, path, sizeof path), 0);
  EXPECT_STREQ(path, "/y/s.sock");
  rmdir(root.c_str());
}

}  // namespace

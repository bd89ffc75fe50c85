// `cxrpcctl doctor` on this machine: no RDMA device, no pkeys, no DAX, UCX over TCP. The
// report must say so line by line and still succeed.
#include <gtest/gtest.h>
#include <stdio.h>
#include <stdlib.h>

#include <sys/wait.h>

#include <string>
#include <vector>

#include "tests/rdma/env_writes.h"
#include "tools/doctor.h"

namespace {

std::string run_doctor(std::vector<const char *> args, int *rc) {
  char *buf = nullptr;
  size_t len = 0;
  FILE *m = open_memstream(&buf, &len);
  *rc = cxr__doctor((int)args.size(), (char **)args.data(), m);
  fclose(m);
  std::string s(buf, len);
  free(buf);
  return s;
}

// What the shell command cmd prints (stdout and stderr); *status: its exit status.
std::string run_cxrpcctl(const std::string &cmd, int *status) {
  FILE *p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return "popen failed";
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof buf, p)) out += buf;
  int st = pclose(p);
  *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

std::string value(const std::string &report, const std::string &key) {
  size_t p = report.find("\n" + key + ": ");
  if (p == std::string::npos && report.rfind(key + ": ", 0) == 0) p = (size_t)-1;
  else if (p == std::string::npos) return "<missing>";
  size_t start = p + 1 + key.size() + 2;
  return report.substr(start, report.find('\n', start) - start);
}

TEST(Doctor, ReportsEveryFeatureAndDegradesGracefully) {
  int rc = -1;
  std::string r = run_doctor({"doctor"}, &rc);
  EXPECT_EQ(rc, 0) << r;
  // Every key is present, whatever the machine offers.
  for (const char *k : {"rdma.devices", "rdma.odp", "rdma.dc", "rdma.pinning", "ucx.version",
                        "ucx.transports", "env.UCX_TLS", "pkeys", "dax"})
    EXPECT_NE(value(r, k), "<missing>") << k << "\n" << r;
  // This machine: rdma-core finds no device (and says why), so nothing is pinned.
  std::string devs = value(r, "rdma.devices");
  if (devs.rfind("0", 0) == 0) {
    EXPECT_NE(devs, "0") << "a reason must follow the count";
    EXPECT_EQ(value(r, "rdma.odp"), "n/a (no device)");
    EXPECT_EQ(value(r, "rdma.pinning").rfind("never", 0), 0u);
    EXPECT_EQ(r.find("rdma.device: "), std::string::npos);
  }
  // The test runs with UCX_TLS=tcp on loopback: tcp/lo must be listed, shared memory not.
  std::string tl = value(r, "ucx.transports");
  EXPECT_NE(tl.find("tcp/lo"), std::string::npos) << tl;
  EXPECT_EQ(tl.find("posix/"), std::string::npos) << tl;
  EXPECT_EQ(value(r, "env.UCX_TLS"), "tcp");
  std::string pk = value(r, "pkeys");
  EXPECT_TRUE(pk == "yes" || pk.rfind("no (pkey_alloc: ", 0) == 0) << pk;
  std::string dax = value(r, "dax");
  EXPECT_TRUE(dax.rfind("yes", 0) == 0 || dax.rfind("no (", 0) == 0) << dax;
}

// Run as `UCX_TLS=no_such_transport cxrpcctl doctor`, not with setenv here: the other tests
// run UCX in this process, and whether it leaves a thread that may call getenv while setenv
// moves environ depends on UCX's build and the machine's devices (here it left none).
TEST(Doctor, UnknownTransportsAreReportedNotFatal) {
  int st = -1;
  std::string r = run_cxrpcctl("UCX_TLS=no_such_transport tools/cxrpcctl doctor", &st);
  EXPECT_EQ(st, 0) << r;
  EXPECT_EQ(value(r, "ucx.transports").rfind("none", 0), 0u) << r;
  // The setting that made UCX fail is shown beside it (it used to be left out then).
  EXPECT_EQ(value(r, "env.UCX_TLS"), "no_such_transport") << r;
  EXPECT_NE(value(r, "env.CXRPC_RDMA_PIN"), "<missing>") << r;
}

TEST(Doctor, Usage) {
  int rc = -1;
  run_doctor({"doctor", "--bogus"}, &rc);
  EXPECT_EQ(rc, 2);
  std::string h = run_doctor({"doctor", "--help"}, &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_NE(h.find("usage: cxrpcctl doctor"), std::string::npos);
}

// The real command line, as an operator runs it.
TEST(Doctor, CxrpcctlDoctorRunsAndSaysWhatIsMissing) {
  int st = -1;
  std::string out = run_cxrpcctl("tools/cxrpcctl doctor", &st);
  EXPECT_EQ(st, 0) << out;
  EXPECT_NE(out.find("rdma.devices: "), std::string::npos) << out;
  EXPECT_NE(out.find("ucx.transports: "), std::string::npos) << out;
  EXPECT_NE(out.find("pkeys: "), std::string::npos) << out;
  EXPECT_NE(out.find("dax: "), std::string::npos) << out;
}

}  // namespace

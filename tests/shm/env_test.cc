// Numbers from CXRPC_* variables go through one parser (shm/env.h): garbage, trailing junk,
// a sign, overflow or a value out of range take the default with one warning that names
// the variable, its value and the default; valid values are used. Before, every reader had
// its own strtoul: CXRPC_LEASE_MS=12x silently made a 12 ms lease (strtol without an end
// check), so holders on other hosts were taken for dead after 12 ms instead of 10 s.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

#include <cxrpc/base.h>

#include "shm/env.h"

extern "C" int64_t cxr__lease_ns(void);  // shm/internal.h (which pulls in libpmem2)

namespace {

// How many lines of text the calls in f wrote to stderr that contain all of needles.
template <typename F>
int lines_with(F f, std::initializer_list<std::string> needles, std::string *all = nullptr) {
  int level = cxr_log_level();
  cxr_log_set_level(CXR_LOG_WARN);
  testing::internal::CaptureStderr();
  f();
  std::string err = testing::internal::GetCapturedStderr();
  cxr_log_set_level(level);
  if (all) *all = err;
  int n = 0;
  for (size_t at = 0, nl; at < err.size(); at = nl + 1) {
    nl = err.find('\n', at);
    if (nl == std::string::npos) nl = err.size();
    std::string line = err.substr(at, nl - at);
    bool every = true;
    for (const std::string &s : needles) every = every && line.find(s) != std::string::npos;
    n += every;
  }
  return n;
}

TEST(EnvNumbers, BadValuesTakeTheDefaultWithOneWarningNamingVariableValueAndDefault) {
  const char *bad[] = {"abc", "12x", "-5", " 7", "+7", "7 ", "1e3", "0x", "0x1g", "",
                       "99999999999999999999999", "0x10000000000000000",
                       "0",      // below min
                       "1001"};  // above max
  for (const char *v : bad) {
    if (!*v) continue;  // empty is "unset": below
    setenv("CXRPC_ENV_TEST", v, 1);
    uint64_t out = 7;
    int rc = 1;
    std::string log;
    int n = lines_with([&] { rc = cxr__env_u64("CXRPC_ENV_TEST", 42, 1, 1000, &out); },
                       {"warn", std::string("CXRPC_ENV_TEST=") + v + ":", "default, 42"}, &log);
    EXPECT_EQ(rc, CXR_EINVAL) << v;
    EXPECT_EQ(out, 42u) << v;
    EXPECT_EQ(n, 1) << v << ": " << log;
    // Read again (a per-connection reader): the same bad setting is not warned about twice.
    EXPECT_EQ(lines_with([&] { cxr__env_u64("CXRPC_ENV_TEST", 42, 1, 1000, &out); }, {"warn"}),
              0) << v;
    EXPECT_EQ(out, 42u) << v;
  }
  unsetenv("CXRPC_ENV_TEST");
}

TEST(EnvNumbers, ValidValuesAreUsedAndUnsetOrEmptyTakeTheDefaultSilently) {
  struct { const char *v; uint64_t want; } ok[] = {
      {"1", 1}, {"7", 7}, {"010", 10}, {"0x10", 16}, {"0X3e8", 1000}, {"1000", 1000}};
  for (auto &c : ok) {
    setenv("CXRPC_ENV_TEST_OK", c.v, 1);
    uint64_t out = 0;
    int rc = 1;
    EXPECT_EQ(lines_with([&] { rc = cxr__env_u64("CXRPC_ENV_TEST_OK", 42, 1, 1000, &out); },
                         {"CXRPC_ENV_TEST_OK"}),
              0) << c.v;
    EXPECT_EQ(rc, 0) << c.v;
    EXPECT_EQ(out, c.want) << c.v;
  }
  for (const char *v : {"", (const char *)nullptr}) {
    if (v) setenv("CXRPC_ENV_TEST_OK", v, 1);
    else unsetenv("CXRPC_ENV_TEST_OK");
    uint64_t out = 0;
    int rc = 1;
    EXPECT_EQ(lines_with([&] { rc = cxr__env_u64("CXRPC_ENV_TEST_OK", 42, 1, 1000, &out); },
                         {"CXRPC_ENV_TEST_OK"}),
              0);
    EXPECT_EQ(rc, 0);
    EXPECT_EQ(out, 42u);
  }
}

TEST(EnvNumbers, SizesTakeKMGSuffixesAndRefuseWhatOverflows) {
  struct { const char *v; uint64_t want; } ok[] = {
      {"64M", 64ull << 20}, {"2k", 2048}, {"0x10G", 16ull << 30}, {"5", 5}, {"3g", 3ull << 30}};
  for (auto &c : ok) {
    setenv("CXRPC_ENV_TEST_SZ", c.v, 1);
    uint64_t out = 0;
    EXPECT_EQ(cxr__env_bytes("CXRPC_ENV_TEST_SZ", 9, 1, UINT64_MAX, &out), 0) << c.v;
    EXPECT_EQ(out, c.want) << c.v;
  }
  // "2x" was 2 bytes, "64MB" 64 MiB by luck, "17179869184G" wrapped to 0 (then unchanged).
  for (const char *v : {"2x", "64MB", "1 G", "17179869184G", "G", "0"}) {
    setenv("CXRPC_ENV_TEST_SZ", v, 1);
    uint64_t out = 0;
    int n = lines_with([&] { cxr__env_bytes("CXRPC_ENV_TEST_SZ", 9, 1, UINT64_MAX, &out); },
                       {"warn", std::string("CXRPC_ENV_TEST_SZ=") + v + ":", "default, 9"});
    EXPECT_EQ(out, 9u) << v;
    EXPECT_EQ(n, 1) << v;
  }
  unsetenv("CXRPC_ENV_TEST_SZ");
  // Without units a suffix is junk.
  uint64_t v = 0;
  EXPECT_EQ(cxr__parse_u64("64M", false, &v), CXR_EINVAL);
  EXPECT_EQ(cxr__parse_u64("18446744073709551615", false, &v), 0);
  EXPECT_EQ(v, UINT64_MAX);
  EXPECT_EQ(cxr__parse_u64("18446744073709551616", false, &v), CXR_EINVAL);
}

TEST(EnvNumbers, OneWindowParserForShmAndTheSandbox) {
  uintptr_t base = 1;
  size_t size = 1;
  ASSERT_EQ(cxr__parse_window("0x650000000000-0x700000000000", &base, &size), 0);
  EXPECT_EQ(base, 0x650000000000u);
  EXPECT_EQ(size, 0xb0000000000u);
  for (const char *w : {"", "0x600000000000", "0x600000000000-", "-0x700000000000",
                        "0x600000000000-0x700000000000x", "0x600000000000 - 0x700000000000",
                        "0x700000000000-0x600000000000", "0x600000000000-0x600000000000",
                        "0x600000001000-0x700000000000",            // not 2 MiB aligned
                        "0x600000000000-0x10000000000000000000",    // overflow
                        "0x600000000000-0x900000000000",            // past user space
                        "-0x1000-0x700000000000"}) {
    base = 1, size = 1;
    EXPECT_EQ(cxr__parse_window(w, &base, &size), CXR_EINVAL) << w;
    EXPECT_EQ(base, 1u) << w;
    EXPECT_EQ(size, 1u) << w;
  }
}

TEST(EnvNumbers, ALeaseOfTwelveJunkIsTheDefaultTenSecondsNotTwelveMilliseconds) {
  // The only case of this binary that reads the lease: it is read once per process.
  setenv("CXRPC_LEASE_MS", "12x", 1);
  int64_t lease = 0;
  int n = lines_with([&] { lease = cxr__lease_ns(); }, {"warn", "CXRPC_LEASE_MS=12x:", "10000"});
  unsetenv("CXRPC_LEASE_MS");
  EXPECT_EQ(lease, 10000ll * 1000000) << "ms: " << lease / 1000000;
  EXPECT_EQ(n, 1);
}

}  // namespace

// SPDX-License-Identifier: Apache-2.0
// HORA_THREAD_AFFINITY: which CPU each local rank's engine threads get, and binding to it.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <thread>
#include <vector>

#include "base/error.h"
#include "core/affinity.h"

namespace hora {
namespace {

std::vector<int> cpus(int n) {
  std::vector<int> v;
  for (int c = 0; c < n; ++c) v.push_back(c);
  return v;
}

TEST(Affinity, AutoSpreadsLocalRanksOverAnUnboundProcessesCpus) {
  EXPECT_EQ(pickEngineCpu("auto", 0, 2, cpus(2), 2), 0);
  EXPECT_EQ(pickEngineCpu("auto", 1, 2, cpus(2), 2), 1);
  // Two ranks on 16 CPUs: half the machine apart.
  EXPECT_EQ(pickEngineCpu("auto", 0, 2, cpus(16), 16), 0);
  EXPECT_EQ(pickEngineCpu("auto", 1, 2, cpus(16), 16), 8);
  // Every local rank of 4 on 8 CPUs gets its own.
  std::vector<int> got;
  for (int r = 0; r < 4; ++r) got.push_back(pickEngineCpu("auto", r, 4, cpus(8), 8));
  EXPECT_EQ(got, (std::vector<int>{0, 2, 4, 6}));
  // Allowed CPUs need not start at 0 or be contiguous, as long as they are all online ones.
  EXPECT_EQ(pickEngineCpu("auto", 1, 2, {2, 5, 9, 11}, 4), 9);
}

TEST(Affinity, AutoLeavesBoundOrOversubscribedRanksAlone) {
  EXPECT_EQ(pickEngineCpu("auto", 0, 2, {3}, 16), -1);        // the launcher bound the rank
  EXPECT_EQ(pickEngineCpu("auto", 3, 4, cpus(2), 2), -1);     // more ranks than CPUs
  EXPECT_EQ(pickEngineCpu("auto", 0, 1, cpus(8), 16), -1);    // a subset: someone chose it
  EXPECT_EQ(pickEngineCpu("auto", 0, 1, cpus(16), 16), -1);   // alone on its host
  EXPECT_EQ(pickEngineCpu("off", 0, 2, cpus(16), 16), -1);
}

TEST(Affinity, AListGivesEachLocalRankItsCpu) {
  EXPECT_EQ(pickEngineCpu("5,3", 0, 2, cpus(8), 8), 5);
  EXPECT_EQ(pickEngineCpu("5,3", 1, 2, cpus(8), 8), 3);
  EXPECT_EQ(pickEngineCpu("7", 0, 1, {7}, 8), 7);  // a bound process may name its own CPU
}

TEST(Affinity, AListTooShortOrOutsideTheProcessIsRefusedClearly) {
  try {
    pickEngineCpu("0,1", 2, 3, cpus(4), 4);
    FAIL() << "local rank 2 has no entry";
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_INVALID_ARGUMENT);
    EXPECT_NE(e.message().find("local rank 2 of 3"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("HORA_THREAD_AFFINITY='0,1'"), std::string::npos) << e.message();
  }
  try {
    pickEngineCpu("0,9", 1, 2, cpus(4), 4);
    FAIL() << "CPU 9 is not allowed";
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_INVALID_ARGUMENT);
    EXPECT_NE(e.message().find("CPU 9"), std::string::npos) << e.message();
  }
}

TEST(Affinity, BindingAThreadRestrictsItToThatCpu) {
  cpu_set_t mine;
  ASSERT_EQ(sched_getaffinity(0, sizeof mine, &mine), 0);
  int cpu = -1;
  for (int c = CPU_SETSIZE - 1; c >= 0; --c) {
    if (CPU_ISSET(c, &mine)) cpu = c;  // the lowest allowed
  }
  ASSERT_GE(cpu, 0);
  std::thread t([cpu] {
    std::string why;
    ASSERT_TRUE(bindThisThread(cpu, &why)) << why;
    cpu_set_t now;
    ASSERT_EQ(pthread_getaffinity_np(pthread_self(), sizeof now, &now), 0);
    EXPECT_EQ(CPU_COUNT(&now), 1);
    EXPECT_TRUE(CPU_ISSET(cpu, &now));
  });
  t.join();
}

}  // namespace
}  // namespace hora

// SPDX-License-Identifier: Apache-2.0
// base/process: telling a live process from one that exited or is exiting (for naming lost peers).
#include "base/process.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

namespace hora {
namespace {

// A live, sleeping process (flags 0x00400000 = PF_FORKNOEXEC, not PF_EXITING).
const char *kSleeping = "1234 (bash) S 1 1234 1234 34816 1234 4194304 200 0 0 0 1 0 0 0 20 0 1 0";

TEST(ProcStat, LiveStatesAreNotGone) {
  EXPECT_FALSE(procStatSaysGone(kSleeping));
  EXPECT_FALSE(procStatSaysGone("7 (worker) R 1 7 7 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 3 0"));
  EXPECT_FALSE(procStatSaysGone("7 (worker) D 1 7 7 0 -1 64 1 0 0 0 0 0 0 0 20 0 3 0"));
}

TEST(ProcStat, ZombieDeadAndExitingAreGone) {
  EXPECT_TRUE(procStatSaysGone("7 (worker) Z 1 7 7 0 -1 4227084 1 0 0 0 0 0 0 0 20 0 1 0"));
  EXPECT_TRUE(procStatSaysGone("7 (worker) X 1 7 7 0 -1 0 1 0 0 0 0 0 0 0 20 0 1 0"));
  // Still running (R, or D while it tears down its memory) but inside do_exit: PF_EXITING (0x4).
  EXPECT_TRUE(procStatSaysGone("7 (worker) R 1 7 7 0 -1 4194308 1 0 0 0 0 0 0 0 20 0 3 0"));
  EXPECT_TRUE(procStatSaysGone("7 (worker) D 1 7 7 0 -1 4 1 0 0 0 0 0 0 0 20 0 3 0"));
}

TEST(ProcStat, CommandNamesWithSpacesAndParentheses) {
  // The command name is cut at the last ')': the fields after it decide.
  EXPECT_TRUE(procStatSaysGone("9 (a) Z (b) R 1 9 9 0 -1 4 1 0 0 0"));
  EXPECT_FALSE(procStatSaysGone("9 (x) Z y) S 1 9 9 0 -1 0 1 0 0 0"));
  EXPECT_TRUE(procStatSaysGone("9 (my prog (2)) Z 1 9 9 0 -1 0 1 0"));
}

TEST(ProcStat, UnparsableTextIsNotGone) {
  EXPECT_FALSE(procStatSaysGone(""));
  EXPECT_FALSE(procStatSaysGone("1234 bash S 1"));
  EXPECT_FALSE(procStatSaysGone("1234 (bash) S 1 2"));  // no flags field
  EXPECT_FALSE(procStatSaysGone("1234 (bash) S 1 2 3 4 5 nan"));
}

TEST(ProcessGone, LiveZombieAndReaped) {
  EXPECT_FALSE(processGone(getpid()));
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pause();
    _exit(0);
  }
  EXPECT_FALSE(processGone(child));
  ASSERT_EQ(kill(child, SIGKILL), 0);
  // Not reaped yet: gone all the same (a zombie, or on its way out).
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, static_cast<id_t>(child), &info, WEXITED | WNOWAIT), 0);
  EXPECT_TRUE(processGone(child));
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  EXPECT_TRUE(processGone(child));
}

}  // namespace
}  // namespace hora

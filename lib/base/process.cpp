// SPDX-License-Identifier: Apache-2.0
#include "base/process.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>

namespace hora {

namespace {
// include/linux/sched.h: set by do_exit() (exit_signals) before the task's files are closed.
constexpr unsigned long kPfExiting = 0x00000004;
}  // namespace

bool procStatSaysGone(const std::string &stat) {
  // "pid (comm) state ppid pgrp session tty_nr tpgid flags ...": the command name may hold
  // spaces and parentheses, so fields are counted from the last ')'.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream fields(stat.substr(close + 1));
  std::string state, skip;
  unsigned long flags = 0;
  if (!(fields >> state)) return false;
  if (state == "Z" || state == "X" || state == "x") return true;
  for (int i = 0; i < 5; ++i) {
    if (!(fields >> skip)) return false;
  }
  if (!(fields >> flags)) return false;
  return (flags & kPfExiting) != 0;
}

bool processGone(long pid) {
  if (kill(static_cast<pid_t>(pid), 0) != 0) return errno == ESRCH;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  const std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return procStatSaysGone(stat);
}

std::string hostName() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "";
  return name;
}

std::string hostNameOr(const char *fallback) {
  const std::string name = hostName();
  return name.empty() ? fallback : name;
}

std::string hostIdentity() {
  std::string id = hostName();
  if (FILE *f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    char boot[64] = {0};
    if (std::fgets(boot, sizeof boot, f) != nullptr) {
      std::string b = boot;
      while (!b.empty() && (b.back() == '\n' || b.back() == '\r')) b.pop_back();
      id += "|" + b;
    }
    std::fclose(f);
  }
  for (const char *link : {"/proc/self/ns/ipc", "/proc/self/ns/pid"}) {
    char ns[128] = {0};
    if (readlink(link, ns, sizeof ns - 1) > 0) id += std::string("|") + ns;
  }
  return id;
}

std::string hostOfIdentity(const std::string &identity) { return identity.substr(0, identity.find('|')); }

}  // namespace hora

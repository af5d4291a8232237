// SPDX-License-Identifier: Apache-2.0
// HORA_THREAD_AFFINITY: where the engine threads run.
#include "core/affinity.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "base/error.h"

namespace hora {

int pickEngineCpu(const std::string &knob, int localRank, int localSize,
                  const std::vector<int> &allowed, int online) {
  if (knob == "off" || localSize < 1 || allowed.empty()) return -1;
  if (knob == "auto") {
    const int n = static_cast<int>(allowed.size());
    // Bound by the launcher, too few CPUs, or a rank alone on its host (nothing to keep apart).
    if (n < online || n < localSize || localSize < 2) return -1;
    return allowed[static_cast<size_t>(static_cast<int64_t>(localRank) * n / localSize)];
  }
  // The knob parser has checked the list's syntax.
  std::vector<int> list;
  for (size_t at = 0; at <= knob.size();) {
    const size_t comma = std::min(knob.find(',', at), knob.size());
    list.push_back(std::stoi(knob.substr(at, comma - at)));
    at = comma + 1;
  }
  if (localRank >= static_cast<int>(list.size())) {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "HORA_THREAD_AFFINITY='", knob, "' names ", list.size(),
               " CPUs, but this is local rank ", localRank, " of ", localSize,
               ": give one CPU per local rank");
  }
  const int cpu = list[static_cast<size_t>(localRank)];
  if (std::find(allowed.begin(), allowed.end(), cpu) == allowed.end()) {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "HORA_THREAD_AFFINITY='", knob, "': local rank ",
               localRank, " gets CPU ", cpu, ", which this process may not run on");
  }
  return cpu;
}

int engineCpuForThisProcess(const std::string &knob, int localRank, int localSize) {
  if (knob == "off") return -1;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return -1;
  std::vector<int> allowed;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) allowed.push_back(c);
  }
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  return pickEngineCpu(knob, localRank, localSize, allowed, static_cast<int>(online));
}

bool bindThisThread(int cpu, std::string *why) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (const int err = pthread_setaffinity_np(pthread_self(), sizeof set, &set); err != 0) {
    *why = std::strerror(err);
    return false;
  }
  return true;
}

}  // namespace hora

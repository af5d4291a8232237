// SPDX-License-Identifier: Apache-2.0
// Which CPU a rank's engine threads run on (HORA_THREAD_AFFINITY).
#pragma once

#include <string>
#include <vector>

namespace hora {

// The CPU for the engine threads of local rank `localRank` of `localSize`, or -1 for none.
//   "off": -1.
//   "auto": only when the launcher left the process unbound (`allowed` is every one of the
//     `online` CPUs), with 2 or more local ranks and at least as many CPUs: local ranks spread
//     evenly over the CPUs, so no two ranks' engines share one. Engines that migrate onto one
//     CPU make every intra-host barrier a context switch; on the 2-core class a 4-byte
//     allreduce then takes 70-90 us instead of 10.
//   "3,7,...": the CPU of each local rank, in local-rank order.
// Throws Error(HORA_ERR_INVALID_ARGUMENT) for a list without an entry for this local rank or
// naming a CPU outside `allowed`.
int pickEngineCpu(const std::string &knob, int localRank, int localSize,
                  const std::vector<int> &allowed, int online);

// pickEngineCpu with this process's allowed and online CPUs.
int engineCpuForThisProcess(const std::string &knob, int localRank, int localSize);

// Binds the calling thread to `cpu` (>= 0); false with *why set if the OS refuses.
bool bindThisThread(int cpu, std::string *why);

}  // namespace hora

// SPDX-License-Identifier: Apache-2.0
// hora-info: the build configuration and every HORA_* knob with its default and current value.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "base/error.h"
#include "base/knobs.h"
#include "hora_config.h"
#if HORA_HAVE_NCCL
#include "backends/nccl/nccl_device.h"  // no CUDA headers: a facade
#endif

int main() {
  std::printf("hora %s (%s build, %s)\n", HORA_VERSION, HORA_BUILDTYPE, HORA_COMPILER);
  std::printf("  bootstraps:   mpi %s, env:// and slurm %s, single yes\n",
              HORA_HAVE_MPI ? "yes" : "no (built without MPI)",
              HORA_HAVE_GLOO ? "yes" : "no (built without Gloo)");
  std::printf("  cpu backends: mpi %s, gloo %s, self (world of one) yes\n",
              HORA_HAVE_MPI ? "yes" : "no", HORA_HAVE_GLOO ? "yes" : "no");
#if HORA_HAVE_NCCL
  const int gpus = hora::nccl_device::deviceCount();
  std::printf("  gpu backends: nccl yes (untested on a GPU so far); %d CUDA device%s visible%s%s\n\n",
              gpus, gpus == 1 ? "" : "s", gpus == 0 ? ": " : "",
              gpus == 0 ? hora::nccl_device::whyNoDevice().c_str() : "");
#else
  std::printf("  gpu backends: nccl no (built without CUDA/NCCL/nvcc)\n\n");
#endif

  hora::Knobs current;
  std::string error;
  try {
    current = hora::Knobs::fromEnvironment();
  } catch (const hora::Error &e) {
    error = e.message();
  }
  std::printf("%-24s %-10s %-12s %s\n", "knob", "default", "current", "meaning");
  for (const hora::KnobSpec &k : hora::knobTable()) {
    const char *set = std::getenv(k.name);
    std::string value = k.show(current);
    if (set != nullptr) value += " (set)";
    std::printf("%-24s %-10s %-12s %s\n", k.name, k.defaultValue[0] ? k.defaultValue : "unset",
                value.empty() ? "unset" : value.c_str(), k.doc);
  }
  if (!error.empty()) {
    std::printf("\nerror: %s\n", error.c_str());
    return 1;
  }
  return 0;
}

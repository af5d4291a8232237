// SPDX-License-Identifier: Apache-2.0
// Backend registry: an ordered list of candidates, each saying whether it can serve this world.
#include "backends/registry.h"

#include <functional>
#include <string>
#include <vector>

#include "base/error.h"
#include "hora_config.h"
#if HORA_HAVE_MPI
#include "backends/mpi/mpi_backend.h"
#include "bootstrap/mpi/mpi_bootstrap.h"
#endif

namespace hora {
namespace {

struct Candidate {
  const char *name;
  // Returns the backend, or nullptr with *why set.
  std::function<std::unique_ptr<Backend>(Bootstrap &, Group &, std::string *why)> make;
};

std::vector<Candidate> candidates() {
  std::vector<Candidate> list;
#if HORA_HAVE_MPI
  list.push_back({"mpi", [](Bootstrap &, Group &g, std::string *why) -> std::unique_ptr<Backend> {
                    auto *mpi = dynamic_cast<MpiGroup *>(&g);
                    if (mpi == nullptr) {
                      *why = "the world was not formed by MPI";
                      return nullptr;
                    }
                    return createMpiBackend(mpi->dataComm());
                  }});
#endif
  list.push_back({"gloo", [](Bootstrap &, Group &, std::string *why) -> std::unique_ptr<Backend> {
                    *why = "not built yet (issue 4)";
                    return nullptr;
                  }});
  list.push_back({"self", [](Bootstrap &, Group &g, std::string *why) -> std::unique_ptr<Backend> {
                    if (g.size() != 1) {
                      *why = "only serves a world of one";
                      return nullptr;
                    }
                    return createSelfBackend();
                  }});
  return list;
}

}  // namespace

std::unique_ptr<Backend> createCpuBackend(const Knobs &knobs, Bootstrap &bootstrap, Group &group) {
  std::string tried;
  for (const Candidate &c : candidates()) {
    if (knobs.cpuBackend != "auto" && knobs.cpuBackend != c.name &&
        !(std::string(c.name) == "self" && group.size() == 1)) {
      continue;
    }
    std::string why;
    if (std::unique_ptr<Backend> backend = c.make(bootstrap, group, &why)) return backend;
    tried += detail::concat(tried.empty() ? "" : "; ", c.name, ": ", why);
  }
  HORA_THROW(HORA_ERR_UNSUPPORTED, "no CPU backend can serve a group of ", group.size(),
             " ranks in a world formed by ", bootstrap.launcher(),
             " (HORA_CPU_BACKEND=", knobs.cpuBackend, "): ", tried);
}

}  // namespace hora

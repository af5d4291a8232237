// SPDX-License-Identifier: Apache-2.0
// Backend registry: an ordered list of candidates, each saying whether it can serve this world.
#include "backends/registry.h"

#include <algorithm>

#include <functional>
#include <string>
#include <vector>

#include "backends/hier/hier_backend.h"
#include "backends/shm/shm_backend.h"
#include "base/error.h"
#include "base/logging.h"
#include "core/forming.h"
#include "hora_config.h"
#if HORA_HAVE_GLOO
#include "bootstrap/env/gloo_group.h"
#endif
#include "backends/nccl/nccl_plan.h"
#if HORA_HAVE_NCCL
#include "backends/nccl/nccl_device.h"
#include "backends/nccl/nccl_executor.h"
#endif
#if HORA_HAVE_MPI
#include "bootstrap/mpi/mpi_bootstrap.h"
#endif

namespace hora {

// Each plane's factory, defined in its folder (lib/backends/<plane>/) and declared here, beside
// its one caller, the plane's row below: a plane has no header of its own. A factory whose
// parameters differ from its declaration fails to link.
#if HORA_HAVE_UCX
// Collective over `group`. Throws Error(HORA_ERR_BACKEND) when UCX cannot start or connect. From
// `knobs`: HORA_TIMEOUT_S, the HORA_UCX_* tuning, and HORA_HIERARCHICAL (unless it is off, the
// link is topology-aware: small allreduces gather to one rank per host first, large ones with
// the same number of ranks on every host run a ring inside each host around the ring across).
std::unique_ptr<Backend> createUcxBackend(Group &group, const Knobs &knobs);
// UCX's version and the transports this machine offers it.
std::string ucxDescription();
#endif
#if HORA_HAVE_MPI
// Over `comm` (the bootstrap's data communicator); waits for peers up to HORA_TIMEOUT_S.
std::unique_ptr<Backend> createMpiBackend(MPI_Comm comm, const Knobs &knobs);
#endif
#if HORA_HAVE_GLOO
// On a GlooGroup, shares its mesh. On any other group (MPI), builds a mesh of its own: set rank 0
// serves a TCP store whose address and a fresh token travel over the group's control plane.
// Waits for peers up to HORA_TIMEOUT_S.
std::unique_ptr<Backend> createGlooBackend(Group &group, const Knobs &knobs);
#endif

namespace {

// The one list of CPU planes: a plane's name is spelt here and nowhere else (HORA_CPU_BACKEND's
// parser takes any plain name; hora-info and horarun read cpuPlanes()).
struct Candidate {
  const char *name;
  bool built;
  bool byName;  // HORA_CPU_BACKEND may name it
  const char *note;
  bool link;  // PlaneInfo::link
  // Returns the backend, or nullptr with *why set.
  // `named`: HORA_CPU_BACKEND asked for this plane (else `auto` is trying it).
  std::function<std::unique_ptr<Backend>(const Knobs &, bool named, Bootstrap &, Group &,
                                         std::string *why)>
      make;
  std::string (*describe)() = nullptr;  // PlaneInfo::describe
};

// A plane this build lacks: tried (and refused, saying why) like any other. Unused in a build
// that has every plane.
[[maybe_unused]] Candidate notBuilt(const char *name, const char *why) {
  return {name, false, true, "", false,
          [why](const Knobs &, bool, Bootstrap &, Group &, std::string *out) -> std::unique_ptr<Backend> {
            *out = why;
            return nullptr;
          }};
}

const std::vector<Candidate> &candidates() {
  static const std::vector<Candidate> list = {
#if HORA_HAVE_UCX
      // By default for worlds that span hosts, whoever formed them (under mpirun too: across
      // hosts it was faster than Open MPI's own TCP transport, docs/ucx.md); anywhere when asked.
      {"ucx", true, true, "", /*link=*/true,
       [](const Knobs &knobs, bool named, Bootstrap &b, Group &g, std::string *why) -> std::unique_ptr<Backend> {
         if (!named) {
           if (b.topology().localSize == b.topology().size) {
             *why = "every rank is on one host";
             return nullptr;
           }
         }
         try {
           return createUcxBackend(g, knobs);
         } catch (const Error &e) {
           // Every rank learns of a failure to start together (UcxComm agrees on it before
           // connecting), so every rank falls back alike.
           if (named || e.status() != HORA_ERR_BACKEND) throw;
           *why = e.what();
           HORA_LOG(kWarning) << "UCX plane unavailable, using the next: " << e.what();
           return nullptr;
         }
       },
       ucxDescription},
#else
      notBuilt("ucx", "this build has no UCX (meson option ucx; Debian package libucx-dev)"),
#endif
#if HORA_HAVE_MPI
      {"mpi", true, true, "", /*link=*/true,  // for the calls it does not hand to MPI's own
       [](const Knobs &knobs, bool, Bootstrap &, Group &g, std::string *why) -> std::unique_ptr<Backend> {
         auto *mpi = dynamic_cast<MpiGroup *>(&g);
         if (mpi == nullptr) {
           *why = "the world was not formed by MPI";
           return nullptr;
         }
         return createMpiBackend(mpi->dataComm(), knobs);
       }},
#else
      notBuilt("mpi", "this build has no MPI (meson option mpi; Debian package libopenmpi-dev)"),
#endif
#if HORA_HAVE_GLOO
      {"gloo", true, true, "", /*link=*/true,
       [](const Knobs &knobs, bool named, Bootstrap &, Group &g, std::string *why) -> std::unique_ptr<Backend> {
         if (dynamic_cast<GlooGroup *>(&g) == nullptr && !named) {
           *why = "the world was formed by MPI (HORA_CPU_BACKEND=gloo selects Gloo anyway)";
           return nullptr;
         }
         return createGlooBackend(g, knobs);
       }},
#else
      notBuilt("gloo", "this build has no Gloo (meson option gloo; Debian package libgloo-dev)"),
#endif
      {"self", true, false, "world of one", /*link=*/false,
       [](const Knobs &, bool, Bootstrap &, Group &g, std::string *why) -> std::unique_ptr<Backend> {
         if (g.size() != 1) {
           *why = "only serves a world of one";
           return nullptr;
         }
         return createSelfBackend();
       }},
  };
  return list;
}

// Refuses a HORA_CPU_BACKEND that names no plane of the list (its parser, in the base layer, takes
// any plain name), naming the ones there are.
void checkPlaneName(const std::string &name) {
  if (name == "auto") return;
  std::string built, missing;
  for (const Candidate &c : candidates()) {
    if (!c.byName) continue;
    if (name == c.name) return;
    std::string &to = c.built ? built : missing;
    to += detail::concat(to.empty() ? "" : ", ", c.name);
  }
  HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "HORA_CPU_BACKEND=", name,
             ": not a CPU plane of this build; it has: ", built.empty() ? "none" : built,
             missing.empty() ? "" : detail::concat(" (known but not built: ", missing, ")"));
}

// A plane for `group`: the first candidate that can serve it (`plane`, a name or "auto": the first
// in order), with the shared segment's allreduce in front where every rank is on one host.
std::unique_ptr<Backend> createPlane(const Knobs &knobs, const std::string &plane, Bootstrap &bootstrap,
                                     Group &group) {
  std::string tried;
  for (const Candidate &c : candidates()) {
    const bool named = plane == c.name;
    if (plane != "auto" && !named && !(std::string(c.name) == "self" && group.size() == 1)) {
      continue;
    }
    std::string why;
    std::unique_ptr<Backend> backend;
    formingPhase(group, detail::concat("starting the ", c.name, " data plane"),
                 [&] { backend = c.make(knobs, named, bootstrap, group, &why); });
    if (backend) {
      if (group.size() == 1) return backend;
      backend = wrapWithShm(std::move(backend), group, knobs, &why);
      if (backend->caps().scope != BackendCaps::Scope::kOneHost) {
        HORA_LOG(kInfo) << "intra-host shared-memory allreduce off: " << why;
      }
      return backend;
    }
    tried += detail::concat(tried.empty() ? "" : "; ", c.name, ": ", why);
  }
  HORA_THROW(HORA_ERR_UNSUPPORTED, "no CPU backend can serve a group of ", group.size(),
             " ranks in a world formed by ", bootstrap.launcher(),
             " (HORA_CPU_BACKEND=", plane, "): ", tried);
}

}  // namespace

std::vector<PlaneInfo> cpuPlanes() {
  std::vector<PlaneInfo> planes;
  for (const Candidate &c : candidates()) {
    planes.push_back({c.name, c.built, c.byName, c.note, c.link, c.describe});
  }
  return planes;
}

std::unique_ptr<Backend> createCpuBackend(const Knobs &knobs, Bootstrap &bootstrap, Group &group) {
  checkPlaneName(knobs.cpuBackend);
  std::unique_ptr<Backend> backend = createPlane(knobs, knobs.cpuBackend, bootstrap, group);
  if (group.size() == 1 || backend->caps().scope == BackendCaps::Scope::kOneHost) return backend;
  // Every rank got the same answer above (wrapWithShm agrees on it), so all try this too. The
  // hierarchy's own planes: inside a host hora's own choice whatever HORA_CPU_BACKEND says (that
  // knob is about the network); across hosts the set's choice. Each is a plane alone, with no
  // hierarchy of its own; the knobs are the set's, unedited (a link's topology rules find one
  // host, or one rank a host, and do not apply).
  const MakeHierPlane makePlane = [&](HierPlane which, Group &g) {
    return createPlane(knobs, which == HierPlane::kInsideHost ? "auto" : knobs.cpuBackend,
                       bootstrap, g);
  };
  std::string flat;
  formingPhase(group, "forming the hierarchy's groups (one host; one rank per host)", [&] {
    backend = wrapHierarchical(std::move(backend), bootstrap, group, knobs, makePlane, &flat);
  });
  if (!flat.empty()) {
    HORA_LOG(kInfo) << "hierarchical allreduce off: " << flat;
  }
  return backend;
}

std::unique_ptr<DeviceExecutor> createDeviceExecutor(ControlPlane &control, int device,
                                                     DeviceHooks hooks, const Knobs &knobs) {
#if HORA_HAVE_NCCL
  NcclOptions options;
  options.timeoutS = knobs.timeoutS;
  options.initTimeoutS = std::min(knobs.ncclInitTimeoutS, knobs.timeoutS);
  options.fusionBytes = knobs.fusionThreshold;
  options.directBytes = knobs.cudaDirectBytes;
  return createNcclExecutor(gpu::cudaDeviceApi(), control, device, options, std::move(hooks));
#else
  (void)control, (void)device, (void)hooks, (void)knobs;
  HORA_THROW(HORA_ERR_UNSUPPORTED, "a CUDA tensor, but this build has no NCCL backend");
#endif
}

std::shared_ptr<void> keepCudaContext() {
#if HORA_HAVE_NCCL
  return gpu::cudaDeviceApi().keepContext();
#else
  return nullptr;
#endif
}

int defaultCudaDevice(int localRank) {
#if HORA_HAVE_NCCL
  return defaultCudaDevice(gpu::cudaDeviceApi(), localRank);
#else
  (void)localRank;
  HORA_THROW(HORA_ERR_UNSUPPORTED, "a CUDA tensor, but this build has no NCCL backend");
#endif
}

bool haveDevicePlane() { return HORA_HAVE_NCCL != 0; }

std::string whyNoCudaDevice(int device) {
#if HORA_HAVE_NCCL
  return whyNoCudaDevice(gpu::cudaDeviceApi(), device);
#else
  (void)device;
  return "this build has no NCCL backend (configure with -Dnccl=enabled where CUDA and NCCL are "
         "installed); pass CPU tensors";
#endif
}

std::string whyCudaCannotReduce(DType dtype) {
  const char *why = nccl_plan::whyNotReduced(dtype);
  return why != nullptr ? why : "";
}

std::shared_ptr<void> recordCallerWork(int device, void *stream) {
#if HORA_HAVE_NCCL
  return nccl_device::recordEvent(device, stream);
#else
  (void)device, (void)stream;
  HORA_THROW(HORA_ERR_UNSUPPORTED, "a CUDA tensor, but this build has no NCCL backend");
#endif
}

}  // namespace hora

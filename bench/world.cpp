// SPDX-License-Identifier: Apache-2.0
// The benchmarks' own synchronisation and the planes they compare (world.h says why it is MPI
// under an MPI launcher and hora everywhere else).

#include "world.h"

#include "bench_util.h"

#include <mpi.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#ifndef HORA_BENCH_GLOO
#define HORA_BENCH_GLOO 0
#endif

namespace hora::bench {
namespace {

bool gMpi = false;
int gRank = 0, gSize = 1;
std::string gLaunchedBackend, gLaunchedTimeline;
bool gHadTimeline = false;

const char *lookup(const char *name) {
  const char *v = std::getenv(name);
  return v != nullptr && v[0] != '\0' ? v : nullptr;
}

// hora's own test (lib/bootstrap/bootstrap.cpp): the variables Open MPI, MPICH's Hydra and PMIx
// launchers set for their ranks.
bool launchedByMpi() {
  return lookup("OMPI_COMM_WORLD_SIZE") || lookup("PMI_SIZE") || lookup("PMIX_RANK");
}

void setOrUnset(const char *name, bool set, const std::string &value) {
  if (set) setenv(name, value.c_str(), 1);
  else unsetenv(name);
}

// The harness world: hora as hora chooses (HORA_CPU_BACKEND=auto), without a timeline (the
// planes trace, not the harness). Restores both variables afterwards.
void ensureHarness() {
  if (gMpi || hora_is_initialized()) return;
  setenv("HORA_CPU_BACKEND", "auto", 1);
  unsetenv("HORA_TIMELINE");
  const hora_status_t st = hora_init();
  setOrUnset("HORA_CPU_BACKEND", !gLaunchedBackend.empty(), gLaunchedBackend);
  setOrUnset("HORA_TIMELINE", gHadTimeline, gLaunchedTimeline);
  if (st != HORA_SUCCESS) failHora("hora_init (the benchmark's own world, HORA_CPU_BACKEND=auto)", st);
}

// Waits for a request that submitting returned (status `st`).
void waitFor(hora_status_t st, hora_request_t r, const char *what) {
  checkHora(st, what);
  const hora_status_t done = hora_wait(r);
  if (done != HORA_SUCCESS) {
    hora_request_free(r);
    failHora(what, done);
  }
}

DLTensor tensorOf(void *data, DLDataType type, int64_t *shape) {
  DLTensor t{};
  t.data = data;
  t.device = {kDLCPU, 0};
  t.ndim = 1;
  t.dtype = type;
  t.shape = shape;
  return t;
}

// One allreduce of the harness through hora, named by what and how many (names are hora's
// matching keys; the harness calls them in the same order on every rank).
void horaAllreduce(void *data, size_t n, DLDataType type, hora_reduce_op_t op, const char *what) {
  ensureHarness();
  int64_t shape = static_cast<int64_t>(n);
  DLTensor t = tensorOf(data, type, &shape);
  const std::string name = std::string("bench.harness.") + what + "." + std::to_string(n);
  hora_request_t r = nullptr;
  const hora_status_t st = hora_allreduce_async(name.c_str(), &t, &t, op, 1.0, 1.0, 0, &r);
  waitFor(st, r, "the benchmark's own allreduce through hora");
  hora_request_free(r);
}

}  // namespace

int runBenchmark(int argc, char **argv, const char *program, int (*run)(int argc, char **argv)) {
  setProgramName(program);
  const char *backend = std::getenv("HORA_CPU_BACKEND");
  gLaunchedBackend = backend ? backend : "";
  const char *timeline = std::getenv("HORA_TIMELINE");
  gHadTimeline = timeline != nullptr;
  gLaunchedTimeline = timeline ? timeline : "";
  gMpi = launchedByMpi();
  if (gMpi) {
    // Full thread support: hora's engine thread then shares this MPI and leaves finalizing it
    // to us, which also lets hora_init run again after hora_shutdown.
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &gRank);
    MPI_Comm_size(MPI_COMM_WORLD, &gSize);
    if (provided < MPI_THREAD_MULTIPLE && gRank == 0)
      std::fprintf(stderr, "%s: warning: MPI gives thread level %d, not MULTIPLE\n", program,
                   provided);
  } else {
    ensureHarness();
    gRank = hora_rank();
    gSize = hora_size();
  }
  const int status = run(argc, argv);
  stopHora();
  if (gMpi) MPI_Finalize();
  return status;
}

bool underMpi() { return gMpi; }

const char *launcherName() {
  if (gMpi) return "an MPI launcher";
  if (lookup("MASTER_ADDR") && lookup("WORLD_SIZE")) return "env:// variables";
  if (lookup("SLURM_PROCID")) return "Slurm";
  return "no launcher";
}

int worldRank() { return gRank; }
int worldSize() { return gSize; }

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void barrier() {
  if (gMpi) {
    MPI_Barrier(MPI_COMM_WORLD);
    return;
  }
  ensureHarness();
  checkHora(hora_barrier(0), "hora_barrier (the benchmark's own barrier)");
}

void maxOverRanks(double *values, size_t n) {
  if (gMpi) {
    MPI_Allreduce(MPI_IN_PLACE, values, static_cast<int>(n), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return;
  }
  horaAllreduce(values, n, DLDataType{kDLFloat, 64, 1}, HORA_OP_MAX, "max");
}

void sumOverRanks(int64_t *values, size_t n) {
  if (gMpi) {
    MPI_Allreduce(MPI_IN_PLACE, values, static_cast<int>(n), MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    return;
  }
  horaAllreduce(values, n, DLDataType{kDLInt, 64, 1}, HORA_OP_SUM, "sum");
}

void broadcastBytes(void *data, size_t bytes) {
  if (gMpi) {
    for (size_t at = 0; at < bytes; at += 1 << 30) {
      const int chunk = static_cast<int>(std::min<size_t>(1 << 30, bytes - at));
      MPI_Bcast(static_cast<char *>(data) + at, chunk, MPI_BYTE, 0, MPI_COMM_WORLD);
    }
    return;
  }
  if (bytes == 0) return;
  ensureHarness();
  int64_t shape = static_cast<int64_t>(bytes);
  DLTensor t = tensorOf(data, DLDataType{kDLUInt, 8, 1}, &shape);
  const std::string name = "bench.harness.broadcast." + std::to_string(bytes);
  hora_request_t r = nullptr;
  const hora_status_t st = hora_broadcast_async(name.c_str(), &t, 0, 0, &r);
  waitFor(st, r, "the benchmark's own broadcast through hora");
  hora_request_free(r);
}

void broadcastString(std::string *s) {
  int64_t size = static_cast<int64_t>(s->size());
  broadcastBytes(&size, sizeof size);
  s->resize(static_cast<size_t>(size));
  broadcastBytes(s->data(), s->size());
}

std::vector<uint8_t> allgatherBytes(const void *data, size_t bytes) {
  std::vector<uint8_t> all(bytes * static_cast<size_t>(gSize));
  if (gMpi) {
    MPI_Allgather(data, static_cast<int>(bytes), MPI_BYTE, all.data(), static_cast<int>(bytes),
                  MPI_BYTE, MPI_COMM_WORLD);
    return all;
  }
  ensureHarness();
  int64_t shape = static_cast<int64_t>(bytes);
  DLTensor t = tensorOf(const_cast<void *>(data), DLDataType{kDLUInt, 8, 1}, &shape);
  const std::string name = "bench.harness.allgather." + std::to_string(bytes);
  hora_request_t r = nullptr;
  const hora_status_t st = hora_allgather_async(name.c_str(), &t, 0, &r);
  waitFor(st, r, "the benchmark's own allgather through hora");
  const DLTensor *out = hora_request_output(r);
  if (out == nullptr || out->shape[0] != static_cast<int64_t>(all.size())) {
    hora_request_free(r);
    failHere("the benchmark's own allgather through hora returned the wrong shape");
  }
  std::memcpy(all.data(), out->data, all.size());
  hora_request_free(r);
  return all;
}

void abortJob(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (gMpi) MPI_Abort(MPI_COMM_WORLD, code);
  _exit(code);
}

// ---- planes ------------------------------------------------------------------------------------

// "ucx", or "ucx:hier" / "ucx:flat": the plane with HORA_HIERARCHICAL=on / off.
bool knownPlane(const std::string &name) {
  const std::string plane = name.substr(0, name.find(':'));
  const std::string mode = name.find(':') == std::string::npos ? "" : name.substr(name.find(':') + 1);
  return (plane == "mpi" || plane == "gloo" || plane == "ucx" || plane == "auto") &&
         (mode.empty() || mode == "hier" || mode == "flat" || mode == "horovod");
}

const std::string &launchedBackend() { return gLaunchedBackend; }
const std::string &launchedTimeline() { return gLaunchedTimeline; }

std::string withSuffix(const std::string &path, const std::string &suffix) {
  const size_t slash = path.rfind('/');
  const size_t dot = path.rfind('.');
  const bool hasExtension =
      dot != std::string::npos && (slash == std::string::npos || dot > slash + 1);
  return hasExtension ? path.substr(0, dot) + suffix + path.substr(dot) : path + suffix;
}

std::vector<std::string> defaultPlanes() {
  if (!gLaunchedBackend.empty() && gLaunchedBackend != "auto") return {gLaunchedBackend};
  std::vector<std::string> planes;
  if (gMpi) planes.push_back("mpi");
  if (HORA_BENCH_GLOO) planes.push_back("gloo");
  planes.push_back("ucx");
  return planes;
}

std::vector<std::string> parsePlanes(const std::string &text, std::string *error) {
  std::vector<std::string> planes;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    const std::string p = text.substr(start, comma - start);
    if (!knownPlane(p)) {
      *error = "unknown plane '" + p + "' (mpi, gloo, ucx or auto, each optionally with :hier, "
               ":flat or :horovod, comma-separated)";
      return {};
    }
    if (std::find(planes.begin(), planes.end(), p) != planes.end()) {
      *error = "plane '" + p + "' given twice";
      return {};
    }
    planes.push_back(p);
    start = comma + 1;
  }
  return planes;
}

bool startPlane(const std::string &plane, const std::string &timeline, std::string *whyNot) {
  stopHora();
  const size_t colon = plane.find(':');
  setenv("HORA_CPU_BACKEND", plane.substr(0, colon).c_str(), 1);
  // PLANE:hier, PLANE:flat: HORA_HIERARCHICAL=on / off; PLANE:horovod: on, with one rank per host
  // carrying everything across (Horovod's hierarchical allreduce, HORA_HIER_OWNERS=1).
  const char *hier = std::getenv("HORA_HIERARCHICAL"), *owners = std::getenv("HORA_HIER_OWNERS");
  const bool hadHier = hier != nullptr, hadOwners = owners != nullptr;
  const std::string launchedHier = hadHier ? hier : "", launchedOwners = hadOwners ? owners : "";
  const std::string mode = colon == std::string::npos ? "" : plane.substr(colon + 1);
  if (!mode.empty()) setenv("HORA_HIERARCHICAL", mode == "flat" ? "off" : "on", 1);
  if (mode == "horovod") setenv("HORA_HIER_OWNERS", "1", 1);
  if (!timeline.empty()) setenv("HORA_TIMELINE", timeline.c_str(), 1);
  const hora_status_t st = hora_init();
  setOrUnset("HORA_HIERARCHICAL", hadHier, launchedHier);
  setOrUnset("HORA_HIER_OWNERS", hadOwners, launchedOwners);
  std::string why;
  if (st != HORA_SUCCESS) {
    why = std::string(hora_status_string(st)) + ": " + hora_last_error();
  } else if (hora_size() != gSize || hora_rank() != gRank) {
    why = "hora formed a different world (rank " + std::to_string(hora_rank()) + " of " +
          std::to_string(hora_size()) + ", the launcher's rank " + std::to_string(gRank) + " of " +
          std::to_string(gSize) + ")";
  }
  setOrUnset("HORA_CPU_BACKEND", !gLaunchedBackend.empty(), gLaunchedBackend);
  setOrUnset("HORA_TIMELINE", gHadTimeline, gLaunchedTimeline);
  if (gMpi) {
    // Under MPI the ranks can agree: a plane that failed anywhere is skipped everywhere, with
    // the lowest failing rank's reason.
    int failedRank = why.empty() ? gSize : gRank;
    MPI_Allreduce(MPI_IN_PLACE, &failedRank, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (failedRank < gSize) {
      char text[1024] = {0};
      if (gRank == failedRank) std::snprintf(text, sizeof text, "%s", why.c_str());
      MPI_Bcast(text, sizeof text, MPI_CHAR, failedRank, MPI_COMM_WORLD);
      why = failedRank == gRank || !why.empty() ? why : "rank " + std::to_string(failedRank) + ": " + text;
    }
  }
  if (why.empty()) return true;
  stopHora();
  *whyNot = why;
  if (gRank == 0) {
    std::printf("# hora on %s: skipped: %s\n", plane.c_str(), why.c_str());
    std::fflush(stdout);
  }
  return false;
}

std::string rawMpiSkipped(bool *mpi) {
  if (!*mpi) return "--mpi 0";
  if (underMpi()) return "";
  *mpi = false;
  return std::string("launched by ") + launcherName() + ", not an MPI launcher";
}

void stopHora() {
  if (!hora_is_initialized()) return;
  checkHora(hora_shutdown(), "hora_shutdown");
}

}  // namespace hora::bench

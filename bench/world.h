// SPDX-License-Identifier: Apache-2.0
// The benchmarks' own synchronisation (barriers, the slowest rank's time, broadcasts of small
// buffers, who is who) and the hora planes they compare, under any launcher.
//
// Where an MPI launcher started the job (mpirun, srun --mpi, mpiexec: the variables hora's own
// bootstrap looks for), the harness talks MPI, as the raw MPI columns need it anyway. Anywhere
// else (horarun, torchrun-style variables, a cluster of namespaces, a lone process) it talks hora
// itself: a world that hora forms with HORA_CPU_BACKEND=auto (the "harness world"), its barrier,
// a float64 MAX allreduce, a broadcast and an allgather. That needs nothing hora does not already
// need (no second port, no shared file system), and whatever hora forms a world from, the
// harness works with. The harness world is down while a plane runs (each plane is its own
// hora_init); a call that needs it while no runtime is up starts it again.
#pragma once

#include <hora/hora.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hora::bench {

// main() of both benchmarks: MPI_Init_thread (MULTIPLE, as hora's engine thread shares it) where
// an MPI launcher started the job, else the harness world; then run(argc, argv); then hora down
// and MPI_Finalize. Returns run's status.
int runBenchmark(int argc, char **argv, const char *program, int (*run)(int argc, char **argv));

// True where an MPI launcher started the job: the harness and the raw MPI columns use MPI.
bool underMpi();
// "an MPI launcher" or "env:// variables" or "Slurm" or "a world of one": for the header.
const char *launcherName();
int worldRank();
int worldSize();

// Seconds on a monotonic clock (the same clock on every path).
double now();

// Collectives of the harness (never inside a timed loop, except barrier before one).
void barrier();
// Element-wise over ranks, in place.
void maxOverRanks(double *values, size_t n);
void sumOverRanks(int64_t *values, size_t n);
inline double maxOverRanks(double v) {
  maxOverRanks(&v, 1);
  return v;
}
inline int64_t sumOverRanks(int64_t v) {
  sumOverRanks(&v, 1);
  return v;
}
// Rank 0's bytes into every rank's (every rank passes the same size).
void broadcastBytes(void *data, size_t bytes);
// Rank 0's string, any length.
void broadcastString(std::string *s);
// Every rank's `bytes` bytes, rank order (every rank passes the same size).
std::vector<uint8_t> allgatherBytes(const void *data, size_t bytes);

// Aborts the job: MPI_Abort under MPI, else _exit (hora's peers then see this rank gone).
[[noreturn]] void abortJob(int code);

// ---- planes ------------------------------------------------------------------------------------

// hora's CPU data planes that a run can compare: HORA_CPU_BACKEND's values (mpi, gloo, ucx).
// Within one host hora may still move a plane's allreduce through shared memory (HORA_SHM).
bool knownPlane(const std::string &name);
// --planes' default: mpi under an MPI launcher, gloo where this build has it, ucx (reported as
// skipped until hora builds it). Where HORA_CPU_BACKEND was set at launch (and not auto), only
// that plane: the launch chose it.
std::vector<std::string> defaultPlanes();
// "mpi,gloo,ucx" -> the list; "" and the reason on a bad list.
std::vector<std::string> parsePlanes(const std::string &text, std::string *error);
// HORA_CPU_BACKEND and HORA_TIMELINE as launched ("" if unset).
const std::string &launchedBackend();
const std::string &launchedTimeline();
// PATH with SUFFIX before its extension: ("t.json", "-gloo") -> "t-gloo.json"; no extension:
// appended. Where a run starts hora more than once, each start traces into its own file.
std::string withSuffix(const std::string &path, const std::string &suffix);

// Stops whatever hora runs, sets HORA_CPU_BACKEND=plane (and HORA_TIMELINE=timeline where not
// empty, else the launched value) and starts hora again. On failure (on this rank: a plane that
// cannot start, e.g. one this build lacks) returns false with *whyNot set and leaves hora down.
// Every rank gets the same answer for a plane that the build or the world rules out; where the
// ranks disagree, the harness aborts (under MPI it can tell; elsewhere the next harness call
// starts the harness world, which fails or times out on the ranks that went on).
// Rank 0 prints "# hora on PLANE: skipped: WHY" for a plane that cannot start.
bool startPlane(const std::string &plane, const std::string &timeline, std::string *whyNot);
// Why the raw MPI columns or rows do not run ("--mpi 0", or no MPI launcher), clearing *mpi for
// the latter; "" where they run.
std::string rawMpiSkipped(bool *mpi);
// Stops hora if it runs (the harness world starts again when a harness call needs it).
void stopHora();

}  // namespace hora::bench

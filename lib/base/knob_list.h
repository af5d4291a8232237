// SPDX-License-Identifier: Apache-2.0
// Every HORA_* knob, declared once: a knob is one entry here, and nothing else is edited before
// code reads its field. No include guard: an X-macro list, expanded twice. knobs.h expands it
// inside `struct Knobs` (the fields and their defaults), knobs.cpp into its table `kTable` (the
// rows: name, default text, doc, parser, show). The order is the table's: hora-info, the README's
// generated knob section (tools/update_knob_docs.sh) and `horarun --help` list the knobs in it.
//
//   HORA_KNOB(NAME, TYPE, FIELD, DEFAULT, DEFAULT_TEXT, DOC, PARSE...)
//   HORA_KNOB_SHOWN(NAME, TYPE, FIELD, DEFAULT, DEFAULT_TEXT, DOC, SHOW, PARSE...)
//
// NAME      the variable, "HORA_..."
// TYPE      the field's type: int64_t, double, std::string or LogLevel
// FIELD     the field of Knobs the code reads
// DEFAULT   the field's value when the variable is unset (a C++ expression)
// DEFAULT_TEXT  the same as the variable would spell it, for the docs ("" = unset); the test
//           Knobs.TableDefaultsParseToTheStructDefaults parses it and compares it with DEFAULT
// DOC       one line, no '|': README.md's knob table is generated from it; `backticks` mark code
// PARSE     a bool expression of `text` (the variable's value), `knobs` (the Knobs it sets) and
//           `why` (std::string *): true once it has set knobs.FIELD; false with *why saying what
//           is accepted. It may hold commas and braces. The helpers (knobs.cpp): parseWhole,
//           parseDouble, parseChoice, parseBytes, check(ok, why, "expected ..."), assign(&field, v)
// SHOW      (HORA_KNOB_SHOWN only) a std::string expression of `knobs`: the current value as
//           hora-info prints it. HORA_KNOB shows the field by its type (showValue in knobs.cpp).
//
// Then tools/update_knob_docs.sh BUILD_DIR regenerates README.md's knob section.

HORA_KNOB("HORA_FUSION_THRESHOLD", int64_t, fusionThreshold, int64_t{64} << 20, "64M",
          "largest fused buffer, bytes (suffixes K, M, G)",
          check(parseBytes(text, &knobs.fusionThreshold), why,
                "expected a byte count such as 67108864, 64M or 64MiB"))

HORA_KNOB("HORA_CYCLE_TIME_MS", double, cycleTimeMs, 0.5, "0.5",
          "longest wait for more tensors to fuse once one is pending, ms",
          parseDouble(text, 0, 10000, &knobs.cycleTimeMs, why))

HORA_KNOB("HORA_CACHE_CAPACITY", int64_t, cacheCapacity, 1024, "1024",
          "response cache entries (0 disables the cache)",
          parseWhole(text, 0, 1 << 20, &knobs.cacheCapacity, why))

// Any plain name: the planes are the backend registry's (lib/backends/registry.cpp: cpuPlanes),
// which this layer cannot see; createCpuBackend refuses a name it does not have.
HORA_KNOB("HORA_CPU_BACKEND", std::string, cpuBackend, "auto", "auto",
          "CPU data plane: `auto` (ucx for worlds spanning hosts, else the launcher's: mpi under "
          "MPI, gloo otherwise) or a plane's name; `hora-info` lists this build's planes, and "
          "`hora_init` refuses a name that is not one of them",
          check(isPlainName(text), why,
                "expected auto or a plane's name (lowercase letters, digits, _)") &&
              assign(&knobs.cpuBackend, text))

// The UCX plane (lib/backends/ucx, docs/ucx.md).
HORA_KNOB("HORA_UCX_DIRECT_KB", int64_t, ucxDirectKiB, 16, "16",
          "UCX plane: an allreduce whose (ranks - 1) x bytes are at most this many KiB goes "
          "straight to every rank (docs/ucx.md)",
          parseWhole(text, 0, 1 << 20, &knobs.ucxDirectKiB, why))

HORA_KNOB("HORA_UCX_SMALL_KB", int64_t, ucxSmallKiB, 64, "64",
          "UCX plane: largest allreduce, KiB, that runs as recursive doubling (and, across hosts, "
          "through one rank per host); larger ones run as a ring",
          parseWhole(text, 0, 1 << 20, &knobs.ucxSmallKiB, why))

HORA_KNOB("HORA_UCX_CHUNK_KB", int64_t, ucxChunkKiB, 256, "256",
          "UCX plane: the ring's and the broadcast chain's pipeline chunk, KiB",
          parseWhole(text, 1, 1 << 20, &knobs.ucxChunkKiB, why))

// The planes that are links: "allreduce=ring,..." forces algorithms of the tables
// (lib/core/collectives/algorithms.h); "" = each table's size rules.
HORA_KNOB("HORA_ALGORITHM", std::string, algorithm, "", "",
          "planes that are links (`hora-info` names them; on MPI, the calls it does not hand to "
          "MPI's own collectives): force algorithms, `COLLECTIVE=NAME,...` (e.g. `allreduce=ring`); "
          "a forced one runs wherever it can, else the table's size rule picks. `hora-info` lists "
          "the tables (allreduce, reducescatter, broadcast, allgatherv, alltoallv)",
          check(isAlgorithmList(text), why,
                "expected COLLECTIVE=NAME[,COLLECTIVE=NAME...], e.g. allreduce=ring") &&
              assign(&knobs.algorithm, text))

HORA_KNOB("HORA_UCX_SPIN_US", double, ucxSpinUs, 50, "50",
          "UCX plane: how long a rank waiting in a collective polls, microseconds, before it "
          "sleeps until UCX wakes it (0: sleeps at once)",
          parseDouble(text, 0, 1e6, &knobs.ucxSpinUs, why))

HORA_KNOB("HORA_SHM", std::string, shm, "auto", "auto",
          "intra-host allreduce through shared memory when every rank of a set is on one host: "
          "`auto` stages it through a shared segment; `cma` reads large tensors straight from "
          "the peers' memory (`process_vm_readv`); `off` leaves allreduce to MPI or Gloo",
          parseChoice(text, {"auto", "cma", "off"}, &knobs.shm, why))

HORA_KNOB("HORA_SHM_STREAM", std::string, shmStream, "auto", "auto",
          "how the shared-memory allreduce writes its segment: `auto` uses non-temporal stores "
          "(through memory) while a cache-line probe finds that the ranks' cores share no cache "
          "(e.g. vCPUs on different CCDs or sockets), cached stores otherwise; `on`, `off`",
          parseChoice(text, {"auto", "on", "off"}, &knobs.shmStream, why))

HORA_KNOB("HORA_HIERARCHICAL", std::string, hierarchical, "auto", "auto",
          "allreduce of a set whose ranks span hosts, where a host holds several: `on` reduces "
          "inside each host through shared memory, then across hosts one share per rank (the "
          "fewest ranks any host holds carry the shares), then shares the result inside each "
          "host (allgather and broadcast likewise cross each host's link once); `auto` does so "
          "from the size where a cost model measured on the set as it forms says it pays, and "
          "leaves smaller ones to the set's plane; `off`: one collective of the plane over every "
          "rank",
          parseChoice(text, {"auto", "on", "off"}, &knobs.hierarchical, why))

// 0 = auto.
HORA_KNOB_SHOWN("HORA_HIER_OWNERS", int64_t, hierOwners, 0, "auto",
                "ranks per host that carry the shares of a hierarchical allreduce across hosts: "
                "`auto` is the fewest ranks any host of the set holds, a number narrows it to at "
                "most that many; `1` is Horovod's hierarchical allreduce (docs/hierarchical.md)",
                knobs.hierOwners == 0 ? std::string("auto") : std::to_string(knobs.hierOwners),
                text == "auto" ? assign(&knobs.hierOwners, 0)
                               : check(parseWhole(text, 1, 1 << 16, &knobs.hierOwners, why), why,
                                       "expected auto or an integer in [1, 65536]"))

HORA_KNOB("HORA_CALLER_CYCLES", std::string, callerCycles, "auto", "auto",
          "`auto`: a thread in `hora_wait` runs its set's cycles itself while the set's engine "
          "thread is idle (sets on one host, CPU tensors), sparing two thread hand-offs; `off`: "
          "the engine thread runs every cycle",
          parseChoice(text, {"auto", "off"}, &knobs.callerCycles, why))

HORA_KNOB("HORA_THREAD_AFFINITY", std::string, threadAffinity, "auto", "auto",
          "CPU of each rank's engine threads: `auto` spreads the local ranks over the CPUs when "
          "the launcher did not bind them (and there are at least 2 local ranks and as many "
          "CPUs), `off`, or one CPU per local rank such as `0,8`",
          check(text == "auto" || text == "off" || isCpuList(text), why,
                "expected auto, off, or CPU numbers joined by commas such as 0,1") &&
              assign(&knobs.threadAffinity, text))

HORA_KNOB("HORA_TIMELINE", std::string, timeline, "", "",
          "path of a Chrome-trace JSON timeline, one file per rank (`trace.json` becomes "
          "`trace.rank<R>.json`, or put `{rank}` in the path)",
          assign(&knobs.timeline, text))

// "" = off.
HORA_KNOB_SHOWN("HORA_FLIGHT_RECORDER", std::string, flightRecorder,
                "/tmp/hora-flight.{rank}.json", "/tmp/hora-flight.{rank}.json",
                "where each rank writes its last operations on a timeout, a lost peer, a backend "
                "error, SIGUSR1 or SIGTERM (`{rank}`: the rank; `{job}`: the job id, put before "
                "`{rank}` if absent, so jobs never share files; `off`: record nothing); "
                "`hora-flight-check` compares the files of a job",
                knobs.flightRecorder.empty() ? std::string("off") : knobs.flightRecorder,
                check(!text.empty(), why, "expected a path, or off") &&
                    assign(&knobs.flightRecorder, text == "off" ? "" : text))

HORA_KNOB("HORA_FLIGHT_RECORDER_OPS", int64_t, flightRecorderOps, 1024, "1024",
          "operations the flight recorder keeps per rank",
          parseWhole(text, 1, 1 << 24, &knobs.flightRecorderOps, why))

HORA_KNOB("HORA_FLIGHT_RECORDER_KEEP", int64_t, flightRecorderKeep, 8, "8",
          "flight recorder files of at most this many jobs stay in its directory: writing one "
          "removes those of older jobs (by their newest file), so failed jobs do not pile up (0: "
          "keep all)",
          parseWhole(text, 0, 1000000, &knobs.flightRecorderKeep, why))

HORA_KNOB("HORA_STALL_WARNING_S", double, stallWarningS, 60, "60",
          "report a name that some ranks have submitted and others have not after this long, and "
          "again at this interval, seconds (0: never)",
          parseDouble(text, 0, 1e9, &knobs.stallWarningS, why))

HORA_KNOB("HORA_STALL_SHUTDOWN_S", double, stallShutdownS, 0, "0",
          "fail such a name with `HORA_ERR_TIMEOUT` on the ranks that submitted it after this "
          "long, seconds (0: off)",
          parseDouble(text, 0, 1e9, &knobs.stallShutdownS, why))

HORA_KNOB("HORA_TIMEOUT_S", double, timeoutS, 300, "300",
          "longest wait for peers, seconds: in negotiation, the env:// rendezvous and the data "
          "planes; a collective that waits longer, or a lost peer, fails with `HORA_ERR_TIMEOUT` "
          "or `HORA_ERR_PEER_LOST`",
          parseDouble(text, 0.001, 1e9, &knobs.timeoutS, why))

// Communicator creation; the engine takes at most timeoutS.
HORA_KNOB("HORA_NCCL_INIT_TIMEOUT_S", double, ncclInitTimeoutS, 120, "120",
          "longest wait for an NCCL communicator to form, seconds (at most `HORA_TIMEOUT_S`): a "
          "rank that never joins fails the others' first CUDA op of the set with "
          "`HORA_ERR_TIMEOUT`",
          parseDouble(text, 0.001, 1e9, &knobs.ncclInitTimeoutS, why))

HORA_KNOB("HORA_CUDA_DIRECT_BYTES", int64_t, cudaDirectBytes, int64_t{1} << 20, "1M",
          "fused CUDA allreduce: tensors of at least this many bytes go to NCCL where they lie, "
          "in the same NCCL group as the smaller ones, which are packed (zero-copy fusion); 0 "
          "packs every tensor (suffixes K, M, G)",
          check(parseBytes(text, &knobs.cudaDirectBytes), why,
                "expected a byte count such as 1048576, 1M or 0"))

HORA_KNOB("HORA_LOG_LEVEL", LogLevel, logLevel, LogLevel::kWarning, "warning",
          "`trace`, `debug`, `info`, `warning` or `error` (any case)",
          check(parseLogLevel(text, &knobs.logLevel), why,
                "expected one of trace, debug, info, warning, error"))

HORA_KNOB("HORA_BOOTSTRAP", std::string, bootstrap, "auto", "auto",
          "how the world forms: `auto`, `mpi`, `env` (torchrun's MASTER_ADDR, RANK, WORLD_SIZE "
          "variables) or `single` (a world of one)",
          parseChoice(text, {"auto", "mpi", "env", "single"}, &knobs.bootstrap, why))

// Never printed: hora-info's output ends up in logs and bug reports.
HORA_KNOB_SHOWN("HORA_JOB_TOKEN", std::string, jobToken, "", "",
                "shared secret of an env:// job, the same on every rank: each connection to rank "
                "0's store and each Gloo pair must prove it knows it (HMAC-SHA256 "
                "challenge-response both ways) or is closed; unset, the store trusts whoever "
                "reaches its port. `horarun` sets a fresh one for every single-machine job. See "
                "docs/security.md",
                knobs.jobToken.empty() ? std::string() : std::string("(set)"),
                assign(&knobs.jobToken, text))

// "" = the address MASTER_ADDR names, when it is one of this host's.
HORA_KNOB("HORA_STORE_BIND", std::string, storeBind, "", "",
          "address rank 0's env:// store listens on: unset, the address `MASTER_ADDR` names when "
          "it is one of this host's (every interface when it is not, e.g. behind NAT); "
          "`0.0.0.0`, `::` or `*` (every interface) or one local address",
          check(text.find_first_of(" \t\n") == std::string::npos, why,
                "expected an address such as 0.0.0.0, ::, 10.0.0.1 or *") &&
              assign(&knobs.storeBind, text))

#undef HORA_KNOB
#undef HORA_KNOB_SHOWN

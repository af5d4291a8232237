// SPDX-License-Identifier: Apache-2.0
// The knob table. Adding a knob means adding one row here (and its Knobs field), then
// tools/update_knob_docs.sh; nothing else reads the environment for HORA_* settings.
#include "base/knobs.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "base/error.h"

namespace hora {
namespace {

bool parseDouble(const std::string &text, double lo, double hi, double *out, std::string *why) {
  char *end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end == text.c_str() || *end != '\0' || !std::isfinite(v) || v < lo ||
      v > hi) {
    std::ostringstream s;
    s << "expected a number in [" << lo << ", " << hi << "]";
    *why = s.str();
    return false;
  }
  *out = v;
  return true;
}

bool parseChoice(const std::string &text, std::initializer_list<const char *> choices,
                 std::string *out, std::string *why) {
  for (const char *c : choices) {
    if (text == c) {
      *out = text;
      return true;
    }
  }
  std::string list;
  for (const char *c : choices) list += (list.empty() ? "" : ", ") + std::string(c);
  *why = "expected one of " + list;
  return false;
}

// "0", "3,7,11": CPU numbers of at most 5 digits joined by single commas.
bool isCpuList(const std::string &text) {
  size_t digits = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
      if (++digits > 5) return false;
    } else if ((i == text.size() || text[i] == ',') && digits > 0) {
      digits = 0;
    } else {
      return false;
    }
  }
  return true;
}

std::string showDouble(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

const std::vector<KnobSpec> kTable = {
    {"HORA_FUSION_THRESHOLD", "64M", "largest fused buffer, bytes (suffixes K, M, G)",
     [](const std::string &t, Knobs &k, std::string *why) {
       int64_t b;
       if (!parseBytes(t, &b)) {
         *why = "expected a byte count such as 67108864, 64M or 64MiB";
         return false;
       }
       k.fusionThreshold = b;
       return true;
     },
     [](const Knobs &k) { return std::to_string(k.fusionThreshold); }},
    {"HORA_CYCLE_TIME_MS", "0.5", "longest wait for more tensors to fuse once one is pending, ms",
     [](const std::string &t, Knobs &k, std::string *why) {
       return parseDouble(t, 0, 10000, &k.cycleTimeMs, why);
     },
     [](const Knobs &k) { return showDouble(k.cycleTimeMs); }},
    {"HORA_CACHE_CAPACITY", "1024", "response cache entries (0 disables the cache)",
     [](const std::string &t, Knobs &k, std::string *why) {
       double v;
       if (!parseDouble(t, 0, 1 << 20, &v, why) || v != std::floor(v)) {
         *why = "expected an integer in [0, 1048576]";
         return false;
       }
       k.cacheCapacity = static_cast<int64_t>(v);
       return true;
     },
     [](const Knobs &k) { return std::to_string(k.cacheCapacity); }},
    {"HORA_CPU_BACKEND", "auto",
     "CPU data plane: `auto` (mpi under MPI, gloo otherwise), `mpi` or `gloo`",
     [](const std::string &t, Knobs &k, std::string *why) {
       return parseChoice(t, {"auto", "mpi", "gloo"}, &k.cpuBackend, why);
     },
     [](const Knobs &k) { return k.cpuBackend; }},
    {"HORA_SHM", "auto",
     "intra-host allreduce through shared memory when every rank of a set is on one host: "
     "`auto` stages it through a shared segment; `cma` reads large tensors straight from the "
     "peers' memory (`process_vm_readv`); `off` leaves allreduce to MPI or Gloo",
     [](const std::string &t, Knobs &k, std::string *why) {
       return parseChoice(t, {"auto", "cma", "off"}, &k.shm, why);
     },
     [](const Knobs &k) { return k.shm; }},
    {"HORA_SHM_STREAM", "auto",
     "how the shared-memory allreduce writes its segment: `auto` uses non-temporal stores "
     "(through memory) while a cache-line probe finds that the ranks' cores share no cache "
     "(e.g. vCPUs on different CCDs or sockets), cached stores otherwise; `on`, `off`",
     [](const std::string &t, Knobs &k, std::string *why) {
       return parseChoice(t, {"auto", "on", "off"}, &k.shmStream, why);
     },
     [](const Knobs &k) { return k.shmStream; }},
    {"HORA_CALLER_CYCLES", "auto",
     "`auto`: a thread in `hora_wait` runs its set's cycles itself while the set's engine "
     "thread is idle (sets on one host, CPU tensors), sparing two thread hand-offs; `off`: the "
     "engine thread runs every cycle",
     [](const std::string &t, Knobs &k, std::string *why) {
       return parseChoice(t, {"auto", "off"}, &k.callerCycles, why);
     },
     [](const Knobs &k) { return k.callerCycles; }},
    {"HORA_THREAD_AFFINITY", "auto",
     "CPU of each rank's engine threads: `auto` spreads the local ranks over the CPUs when the "
     "launcher did not bind them (and there are at least 2 local ranks and as many CPUs), "
     "`off`, or one CPU per local rank such as `0,8`",
     [](const std::string &t, Knobs &k, std::string *why) {
       if (t == "auto" || t == "off") {
         k.threadAffinity = t;
         return true;
       }
       if (!isCpuList(t)) {
         *why = "expected auto, off, or CPU numbers joined by commas such as 0,1";
         return false;
       }
       k.threadAffinity = t;
       return true;
     },
     [](const Knobs &k) { return k.threadAffinity; }},
    {"HORA_TIMELINE", "",
     "path of a Chrome-trace JSON timeline, one file per rank (`trace.json` becomes "
     "`trace.rank<R>.json`, or put `{rank}` in the path)",
     [](const std::string &t, Knobs &k, std::string *) {
       k.timeline = t;
       return true;
     },
     [](const Knobs &k) { return k.timeline; }},
    {"HORA_FLIGHT_RECORDER", "/tmp/hora-flight.{rank}.json",
     "where each rank writes its last operations on a timeout, a lost peer, a backend error, "
     "SIGUSR1 or SIGTERM (`{rank}`: the rank; `{job}`: the job id, put before `{rank}` if absent, "
     "so jobs never share files; `off`: record nothing); `hora-flight-check` compares the files "
     "of a job",
     [](const std::string &t, Knobs &k, std::string *why) {
       if (t.empty()) {
         *why = "expected a path, or off";
         return false;
       }
       k.flightRecorder = t == "off" ? "" : t;
       return true;
     },
     [](const Knobs &k) { return k.flightRecorder.empty() ? std::string("off") : k.flightRecorder; }},
    {"HORA_FLIGHT_RECORDER_OPS", "1024", "operations the flight recorder keeps per rank",
     [](const std::string &t, Knobs &k, std::string *why) {
       double v;
       if (!parseDouble(t, 1, 1 << 24, &v, why) || v != std::floor(v)) {
         *why = "expected an integer in [1, 16777216]";
         return false;
       }
       k.flightRecorderOps = static_cast<int64_t>(v);
       return true;
     },
     [](const Knobs &k) { return std::to_string(k.flightRecorderOps); }},
    {"HORA_STALL_WARNING_S", "60",
     "report a name that some ranks have submitted and others have not after this long, and "
     "again at this interval, seconds (0: never)",
     [](const std::string &t, Knobs &k, std::string *why) {
       return parseDouble(t, 0, 1e9, &k.stallWarningS, why);
     },
     [](const Knobs &k) { return showDouble(k.stallWarningS); }},
    {"HORA_STALL_SHUTDOWN_S", "0",
     "fail such a name with `HORA_ERR_TIMEOUT` on the ranks that submitted it after this long, "
     "seconds (0: off)",
     [](const std::string &t, Knobs &k, std::string *why) {
       return parseDouble(t, 0, 1e9, &k.stallShutdownS, why);
     },
     [](const Knobs &k) { return showDouble(k.stallShutdownS); }},
    {"HORA_TIMEOUT_S", "300",
     "longest wait for peers, seconds: in negotiation, the env:// rendezvous and the data "
     "planes; a collective that waits longer, or a lost peer, fails with `HORA_ERR_TIMEOUT` or "
     "`HORA_ERR_PEER_LOST`",
     [](const std::string &t, Knobs &k, std::string *why) {
       return parseDouble(t, 0.001, 1e9, &k.timeoutS, why);
     },
     [](const Knobs &k) { return showDouble(k.timeoutS); }},
    {"HORA_LOG_LEVEL", "warning", "`trace`, `debug`, `info`, `warning` or `error` (any case)",
     [](const std::string &t, Knobs &k, std::string *why) {
       if (parseLogLevel(t, &k.logLevel)) return true;
       *why = "expected one of trace, debug, info, warning, error";
       return false;
     },
     [](const Knobs &k) { return std::string(logLevelName(k.logLevel)); }},
    {"HORA_BOOTSTRAP", "auto",
     "how the world forms: `auto`, `mpi`, `env` (torchrun's MASTER_ADDR, RANK, WORLD_SIZE "
     "variables) or `single` (a world of one)",
     [](const std::string &t, Knobs &k, std::string *why) {
       return parseChoice(t, {"auto", "mpi", "env", "single"}, &k.bootstrap, why);
     },
     [](const Knobs &k) { return k.bootstrap; }},
    {"HORA_JOB_TOKEN", "",
     "shared secret of an env:// job, the same on every rank: each connection to rank 0's store "
     "and each Gloo pair must prove it knows it (HMAC-SHA256 challenge-response both ways) or is "
     "closed; unset, the store trusts whoever reaches its port. `horarun` sets a fresh one for "
     "every single-machine job. See docs/security.md",
     [](const std::string &t, Knobs &k, std::string *) {
       k.jobToken = t;
       return true;
     },
     // Never printed: hora-info output ends up in logs and bug reports.
     [](const Knobs &k) { return k.jobToken.empty() ? std::string() : std::string("(set)"); }},
    {"HORA_STORE_BIND", "",
     "address rank 0's env:// store listens on: unset, the address `MASTER_ADDR` names when it "
     "is one of this host's (every interface when it is not, e.g. behind NAT); `0.0.0.0`, `::` "
     "or `*` (every interface) or one local address",
     [](const std::string &t, Knobs &k, std::string *why) {
       if (t.find_first_of(" \t\n") != std::string::npos) {  // "": the default
         *why = "expected an address such as 0.0.0.0, ::, 10.0.0.1 or *";
         return false;
       }
       k.storeBind = t;
       return true;
     },
     [](const Knobs &k) { return k.storeBind; }},
};

}  // namespace

bool parseBytes(const std::string &text, int64_t *bytes) {
  char *end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end == text.c_str() || !std::isfinite(v) || v < 0) return false;
  std::string suffix(end);
  for (auto &c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double scale = 1;
  if (suffix.empty() || suffix == "B") scale = 1;
  else if (suffix == "K" || suffix == "KB" || suffix == "KIB") scale = 1024.0;
  else if (suffix == "M" || suffix == "MB" || suffix == "MIB") scale = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "GB" || suffix == "GIB") scale = 1024.0 * 1024 * 1024;
  else return false;
  const double total = v * scale;
  if (total > 9.0e18) return false;
  *bytes = static_cast<int64_t>(total);
  return true;
}

const std::vector<KnobSpec> &knobTable() { return kTable; }

Knobs Knobs::fromLookup(const std::function<const char *(const char *)> &lookup) {
  Knobs knobs;
  for (const KnobSpec &spec : kTable) {
    const char *value = lookup(spec.name);
    if (value == nullptr) continue;
    std::string why;
    if (!spec.parse(value, knobs, &why)) {
      HORA_THROW(HORA_ERR_INVALID_ARGUMENT, spec.name, "='", value, "' is not valid: ", why,
                 " (default ", spec.defaultValue[0] ? spec.defaultValue : "unset", ")");
    }
  }
  return knobs;
}

Knobs Knobs::fromEnvironment() {
  return fromLookup([](const char *name) { return std::getenv(name); });
}

}  // namespace hora

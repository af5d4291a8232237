// SPDX-License-Identifier: Apache-2.0
// Reading torchrun-style and Slurm launch variables, strictly: a typo fails here, not as a hang.
#include "bootstrap/env/launch_config.h"

#include <cerrno>
#include <climits>
#include <cstdlib>

#include "base/error.h"

namespace hora {
namespace {

// An expansion bigger than any real allocation is a malformed list, not a job.
constexpr size_t kMaxHosts = size_t{1} << 20;

const char *lookup(const EnvLookup &env, const char *name) {
  const char *v = env ? env(name) : nullptr;
  return v != nullptr && v[0] != '\0' ? v : nullptr;  // set-but-empty counts as unset
}

// Decimal integer, optional leading '-', nothing else (no spaces, no "3x", no "0x10").
bool parseInt(const std::string &text, long long *out) {
  if (text.empty()) return false;
  size_t i = text[0] == '-' ? 1 : 0;
  if (i == text.size()) return false;
  for (size_t j = i; j < text.size(); ++j) {
    if (text[j] < '0' || text[j] > '9') return false;
  }
  errno = 0;
  char *end = nullptr;
  *out = std::strtoll(text.c_str(), &end, 10);
  return errno == 0 && end == text.c_str() + text.size();
}

// An integer at least `min` (0: "negative" otherwise, 1: "not a positive integer").
int intVar(const char *name, const char *value, long long min) {
  long long v = 0;
  if (!parseInt(value, &v)) {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, name, "='", value, "' is not an integer");
  }
  if (v < min) {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, name, "=", value, " is ",
               min == 0 ? "negative" : "not a positive integer");
  }
  if (v > INT_MAX) HORA_THROW(HORA_ERR_INVALID_ARGUMENT, name, "=", value, " is too large");
  return static_cast<int>(v);
}

// -1 when unset.
int optionalInt(const EnvLookup &env, const char *name, long long min) {
  const char *v = lookup(env, name);
  return v == nullptr ? -1 : intVar(name, v, min);
}

int portVar(const char *name, const char *value) {
  long long v = 0;
  if (!parseInt(value, &v)) {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, name, "='", value, "' is not an integer");
  }
  if (v < 1 || v > 65535) HORA_THROW(HORA_ERR_INVALID_ARGUMENT, name, "=", value, " is outside 1..65535");
  return static_cast<int>(v);
}

// HORA_AGENT_STORE=HOST:PORT and HORA_STORE_PREFIX, set by horarun's agents (launch_config.h).
// The store replaces MASTER_ADDR:MASTER_PORT, which stay torch's (its rank 0 serves there).
void readAgentStore(const EnvLookup &env, LaunchConfig *c) {
  const char *agent = lookup(env, "HORA_AGENT_STORE");
  if (agent == nullptr) return;
  const std::string text = agent;
  const size_t colon = text.rfind(':');
  std::string host = colon == std::string::npos ? "" : text.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty()) {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "HORA_AGENT_STORE='", text, "' is not HOST:PORT");
  }
  c->masterAddr = host;
  c->masterPort = portVar("HORA_AGENT_STORE's port", text.c_str() + colon + 1);
  c->agentStore = true;
  const char *prefix = lookup(env, "HORA_STORE_PREFIX");
  c->storePrefix = prefix != nullptr ? prefix : "";
}

void checkBelow(const char *name, int value, const char *limitName, int limit) {
  if (value >= 0 && limit >= 0 && value >= limit) {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, name, "=", value, " is not below ", limitName, "=", limit);
  }
}

void checkNotAbove(const char *name, int value, const char *limitName, int limit) {
  if (value >= 0 && limit >= 0 && value > limit) {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, name, "=", value, " is above ", limitName, "=", limit);
  }
}

// Appends the expansion of one host-list element ("rack[1-2]-n[01-02]") to out; false + why on
// malformed input.
bool expandElement(const std::string &item, std::vector<std::string> *out, std::string *why) {
  const size_t open = item.find('[');
  if (open == std::string::npos) {
    if (item.find(']') != std::string::npos) {
      *why = "']' without '['";
      return false;
    }
    out->push_back(item);
    return true;
  }
  const size_t close = item.find(']', open);
  if (close == std::string::npos) {
    *why = "'[' without ']'";
    return false;
  }
  const std::string prefix = item.substr(0, open);
  const std::string ranges = item.substr(open + 1, close - open - 1);
  if (prefix.find(']') != std::string::npos || ranges.find('[') != std::string::npos) {
    *why = "unbalanced brackets";
    return false;
  }
  std::vector<std::string> suffixes;
  if (!expandElement(item.substr(close + 1), &suffixes, why)) return false;

  size_t start = 0;
  for (;;) {
    const size_t comma = ranges.find(',', start);
    const std::string range = ranges.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t dash = range.find('-');
    const std::string lo = range.substr(0, dash);
    const std::string hi = dash == std::string::npos ? lo : range.substr(dash + 1);
    long long first = 0, last = 0;
    if (lo.empty() || hi.empty() || lo[0] == '-' || hi[0] == '-' || !parseInt(lo, &first) ||
        !parseInt(hi, &last)) {
      *why = "'" + range + "' in brackets is not a number or a range like 01-04";
      return false;
    }
    if (last < first) {
      *why = "range '" + range + "' runs backwards";
      return false;
    }
    if (static_cast<unsigned long long>(last - first) + out->size() >= kMaxHosts) {
      *why = "it expands to more than " + std::to_string(kMaxHosts) + " hosts";
      return false;
    }
    // Slurm pads every number of a range to the width of its lower bound: node[08-10].
    const size_t width = lo.size();
    for (long long n = first; n <= last; ++n) {
      std::string digits = std::to_string(n);
      if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
      for (const std::string &suffix : suffixes) out->push_back(prefix + digits + suffix);
    }
    if (out->size() >= kMaxHosts) {
      *why = "it expands to more than " + std::to_string(kMaxHosts) + " hosts";
      return false;
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return true;
}

bool expandList(const std::string &list, std::vector<std::string> *out, std::string *why) {
  out->clear();
  if (list.empty()) {
    *why = "the list is empty";
    return false;
  }
  // Split at commas outside brackets.
  size_t start = 0;
  int depth = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    const char c = i < list.size() ? list[i] : ',';
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0 || depth > 1) {
      *why = "unbalanced brackets";
      return false;
    }
    if (c == ',' && depth == 0) {
      const std::string item = list.substr(start, i - start);
      if (item.empty()) {
        *why = "an empty host name";
        return false;
      }
      if (!expandElement(item, out, why)) return false;
      start = i + 1;
    }
  }
  if (depth != 0) {
    *why = "'[' without ']'";
    return false;
  }
  return true;
}

// SLURM_TASKS_PER_NODE: "2(x3),1" = 2 tasks on each of 3 nodes, then 1. False if malformed.
bool parseTasksPerNode(const std::string &text, std::vector<int> *counts) {
  size_t start = 0;
  for (;;) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t paren = item.find('(');
    long long count = 0, repeat = 1;
    if (!parseInt(item.substr(0, paren), &count) || count < 1 || count > INT_MAX) return false;
    if (paren != std::string::npos) {
      if (item.size() < paren + 4 || item.compare(paren, 2, "(x") != 0 || item.back() != ')') return false;
      if (!parseInt(item.substr(paren + 2, item.size() - paren - 3), &repeat) || repeat < 1 ||
          repeat > static_cast<long long>(kMaxHosts)) {
        return false;
      }
    }
    for (long long i = 0; i < repeat; ++i) counts->push_back(static_cast<int>(count));
    if (counts->size() > kMaxHosts) return false;
    if (comma == std::string::npos) return true;
    start = comma + 1;
  }
}

// LOCAL_WORLD_SIZE and friends shared by both launchers.
void checkLocal(const LaunchConfig &c, const char *sizeName, const char *localRankName,
                const char *localSizeName, const char *nodeName) {
  checkBelow(localRankName, c.localRank, localSizeName, c.localWorldSize);
  checkNotAbove(localSizeName, c.localWorldSize, sizeName, c.worldSize);
  checkBelow(localRankName, c.localRank, sizeName, c.worldSize);
  checkBelow(nodeName, c.nodeRank, sizeName, c.worldSize);
}

}  // namespace

std::vector<std::string> expandSlurmNodelist(const std::string &list) {
  std::vector<std::string> hosts;
  std::string why;
  if (!expandList(list, &hosts, &why)) {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "Slurm node list '", list, "' is malformed: ", why);
  }
  return hosts;
}

// Under Slurm without MASTER_PORT every task must find the same port with no communication, so
// it comes from the job id: 10000 + SLURM_JOB_ID % 20000, i.e. 10000..29999. That range is below
// Linux's ephemeral ports (32768..60999 by default), where outgoing connections would otherwise
// hold it by chance. Two concurrent hora steps of one job need MASTER_PORT set apart.
int slurmPortForJob(unsigned long long jobId) { return static_cast<int>(10000 + jobId % 20000); }

LaunchConfig readEnvConfig(const EnvLookup &env) {
  LaunchConfig c;
  c.launcher = "env";
  for (const char *name : {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"}) {
    if (lookup(env, name) == nullptr) {
      HORA_THROW(HORA_ERR_INVALID_ARGUMENT, name,
                 " is not set; env:// needs MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE");
    }
  }
  c.masterAddr = lookup(env, "MASTER_ADDR");
  c.masterPort = portVar("MASTER_PORT", lookup(env, "MASTER_PORT"));
  c.worldSize = intVar("WORLD_SIZE", lookup(env, "WORLD_SIZE"), 1);
  c.rank = intVar("RANK", lookup(env, "RANK"), 0);
  checkBelow("RANK", c.rank, "WORLD_SIZE", c.worldSize);
  c.localRank = optionalInt(env, "LOCAL_RANK", 0);
  c.localWorldSize = optionalInt(env, "LOCAL_WORLD_SIZE", 1);
  // torchrun calls the node rank GROUP_RANK; other launchers NODE_RANK.
  const int nodeRank = optionalInt(env, "NODE_RANK", 0);
  const int groupRank = optionalInt(env, "GROUP_RANK", 0);
  if (nodeRank >= 0 && groupRank >= 0 && nodeRank != groupRank) {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "NODE_RANK=", nodeRank, " and GROUP_RANK=", groupRank,
               " disagree; unset one");
  }
  c.nodeRank = nodeRank >= 0 ? nodeRank : groupRank;
  checkLocal(c, "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
             nodeRank >= 0 ? "NODE_RANK" : "GROUP_RANK");
  readAgentStore(env, &c);
  return c;
}

bool elasticWorker(const EnvLookup &env) {
  const char *v = lookup(env, "HORA_ELASTIC");
  return v != nullptr && std::string(v) == "1";
}

LaunchConfig readElasticConfig(const EnvLookup &env) {
  LaunchConfig c;
  c.launcher = "env";
  for (const char *name : {"HORA_AGENT_STORE", "HORA_STORE_PREFIX", "HORA_ELASTIC_ID"}) {
    if (lookup(env, name) == nullptr) {
      HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "HORA_ELASTIC=1 but ", name,
                 " is not set; elastic workers are started by horarun (--min-np/--max-np)");
    }
  }
  readAgentStore(env, &c);
  c.elastic = true;
  c.elasticId = lookup(env, "HORA_ELASTIC_ID");
  return c;
}

void checkNotPartOfAWorld(const EnvLookup &env) {
  const char *rank = lookup(env, "RANK");
  const char *size = lookup(env, "WORLD_SIZE");
  if (rank == nullptr && size == nullptr) return;
  const int r = rank ? intVar("RANK", rank, 0) : 0;
  const int n = size ? intVar("WORLD_SIZE", size, 1) : 1;
  if (r == 0 && n == 1) return;
  std::string missing;
  int count = 0;
  for (const char *name : {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"}) {
    if (lookup(env, name) != nullptr) continue;
    missing += std::string(missing.empty() ? "" : " and ") + name;
    ++count;
  }
  std::string given;
  if (rank != nullptr) given = std::string("RANK=") + rank;
  if (size != nullptr) given += std::string(given.empty() ? "" : " and ") + "WORLD_SIZE=" + size;
  HORA_THROW(HORA_ERR_INVALID_ARGUMENT, given, " say this process is one of several, but ", missing,
             count == 1 ? " is" : " are",
             " not set: env:// needs MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE (unset RANK and "
             "WORLD_SIZE to run as a world of one)");
}

LaunchConfig readSlurmConfig(const EnvLookup &env) {
  LaunchConfig c;
  c.launcher = "slurm";
  const char *procId = lookup(env, "SLURM_PROCID");
  if (procId == nullptr) {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT,
               "SLURM_PROCID is not set; the Slurm bootstrap needs tasks started by srun");
  }
  const char *sizeName = lookup(env, "SLURM_NTASKS") ? "SLURM_NTASKS" : "SLURM_NPROCS";
  const char *ntasks = lookup(env, sizeName);
  if (ntasks == nullptr) {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT,
               "SLURM_NTASKS is not set; the Slurm bootstrap needs tasks started by srun");
  }
  c.worldSize = intVar(sizeName, ntasks, 1);
  c.rank = intVar("SLURM_PROCID", procId, 0);
  checkBelow("SLURM_PROCID", c.rank, sizeName, c.worldSize);
  c.localRank = optionalInt(env, "SLURM_LOCALID", 0);
  c.nodeRank = optionalInt(env, "SLURM_NODEID", 0);

  // Tasks on this node: the step's layout first (exact per node, so uneven layouts work when
  // SLURM_NODEID says which node this is), then the job's, then the requested --ntasks-per-node.
  const char *localSizeName = "SLURM_NTASKS_PER_NODE";
  for (const char *name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    const char *v = lookup(env, name);
    if (v == nullptr) continue;
    std::vector<int> counts;
    if (!parseTasksPerNode(v, &counts)) {
      HORA_THROW(HORA_ERR_INVALID_ARGUMENT, name, "='", v,
                 "' is not a Slurm task count list like '4(x2),3'");
    }
    localSizeName = name;
    bool uniform = true;
    for (int n : counts) uniform = uniform && n == counts[0];
    if (c.nodeRank >= 0 && static_cast<size_t>(c.nodeRank) < counts.size()) {
      c.localWorldSize = counts[static_cast<size_t>(c.nodeRank)];
    } else if (uniform) {
      c.localWorldSize = counts[0];
    }
    break;
  }
  if (c.localWorldSize < 0 && lookup(env, "SLURM_NTASKS_PER_NODE") != nullptr) {
    c.localWorldSize = intVar("SLURM_NTASKS_PER_NODE", lookup(env, "SLURM_NTASKS_PER_NODE"), 1);
    localSizeName = "SLURM_NTASKS_PER_NODE";
  }
  checkLocal(c, sizeName, "SLURM_LOCALID", localSizeName, "SLURM_NODEID");

  // Rank 0 runs on the first node of the step under srun's default (block) distribution;
  // MASTER_ADDR overrides for other layouts.
  if (const char *addr = lookup(env, "MASTER_ADDR")) {
    c.masterAddr = addr;
  } else {
    const char *listName = nullptr;
    for (const char *name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
      if (lookup(env, name) != nullptr) {
        listName = name;
        break;
      }
    }
    if (listName == nullptr) {
      HORA_THROW(HORA_ERR_INVALID_ARGUMENT,
                 "none of MASTER_ADDR, SLURM_STEP_NODELIST, SLURM_JOB_NODELIST is set; cannot tell "
                 "which host runs rank 0");
    }
    const char *list = lookup(env, listName);
    std::vector<std::string> hosts;
    std::string why;
    if (!expandList(list, &hosts, &why)) {
      HORA_THROW(HORA_ERR_INVALID_ARGUMENT, listName, "='", list,
                 "' is not a Slurm node list like 'node[01-04],gpu7': ", why);
    }
    c.masterAddr = hosts.front();
  }

  if (const char *port = lookup(env, "MASTER_PORT")) {
    c.masterPort = portVar("MASTER_PORT", port);
  } else if (const char *job = lookup(env, "SLURM_JOB_ID")) {
    long long id = 0;
    if (!parseInt(job, &id) || id < 0) {
      HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "SLURM_JOB_ID='", job,
                 "' is not a non-negative integer (it sets the store port; or set MASTER_PORT)");
    }
    c.masterPort = slurmPortForJob(static_cast<unsigned long long>(id));
  } else {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT,
               "neither MASTER_PORT nor SLURM_JOB_ID is set; cannot choose the store port");
  }
  return c;
}

}  // namespace hora

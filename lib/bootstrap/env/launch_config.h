// SPDX-License-Identifier: Apache-2.0
// Where the store is and who this process is, read from torchrun-style or Slurm variables.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace hora {

struct LaunchConfig {
  std::string launcher;  // "env" or "slurm"
  std::string masterAddr;
  int masterPort = 0;
  int rank = -1, worldSize = -1;
  // -1 = not given: the rendezvous derives them from host names.
  int localRank = -1, localWorldSize = -1, nodeRank = -1;
  // Started by a horarun agent (HORA_AGENT_STORE=HOST:PORT): the agents serve the store there
  // (masterAddr/masterPort then name it; MASTER_ADDR stays torch's) and it outlives every
  // worker, so rank 0 serves nothing; every key of this world goes under storePrefix
  // (HORA_STORE_PREFIX, the agents' round).
  bool agentStore = false;
  std::string storePrefix;
  // An elastic worker (HORA_ELASTIC=1): no RANK or WORLD_SIZE; the agents place it in the next
  // world under storePrefix, as elasticId (HORA_ELASTIC_ID). See bootstrap/env/elastic.h.
  bool elastic = false;
  std::string elasticId;
  // An elastic world's update key (see elastic.h), set by the env bootstrap for the rendezvous
  // of each world it joins: the waits of forming that world end when the agents give up on it.
  std::string abandonKey;
};

// The value of an environment variable, or nullptr when unset (base/knobs.h's environmentValue,
// or a map in tests).
using EnvLookup = std::function<const char *(const char *)>;

// torchrun's variables: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE required; LOCAL_RANK,
// LOCAL_WORLD_SIZE, NODE_RANK (or torchrun's GROUP_RANK) optional. A malformed or missing value
// -> Error(HORA_ERR_INVALID_ARGUMENT) naming the variable, its value and what is expected.
LaunchConfig readEnvConfig(const EnvLookup &env);

// Whether horarun started this process as an elastic worker (HORA_ELASTIC=1).
bool elasticWorker(const EnvLookup &env);
// An elastic worker's variables: HORA_AGENT_STORE, HORA_STORE_PREFIX and HORA_ELASTIC_ID
// required; RANK and WORLD_SIZE are the agents' to give, world by world.
LaunchConfig readElasticConfig(const EnvLookup &env);

// For a process about to run as a world of one: RANK or WORLD_SIZE saying it is one of several
// (RANK above 0 or WORLD_SIZE above 1) while MASTER_ADDR or MASTER_PORT is missing is a launch
// mistake, not a world of one -> Error(HORA_ERR_INVALID_ARGUMENT) naming what is missing.
void checkNotPartOfAWorld(const EnvLookup &env);

// A task started by srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID and the tasks
// per node; the master is the first host of the step's node list unless MASTER_ADDR is set, the
// port MASTER_PORT or else one derived from SLURM_JOB_ID (rule in the .cpp).
LaunchConfig readSlurmConfig(const EnvLookup &env);

// Slurm's compressed host list: "node[01-03,7],gpu-a" -> node01 node02 node03 node7 gpu-a.
// Zero padding is kept; several bracket groups in one name multiply out. Malformed ->
// Error(HORA_ERR_INVALID_ARGUMENT).
std::vector<std::string> expandSlurmNodelist(const std::string &list);

// The port used under Slurm when MASTER_PORT is not set.
int slurmPortForJob(unsigned long long jobId);

}  // namespace hora

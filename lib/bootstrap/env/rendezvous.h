// SPDX-License-Identifier: Apache-2.0
// Forming the world over the TCP store: every rank registers, rank 0 judges, all learn the topology.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "bootstrap/env/launch_config.h"
#include "bootstrap/env/tcp_store.h"

namespace hora {

struct Rendezvous {
  Topology topology;
  // Rank 0 only: the process's one server on this port (see rendezvous.cpp); declared first so it
  // outlives `store`.
  std::shared_ptr<TcpStoreServer> server;
  std::shared_ptr<TcpStoreClient> store;   // every rank
  std::string prefix;                      // "hora/<epoch>/": keys of this runtime
  std::vector<std::string> hosts;          // host name of each rank
  std::string address;                     // the store, "host:port"
};

// Rank 0 serves the store on config.masterPort (every interface); every rank connects, retrying
// until timeoutS, and registers. Rank 0 checks that no RANK is claimed twice, that every rank
// agrees on WORLD_SIZE and that given LOCAL_RANK/LOCAL_WORLD_SIZE/NODE_RANK fit together, and
// publishes one verdict: every rank then returns the same world or throws the same Error
// (HORA_ERR_INVALID_ARGUMENT, or HORA_ERR_TIMEOUT naming the ranks that never arrived).
// `epoch` namespaces the keys so that a later runtime in the same processes cannot read an
// earlier one's; `hostname` defaults to gethostname() (tests pass fake names).
Rendezvous rendezvous(const LaunchConfig &config, double timeoutS, uint64_t epoch,
                      const std::string &hostname = "");

}  // namespace hora

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

// Who may talk to the store: HORA_JOB_TOKEN and HORA_STORE_BIND.
struct StoreSecurity {
  std::string token;  // "" = none
  std::string bind;   // "" = the address MASTER_ADDR names, when it is one of this host's
};
// From the knob table (HORA_JOB_TOKEN, HORA_STORE_BIND).
StoreSecurity storeSecurityFromEnvironment();

// Where rank 0's store listens for MASTER_ADDR=masterAddr and HORA_STORE_BIND=bind: the host to
// pass to TcpStoreServer ("" = every interface) and whether to fall back to every interface
// when that address is not on this host. A host name that resolves to a loopback address here
// (Debian's "127.0.1.1 myhost") may resolve to the real address on other hosts: every interface.
std::pair<std::string, bool> storeBindHost(const std::string &masterAddr, const std::string &bind);

struct Rendezvous {
  Topology topology;
  // Rank 0 only: this runtime's server (see rendezvous.cpp); declared first so it outlives
  // `store`. It closes, and its keys go, when the runtime that formed it ends.
  std::shared_ptr<TcpStoreServer> server;
  std::shared_ptr<TcpStoreClient> store;   // every rank
  std::string prefix;                      // "hora/<epoch>/": keys of this runtime
  std::vector<std::string> hosts;          // host name of each rank
  std::string address;                     // the store, "host:port"
};

// Rank 0 serves the store on config.masterPort (at MASTER_ADDR's address, see storeBindHost);
// every rank connects, retrying until timeoutS, proves the job token if there is one, and
// registers. Rank 0 checks that no RANK is claimed twice, that every rank
// agrees on WORLD_SIZE and that given LOCAL_RANK/LOCAL_WORLD_SIZE/NODE_RANK fit together, and
// publishes one verdict: every rank then returns the same world or throws the same Error
// (HORA_ERR_INVALID_ARGUMENT, or HORA_ERR_TIMEOUT naming the ranks that never arrived).
// `epoch` namespaces the keys so that a later runtime in the same processes cannot read an
// earlier one's; `hostname` defaults to gethostname() (tests pass fake names).
Rendezvous rendezvous(const LaunchConfig &config, double timeoutS, uint64_t epoch,
                      const std::string &hostname = "");
Rendezvous rendezvous(const LaunchConfig &config, double timeoutS, uint64_t epoch,
                      const std::string &hostname, const StoreSecurity &security);

}  // namespace hora

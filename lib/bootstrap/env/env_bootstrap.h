// SPDX-License-Identifier: Apache-2.0
// Worlds formed without MPI: torchrun-style variables or Slurm, over hora's TCP store.
#pragma once

#include <memory>
#include <string>

#include "base/knobs.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/env/launch_config.h"

namespace hora {

// Rendezvous at config's master (rank 0 serves the store), then groups on a full mesh of TCP
// pairs rendezvoused through the store (bootstrap/env/gloo_group.h).
std::unique_ptr<Bootstrap> createEnvBootstrap(const LaunchConfig &config, const Knobs &knobs);

// The local IPv4 address that routes to host:port (a connected UDP socket's own address; no
// packet is sent): what peers should use to reach this rank. "127.0.0.1" for a loopback master.
std::string routeAddressTo(const std::string &host, int port);

// The network interface holding IPv4 `address` ("eth0"), "" if none does.
std::string interfaceOfAddress(const std::string &address);

// A world spanning hosts: unless the user set NCCL_SOCKET_IFNAME, sets it to the interface of
// `localAddress` (the one this rank reached the store through, so its peers reach it there too),
// before any NCCL communicator reads it. NCCL's own choice can be an interface the other hosts
// cannot reach (a container's bridge, a second NIC): its bootstrap then waits until it times out.
void seedNcclSocketInterface(const std::string &localAddress);

}  // namespace hora

// SPDX-License-Identifier: Apache-2.0
// GlooBackend: core's collectives over the Gloo mesh's TCP pairs.
// Its factory is declared, and documented, beside the registry's row that calls it (registry.cpp).
#include <unistd.h>

#include <algorithm>

#include "base/knobs.h"
#include "bootstrap/env/auth.h"
#include "bootstrap/env/gloo_group.h"
#include "bootstrap/env/env_bootstrap.h"
#include "bootstrap/env/tcp_store.h"
#include "core/collectives/link_backend.h"

namespace hora {
namespace {

// The group's mesh is a Link: core's collectives run on it (LinkBackend). This class keeps
// alive what a mesh of its own needs where another transport formed the group.
class GlooBackend final : public LinkBackend {
 public:
  GlooBackend(std::shared_ptr<GlooMesh> mesh, const Knobs &knobs,
              std::unique_ptr<TcpStoreServer> server, std::unique_ptr<GlooGroup> ownGroup)
      : LinkBackend(std::move(mesh), BackendCaps::plain(/*usesSockets=*/true, BackendCaps::Scope::kAnyHost),
                    knobs, /*negotiates=*/false),
        server_(std::move(server)), ownGroup_(std::move(ownGroup)) {}

 private:
  std::unique_ptr<TcpStoreServer> server_;  // rank 0 of a Gloo mesh built over MPI
  std::unique_ptr<GlooGroup> ownGroup_;
};

std::string hostAddress() {
  char name[256] = {0};
  gethostname(name, sizeof name - 1);
  return name;
}

}  // namespace

std::unique_ptr<Backend> createGlooBackend(Group &group, const Knobs &knobs) {
  const double timeoutS = knobs.timeoutS;
  if (auto *gloo = dynamic_cast<GlooGroup *>(&group)) {
    return std::make_unique<GlooBackend>(gloo->mesh(), knobs, nullptr, nullptr);
  }
  // Another transport formed this group (MPI): stand up a store on set rank 0 and tell the
  // others where it is, and a fresh job token for it, through the group's own control plane,
  // which the launcher already protects. Only this group's ranks can then join the store or the
  // mesh, whatever else reaches the port.
  std::unique_ptr<TcpStoreServer> server;
  std::string where;
  if (group.rank() == 0) {
    StoreServerOptions options;
    options.token = hexOf(randomBytes(32));
    options.maxConnections = 4 * static_cast<size_t>(group.size()) + 64;
    options.idleTimeoutS = std::min(10.0, std::max(1.0, timeoutS));
    server = std::make_unique<TcpStoreServer>("", 0, options);
    where = options.token + " " + hostAddress() + ":" + std::to_string(server->port());
  }
  group.control().broadcastFromRoot(where);
  const size_t space = where.find(' ');
  const std::string token = where.substr(0, space);
  const std::string address = where.substr(space + 1);
  const size_t colon = address.rfind(':');
  const std::string host = address.substr(0, colon);
  const int port = std::stoi(address.substr(colon + 1));
  auto store = std::make_shared<TcpStoreClient>(host, port, timeoutS, StoreClientOptions{token, ""});
  auto own = std::make_unique<GlooGroup>(store, "gloo/", group.rank(), group.size(),
                                         routeAddressTo(host, port), timeoutS, nullptr);
  std::shared_ptr<GlooMesh> mesh = own->mesh();
  return std::make_unique<GlooBackend>(std::move(mesh), knobs, std::move(server), std::move(own));
}

}  // namespace hora

// SPDX-License-Identifier: Apache-2.0
// EnvWorld: the rendezvous, and one store-backed group per process set.
#include "bootstrap/env/env_bootstrap.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>

#include "base/error.h"
#include "bootstrap/env/elastic.h"
#include "bootstrap/env/rendezvous.h"
#include "hora_config.h"
#if HORA_HAVE_GLOO
#include "bootstrap/env/gloo_group.h"
#endif

namespace hora {
namespace {

// Counts runtimes started in this process, so that keys of a runtime started after hora_shutdown
// never meet the previous one's (every rank starts the same number of runtimes).
std::atomic<uint64_t> gEpochs{0};

// Presence through the store: each rank's latest word is the key `prefix`<rank>.
class StorePresence final : public Presence {
 public:
  StorePresence(std::shared_ptr<TcpStoreClient> store, std::string prefix, int rank, int size)
      : store_(std::move(store)), prefix_(std::move(prefix)), rank_(rank), size_(size) {}
  void publish(const std::string &line) override { store_->set(key(rank_), line); }
  std::vector<std::string> collect() override {
    std::vector<std::string> latest(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) {
      if (r != rank_ && store_->check({key(r)})) latest[static_cast<size_t>(r)] = store_->get(key(r));
    }
    return latest;
  }

 private:
  std::string key(int rank) const { return prefix_ + std::to_string(rank); }
  std::shared_ptr<TcpStoreClient> store_;
  std::string prefix_;
  int rank_;
  int size_;
};

// A group over the store: Gloo's TCP mesh, rendezvoused under `prefix`.
std::unique_ptr<Group> createStoreGroup(std::shared_ptr<TcpStoreClient> store,
                                        const std::string &prefix, int rank, int size,
                                        const std::string &localAddress, double timeoutS) {
#if HORA_HAVE_GLOO
  auto presence = std::make_unique<StorePresence>(store, prefix + "beat/", rank, size);
  return std::make_unique<GlooGroup>(store, prefix, rank, size, localAddress, timeoutS,
                                     std::move(presence));
#else
  (void)store, (void)prefix, (void)rank, (void)localAddress, (void)timeoutS;
  if (size == 1) return nullptr;
  HORA_THROW(HORA_ERR_UNSUPPORTED, "a world formed by env:// or Slurm needs the Gloo transport, "
             "and this build has no Gloo (meson option gloo; Debian package libgloo-dev)");
#endif
}

class EnvWorld final : public Bootstrap {
 public:
  EnvWorld(const LaunchConfig &config, const Knobs &knobs)
      : launcher_(config.launcher == "slurm" ? "slurm" : "env"), timeoutS_(knobs.timeoutS) {
    if (config.elastic) {
      formElastic(config);
    } else {
      rv_ = rendezvous(config, knobs.timeoutS, gEpochs++);
    }
    localAddress_ = routeAddressTo(config.masterAddr, config.masterPort);
  }
  ~EnvWorld() override {
    if (!elasticKey_.empty()) leaveElasticWorld(elasticKey_);
  }

  const char *launcher() const override { return launcher_; }
  const Topology &topology() const override { return rv_.topology; }
  std::string rendezvousPoint() const override { return "store " + rv_.address; }

  std::unique_ptr<Group> worldGroup() override {
    return createStoreGroup(rv_.store, rv_.prefix + "world/", rv_.topology.rank,
                            rv_.topology.size, localAddress_, timeoutS_);
  }

  std::unique_ptr<Group> createGroup(Group &, const std::vector<int> &ranks) override {
    // Every rank counts every set, members or not, so a set's keys are the same everywhere.
    const uint64_t n = sets_++;
    auto it = std::find(ranks.begin(), ranks.end(), rv_.topology.rank);
    if (it == ranks.end()) return nullptr;
    return createStoreGroup(rv_.store, rv_.prefix + "set" + std::to_string(n) + "/",
                            static_cast<int>(it - ranks.begin()), static_cast<int>(ranks.size()),
                            localAddress_, timeoutS_);
  }

  // The parent's rank 0 names the split (its store prefix, unique in the job); each color's
  // group then meets under that prefix, over a store connection of its own: sets split on their
  // own threads at once, and one connection would hold one set's wait for its peers while
  // another set's peers wait for this process (a deadlock until the timeout).
  std::unique_ptr<Group> splitGroup(Group &parent, int color, int key) override {
    ControlPlane &control = parent.control();
    std::string name;
    if (control.rank() == 0) name = "split" + std::to_string(splits_++) + "." + std::to_string(rv_.topology.rank);
    control.broadcastFromRoot(name);
    const SplitPlace place = splitPlace(control, color, key);
    if (color < 0) return nullptr;
    return createStoreGroup(rv_.store->reconnect(), rv_.prefix + name + "/" + std::to_string(color) + "/",
                            place.rank, place.size, localAddress_, timeoutS_);
  }

 private:
  // The agents say which world this worker is in and its rank there; the world then meets under
  // that world's keys, as any env:// world (each world is formed once, so no epoch is needed).
  void formElastic(LaunchConfig config) {
    const StoreSecurity security = storeSecurityFromEnvironment();
    TcpStoreClient agents(config.masterAddr, config.masterPort, timeoutS_, StoreClientOptions{security.token, ""});
    const ElasticPlace place = joinElasticWorld(agents, config.storePrefix, config.elasticId, timeoutS_);
    const std::string base = config.storePrefix;
    config.rank = place.rank;
    config.worldSize = place.size;
    config.storePrefix = base + "w" + std::to_string(place.world) + "/";
    rv_ = rendezvous(config, timeoutS_, 0, "", security);
    elasticKey_ = elasticUpdateKey(base, place.world);
    enterElasticWorld(rv_.store, elasticKey_);
  }

  const char *launcher_;
  double timeoutS_;
  std::string elasticKey_;  // this elastic world's update key; empty outside elastic jobs
  Rendezvous rv_;
  std::string localAddress_;
  uint64_t sets_ = 0;
  std::atomic<uint64_t> splits_{0};  // splits this rank named as some parent's rank 0 (any set's thread)
};

}  // namespace

std::unique_ptr<Bootstrap> createEnvBootstrap(const LaunchConfig &config, const Knobs &knobs) {
  return std::make_unique<EnvWorld>(config, knobs);
}

std::string routeAddressTo(const std::string &host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo *found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || !found) {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "cannot resolve the master address '", host, "'");
  }
  std::string address = "127.0.0.1";
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0) {
    if (connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
      sockaddr_in self{};
      socklen_t len = sizeof self;
      char text[INET_ADDRSTRLEN] = {0};
      if (getsockname(fd, reinterpret_cast<sockaddr *>(&self), &len) == 0 &&
          inet_ntop(AF_INET, &self.sin_addr, text, sizeof text)) {
        address = text;
      }
    }
    close(fd);
  }
  freeaddrinfo(found);
  return address;
}

}  // namespace hora

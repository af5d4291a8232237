// SPDX-License-Identifier: Apache-2.0
// EnvWorld: the rendezvous, and one store-backed group per process set.
#include "bootstrap/env/env_bootstrap.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "base/error.h"
#include "base/knobs.h"
#include "base/logging.h"
#include "base/test_points.h"
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

// Presence through the store: each rank's latest word is the key `prefix`<rank>. `store` is a
// connection of the process's own for presence, whose answers are awaited briefly (see
// EnvWorld::presenceStore): a store that stops answering (its process stopped) ends the channel
// in seconds, and the stall reports say so, instead of holding the watch for HORA_TIMEOUT_S.
class StorePresence final : public Presence {
 public:
  StorePresence(std::shared_ptr<TcpStoreClient> store, std::string prefix, int rank, int size,
                std::string server)
      : store_(std::move(store)), prefix_(std::move(prefix)), rank_(rank), size_(size),
        server_(std::move(server)) {}
  void publish(const std::string &line) override {
    guarded([&] { store_->set(key(rank_), line); });
  }
  std::vector<std::string> collect() override {
    std::vector<std::string> latest(static_cast<size_t>(size_));
    guarded([&] {
      for (int r = 0; r < size_; ++r) {
        if (r != rank_ && store_->check({key(r)})) latest[static_cast<size_t>(r)] = store_->get(key(r));
      }
    });
    return latest;
  }
  // The first to count itself in "failures" writes "failed"; the others' words stay their own.
  void declareFailure(const std::string &line) override {
    guarded([&] {
      if (store_->add(prefix_ + "failures", 1) == 1) store_->set(prefix_ + "failed", line);
    });
  }
  std::string declaredFailure() override {
    std::string word;
    guarded([&] {
      if (store_->check({prefix_ + "failed"})) word = store_->get(prefix_ + "failed");
    });
    return word;
  }

 private:
  std::string key(int rank) const { return prefix_ + std::to_string(rank); }
  // The store's error, saying who serves it: the process to look at when it stops answering.
  template <typename F>
  void guarded(F &&body) {
    try {
      body();
    } catch (const Error &e) {
      throw Error(e.status(), e.message() + " (the store is served by " + server_ + ")", __FILE__,
                  __LINE__);
    }
  }
  std::shared_ptr<TcpStoreClient> store_;
  std::string prefix_;
  int rank_;
  int size_;
  std::string server_;
};

// How long a presence word waits for the store's answer (at most HORA_TIMEOUT_S).
constexpr double kPresenceAnswerS = 5.0;
// How long a failed runtime's rank 0 keeps serving the store before it closes it (see
// lingerAfterFailure).
constexpr int kLingerMs = 1000;

// A group over the store: Gloo's TCP mesh, rendezvoused under `prefix`; its presence channel
// on `presence`, a connection of its own (server: who serves the store, for messages).
std::unique_ptr<Group> createStoreGroup(std::shared_ptr<TcpStoreClient> store,
                                        std::shared_ptr<TcpStoreClient> presence,
                                        const std::string &server, const std::string &prefix,
                                        int rank, int size, const std::string &localAddress,
                                        double timeoutS) {
#if HORA_HAVE_GLOO
  auto words = std::make_unique<StorePresence>(std::move(presence), prefix + "beat/", rank, size, server);
  return std::make_unique<GlooGroup>(store, prefix, rank, size, localAddress, timeoutS,
                                     std::move(words));
#else
  (void)store, (void)presence, (void)server, (void)prefix, (void)rank, (void)localAddress,
      (void)timeoutS;
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
    if (rv_.topology.crossSize > 1) seedNcclSocketInterface(localAddress_);
    server_ = config.agentStore ? "horarun's agent at " + rv_.address
                                : "rank 0 at " + rv_.address + " (host " +
                                      (rv_.hosts.empty() ? std::string("?") : rv_.hosts[0]) + ")";
  }
  ~EnvWorld() override {
    if (!elasticKey_.empty()) leaveElasticWorld(elasticKey_);
  }

  const char *launcher() const override { return launcher_; }
  // The peers that fail a moment after this rank read its last word from this rank's store.
  void lingerAfterFailure() override {
    if (rv_.server) std::this_thread::sleep_for(std::chrono::milliseconds(kLingerMs));
  }
  const Topology &topology() const override { return rv_.topology; }
  std::string rendezvousPoint() const override { return "store " + rv_.address; }

  std::unique_ptr<Group> worldGroup() override {
    return createStoreGroup(rv_.store, presenceStore(), server_, rv_.prefix + "world/",
                            rv_.topology.rank, rv_.topology.size, localAddress_, timeoutS_);
  }

  std::unique_ptr<Group> createGroup(Group &, const std::vector<int> &ranks) override {
    // Every rank counts every set, members or not, so a set's keys are the same everywhere.
    const uint64_t n = sets_++;
    auto it = std::find(ranks.begin(), ranks.end(), rv_.topology.rank);
    if (it == ranks.end()) return nullptr;
    return createStoreGroup(rv_.store, presenceStore(), server_,
                            rv_.prefix + "set" + std::to_string(n) + "/",
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
    return createStoreGroup(rv_.store->reconnect(), presenceStore(), server_,
                            rv_.prefix + name + "/" + std::to_string(color) + "/", place.rank,
                            place.size, localAddress_, timeoutS_);
  }

 private:
  // The process's one connection for every group's presence words, made at first use: answers
  // awaited kPresenceAnswerS at most.
  std::shared_ptr<TcpStoreClient> presenceStore() {
    std::lock_guard<std::mutex> lock(presenceMutex_);
    if (!presence_) presence_ = rv_.store->reconnect(std::min(timeoutS_, kPresenceAnswerS));
    return presence_;
  }

  // The agents say which world this worker is in and its rank there; the world then meets under
  // that world's keys, as any env:// world (each world is formed once, so no epoch is needed).
  // The world's update key is watched from the moment this worker has its place: the agents
  // set it when a member dies before the world has formed (or a newer world is wanted), and every
  // wait of the formation (the rendezvous, the mesh's addresses, its barriers) then ends at once;
  // hora_init joins the next world (initRuntime, api/runtime.cpp).
  void formElastic(LaunchConfig config) {
    const StoreSecurity security = storeSecurityFromEnvironment();
    auto agents = std::make_shared<TcpStoreClient>(config.masterAddr, config.masterPort, timeoutS_,
                                                   StoreClientOptions{security.token, ""});
    const ElasticPlace place = joinElasticWorld(*agents, config.storePrefix, config.elasticId, timeoutS_);
    const std::string base = config.storePrefix;
    elasticKey_ = elasticUpdateKey(base, place.world);
    enterElasticWorld(agents, elasticKey_);  // this connection answers elasticWorldChanged()
    testPoint("elastic-joined", place.rank);
    config.rank = place.rank;
    config.worldSize = place.size;
    config.storePrefix = base + "w" + std::to_string(place.world) + "/";
    config.abandonKey = elasticKey_;
    rv_ = rendezvous(config, timeoutS_, 0, "", security);
  }

  const char *launcher_;
  double timeoutS_;
  std::string elasticKey_;  // this elastic world's update key; empty outside elastic jobs
  Rendezvous rv_;
  std::string server_;  // who serves the store, for messages: "rank 0 (host a, pid 12)"
  std::mutex presenceMutex_;  // guards presence_ (groups form on several sets' threads)
  std::shared_ptr<TcpStoreClient> presence_;
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

std::string interfaceOfAddress(const std::string &address) {
  ifaddrs *all = nullptr;
  if (getifaddrs(&all) != 0) return "";
  std::string name;
  for (ifaddrs *i = all; i != nullptr && name.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {0};
    const auto *in = reinterpret_cast<const sockaddr_in *>(i->ifa_addr);
    if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof text) != nullptr && address == text) name = i->ifa_name;
  }
  freeifaddrs(all);
  return name;
}

void seedNcclSocketInterface(const std::string &localAddress) {
  if (environmentValue("NCCL_SOCKET_IFNAME") != nullptr) return;  // the user's choice stands
  const std::string name = interfaceOfAddress(localAddress);
  if (name.empty() || name == "lo") return;
  // "=" asks NCCL for exactly this interface, not every one whose name starts so.
  setenv("NCCL_SOCKET_IFNAME", ("=" + name).c_str(), 0);
  HORA_LOG(kInfo) << "NCCL_SOCKET_IFNAME==" << name << " (the interface this rank reaches the store "
                  << "through; set NCCL_SOCKET_IFNAME to choose another)";
}

}  // namespace hora

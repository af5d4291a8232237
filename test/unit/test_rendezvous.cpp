// SPDX-License-Identifier: Apache-2.0
// The env:// rendezvous with ranks as threads: topology, and every failure on every rank present.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "base/error.h"
#include "base/logging.h"
#include "bootstrap/env/env_bootstrap.h"
#include "bootstrap/env/rendezvous.h"
#include "time_scale.h"

namespace hora {
namespace {

using Clock = std::chrono::steady_clock;

const unsigned kWatchdog = alarm(120);

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Non-zero ranks must know rank 0's port in advance: take one the kernel says is free.
int freePort(int *holder = nullptr) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr *>(&addr), &len);
  if (holder != nullptr) {
    EXPECT_EQ(listen(fd, 1), 0);
    *holder = fd;
  } else {
    close(fd);
  }
  return ntohs(addr.sin_port);
}

LaunchConfig config(int port, int rank, int worldSize, int localRank = -1, int localWorldSize = -1,
                    int nodeRank = -1) {
  LaunchConfig c;
  c.launcher = "env";
  c.masterAddr = "127.0.0.1";
  c.masterPort = port;
  c.rank = rank;
  c.worldSize = worldSize;
  c.localRank = localRank;
  c.localWorldSize = localWorldSize;
  c.nodeRank = nodeRank;
  return c;
}

struct Outcome {
  bool ok = false;
  Rendezvous rv;
  hora_status_t status = HORA_SUCCESS;
  std::string message;
};

// One thread per config, all at once; returns when all have finished.
class Ranks {
 public:
  Ranks(double timeoutS, uint64_t epoch) : timeoutS_(timeoutS), epoch_(epoch) {}
  ~Ranks() { join(); }
  void start(const LaunchConfig &c, const std::string &host) {
    outcomes_.push_back(std::make_unique<Outcome>());
    Outcome *out = outcomes_.back().get();
    threads_.emplace_back([this, c, host, out] {
      try {
        out->rv = rendezvous(c, timeoutS_, epoch_, host);
        out->ok = true;
      } catch (const Error &e) {
        out->status = e.status();
        out->message = e.message();
      }
    });
  }
  std::vector<Outcome *> join() {
    for (std::thread &t : threads_) t.join();
    threads_.clear();
    std::vector<Outcome *> all;
    for (auto &o : outcomes_) all.push_back(o.get());
    return all;
  }

 private:
  double timeoutS_;
  uint64_t epoch_;
  std::vector<std::thread> threads_;
  std::vector<std::unique_ptr<Outcome>> outcomes_;
};

std::vector<Outcome *> runAll(Ranks &ranks, const std::vector<LaunchConfig> &configs,
                              const std::vector<std::string> &hosts) {
  for (size_t i = 0; i < configs.size(); ++i) ranks.start(configs[i], hosts[i]);
  return ranks.join();
}

void expectTopology(const Topology &t, int rank, int size, int localRank, int localSize,
                    int crossRank, int crossSize) {
  EXPECT_EQ(t.rank, rank);
  EXPECT_EQ(t.size, size);
  EXPECT_EQ(t.localRank, localRank) << "rank " << rank;
  EXPECT_EQ(t.localSize, localSize) << "rank " << rank;
  EXPECT_EQ(t.crossRank, crossRank) << "rank " << rank;
  EXPECT_EQ(t.crossSize, crossSize) << "rank " << rank;
}

void expectAllFail(const std::vector<Outcome *> &outcomes, hora_status_t status,
                   const std::string &message) {
  for (size_t i = 0; i < outcomes.size(); ++i) {
    EXPECT_FALSE(outcomes[i]->ok) << "thread " << i;
    EXPECT_EQ(outcomes[i]->status, status) << "thread " << i << ": " << outcomes[i]->message;
    EXPECT_EQ(outcomes[i]->message, message) << "thread " << i;
  }
}

TEST(Rendezvous, TopologyFromHostNames) {
  const int port = freePort();
  Ranks ranks(10, 7);
  std::vector<LaunchConfig> configs;
  for (int r = 0; r < 5; ++r) configs.push_back(config(port, r, 5));
  const std::vector<std::string> hosts = {"a", "a", "b", "b", "a"};
  const auto out = runAll(ranks, configs, hosts);
  for (int r = 0; r < 5; ++r) ASSERT_TRUE(out[r]->ok) << out[r]->message;
  // Host a holds ranks 0,1,4 (local 0,1,2), host b ranks 2,3 (local 0,1); a comes first (rank 0).
  // Local rank 0 and 1 exist on both hosts, local rank 2 only on a.
  expectTopology(out[0]->rv.topology, 0, 5, 0, 3, 0, 2);
  expectTopology(out[1]->rv.topology, 1, 5, 1, 3, 0, 2);
  expectTopology(out[2]->rv.topology, 2, 5, 0, 2, 1, 2);
  expectTopology(out[3]->rv.topology, 3, 5, 1, 2, 1, 2);
  expectTopology(out[4]->rv.topology, 4, 5, 2, 3, 0, 1);
  for (int r = 0; r < 5; ++r) {
    EXPECT_EQ(out[r]->rv.hosts, hosts);
    EXPECT_EQ(out[r]->rv.prefix, "hora/7/");
    EXPECT_EQ(out[r]->rv.server != nullptr, r == 0);
    ASSERT_NE(out[r]->rv.store, nullptr);
  }
  // The store stays up for later users: ranks talk through it.
  out[3]->rv.store->set("hora/7/hello", "from 3");
  EXPECT_EQ(out[1]->rv.store->get("hora/7/hello"), "from 3");
}

TEST(Rendezvous, HostOrderFollowsLowestRank) {
  const int port = freePort();
  Ranks ranks(10, 0);
  std::vector<LaunchConfig> configs;
  for (int r = 0; r < 4; ++r) configs.push_back(config(port, r, 4));
  const auto out = runAll(ranks, configs, {"b", "a", "b", "a"});
  for (int r = 0; r < 4; ++r) ASSERT_TRUE(out[r]->ok) << out[r]->message;
  // b (lowest rank 0) is cross rank 0, a (lowest rank 1) cross rank 1.
  expectTopology(out[0]->rv.topology, 0, 4, 0, 2, 0, 2);
  expectTopology(out[1]->rv.topology, 1, 4, 0, 2, 1, 2);
  expectTopology(out[2]->rv.topology, 2, 4, 1, 2, 0, 2);
  expectTopology(out[3]->rv.topology, 3, 4, 1, 2, 1, 2);
}

TEST(Rendezvous, WorldOfOneAndTheLogLine) {
  const int port = freePort();
  // Capture stderr around the call.
  std::fflush(stderr);
  char path[] = "/tmp/hora_rv_logXXXXXX";
  const int file = mkstemp(path);
  ASSERT_GE(file, 0);
  const int saved = dup(STDERR_FILENO);
  dup2(file, STDERR_FILENO);
  const LogLevel before = logLevel();
  setLogLevel(LogLevel::kDebug);  // the engine prints the info line; rendezvous logs at debug
  Rendezvous rv;
  std::string error;
  try {
    rv = rendezvous(config(port, 0, 1), 5, 0, "solo");
  } catch (const Error &e) {
    error = e.message();
  }
  setLogLevel(before);
  dup2(saved, STDERR_FILENO);
  close(saved);
  std::string logged(4096, '\0');
  logged.resize(static_cast<size_t>(pread(file, &logged[0], logged.size(), 0)));
  close(file);
  unlink(path);
  ASSERT_EQ(error, "");
  expectTopology(rv.topology, 0, 1, 0, 1, 0, 1);
  EXPECT_EQ(rv.hosts, std::vector<std::string>{"solo"});
  EXPECT_NE(logged.find("launcher env, rank 0 (local 0) of 1, store 127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << logged;
}

TEST(Rendezvous, GivenLocalVariablesWin) {
  const int port = freePort();
  Ranks ranks(10, 0);
  // Four containers that all call themselves "pod", on two nodes; local ranks reversed.
  std::vector<LaunchConfig> configs = {config(port, 0, 4, 1, 2, 0), config(port, 1, 4, 0, 2, 0),
                                       config(port, 2, 4, 1, 2, 1), config(port, 3, 4, 0, 2, 1)};
  const auto out = runAll(ranks, configs, {"pod", "pod", "pod", "pod"});
  for (int r = 0; r < 4; ++r) ASSERT_TRUE(out[r]->ok) << out[r]->message;
  expectTopology(out[0]->rv.topology, 0, 4, 1, 2, 0, 2);
  expectTopology(out[1]->rv.topology, 1, 4, 0, 2, 0, 2);
  expectTopology(out[2]->rv.topology, 2, 4, 1, 2, 1, 2);
  expectTopology(out[3]->rv.topology, 3, 4, 0, 2, 1, 2);
}

TEST(Rendezvous, NodeRankOrdersNodes) {
  const int port = freePort();
  Ranks ranks(10, 0);
  // Ranks 0,1 say node 1 and ranks 2,3 node 0: node 0 is cross rank 0.
  std::vector<LaunchConfig> configs = {config(port, 0, 4, -1, -1, 1), config(port, 1, 4, -1, -1, 1),
                                       config(port, 2, 4, -1, -1, 0), config(port, 3, 4, -1, -1, 0)};
  const auto out = runAll(ranks, configs, {"x", "y", "z", "w"});
  for (int r = 0; r < 4; ++r) ASSERT_TRUE(out[r]->ok) << out[r]->message;
  expectTopology(out[0]->rv.topology, 0, 4, 0, 2, 1, 2);
  expectTopology(out[1]->rv.topology, 1, 4, 1, 2, 1, 2);
  expectTopology(out[2]->rv.topology, 2, 4, 0, 2, 0, 2);
  expectTopology(out[3]->rv.topology, 3, 4, 1, 2, 0, 2);
}

TEST(Rendezvous, InconsistentLocalVariables) {
  struct Case {
    std::vector<int> localRanks, localSizes;
    std::vector<std::string> hosts;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{0, 0, 0, 1}, {-1, -1, -1, -1}, {"a", "a", "b", "b"},
       "LOCAL_RANK=0 is given to ranks 0 and 1, both on host a"},
      {{-1, -1, -1}, {2, 2, 2}, {"a", "a", "b"}, "LOCAL_WORLD_SIZE=2 on rank 2, but host b has 1 rank (2)"},
      {{0, 1, -1}, {-1, -1, -1}, {"a", "a", "a"}, "LOCAL_RANK is set on ranks 0,1 but not on rank 2"},
      {{1, 0}, {-1, -1}, {"a", "b"}, "LOCAL_RANK=1 on rank 0, but host a has 1 rank (0)"},
  };
  for (const Case &c : cases) {
    const int port = freePort();
    Ranks ranks(10, 0);
    std::vector<LaunchConfig> configs;
    for (size_t r = 0; r < c.hosts.size(); ++r) {
      configs.push_back(config(port, static_cast<int>(r), static_cast<int>(c.hosts.size()),
                               c.localRanks[r], c.localSizes[r]));
    }
    expectAllFail(runAll(ranks, configs, c.hosts), HORA_ERR_INVALID_ARGUMENT, c.message);
  }
}

// Polls the store until the counter `key` reaches n (the test orders arrivals with it).
void waitForCount(TcpStoreClient &probe, const std::string &key, int64_t n) {
  const Clock::time_point start = Clock::now();
  while (probe.add(key, 0) < n) {
    ASSERT_LT(since(start), 10) << key << " never reached " << n;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

TEST(Rendezvous, DuplicateRankFailsBothClaimantsAndRankZero) {
  const int port = freePort();
  Ranks ranks(10, 3);
  ranks.start(config(port, 0, 3), "h0");
  TcpStoreClient probe("127.0.0.1", port, 10);
  // "hora/3/claims" counts registrations (see rendezvous.cpp): it fixes who claims first.
  waitForCount(probe, "hora/3/claims", 1);
  ranks.start(config(port, 1, 3), "a");
  waitForCount(probe, "hora/3/claims", 2);
  ranks.start(config(port, 1, 3), "b");
  // Rank 2 never comes: the duplicate is reported at once, not after the timeout.
  const Clock::time_point start = Clock::now();
  const auto out = ranks.join();
  EXPECT_LT(since(start), 5 * hora_test::timeScale());
  const std::string pid = std::to_string(getpid());
  expectAllFail(out, HORA_ERR_INVALID_ARGUMENT,
                "RANK=1 is claimed by two processes: host a pid " + pid + " and host b pid " + pid);
}

TEST(Rendezvous, WorldSizeDisagreement) {
  const int port = freePort();
  Ranks ranks(10, 0);
  std::vector<LaunchConfig> configs = {config(port, 0, 4), config(port, 1, 4), config(port, 2, 5),
                                       config(port, 3, 4)};
  expectAllFail(runAll(ranks, configs, {"a", "a", "a", "a"}), HORA_ERR_INVALID_ARGUMENT,
                "ranks disagree on WORLD_SIZE: ranks 0,1,3 say 4; rank 2 says 5");
}

TEST(Rendezvous, RankZeroWithTheLargerWorldSizeDoesNotWaitForTheTimeout) {
  const int port = freePort();
  Ranks ranks(10, 0);
  std::vector<LaunchConfig> configs = {config(port, 0, 5), config(port, 1, 4), config(port, 2, 4),
                                       config(port, 3, 4)};
  for (LaunchConfig &c : configs) c.launcher = "slurm";  // messages use Slurm's names
  const Clock::time_point start = Clock::now();
  expectAllFail(runAll(ranks, configs, {"a", "a", "a", "a"}), HORA_ERR_INVALID_ARGUMENT,
                "ranks disagree on SLURM_NTASKS: rank 0 says 5; ranks 1-3 say 4");
  EXPECT_LT(since(start), 5 * hora_test::timeScale());
}

TEST(Rendezvous, MissingRanksOnEveryRankPresent) {
  const int port = freePort();
  Ranks ranks(1.0, 0);
  std::vector<LaunchConfig> configs = {config(port, 0, 6), config(port, 1, 6), config(port, 2, 6),
                                       config(port, 4, 6)};
  const Clock::time_point start = Clock::now();
  const auto out = runAll(ranks, configs, {"a", "a", "b", "b"});
  EXPECT_GE(since(start), 0.9);
  EXPECT_LT(since(start), 5 * hora_test::timeScale());
  expectAllFail(out, HORA_ERR_TIMEOUT,
                "ranks 3,5 of 6 never arrived at the store at 127.0.0.1:" + std::to_string(port) +
                    " within 1 s");
}

TEST(Rendezvous, LateProcessesAfterTheVerdict) {
  const int port = freePort();
  Ranks ranks(10, 9);
  const auto out = runAll(ranks, {config(port, 0, 2), config(port, 1, 2)}, {"a", "b"});
  ASSERT_TRUE(out[0]->ok && out[1]->ok) << out[0]->message << out[1]->message;
  const std::string pid = std::to_string(getpid());
  // A second RANK=1 after the world formed fails on its own, naming the first.
  try {
    rendezvous(config(port, 1, 2), 5, 9, "late");
    ADD_FAILURE() << "a late duplicate joined";
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(e.message(), "RANK=1 is claimed by two processes: host b pid " + pid +
                               " and host late pid " + pid);
  }
  // A rank beyond rank 0's world.
  try {
    rendezvous(config(port, 2, 3), 5, 9, "extra");
    ADD_FAILURE() << "a rank beyond WORLD_SIZE joined";
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(e.message(), "ranks disagree on WORLD_SIZE: ranks 0,1 say 2; rank 2 says 3");
  }
  // A rank of a later runtime is kept out of this one's store (its server would close under
  // it) and waits for rank 0 to serve that runtime, which never happens here.
  try {
    rendezvous(config(port, 1, 2), 0.3, 10, "b");
    ADD_FAILURE() << "joined a world of another epoch";
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_TIMEOUT);
    EXPECT_NE(e.message().find("master 127.0.0.1:" + std::to_string(port) +
                               " unreachable after 0.3 s (this store serves the runtime 'hora/9/', "
                               "not 'hora/10/'"),
              std::string::npos)
        << e.message();
  }
}

TEST(Rendezvous, ASecondRuntimeOnTheSamePort) {
  const int port = freePort();
  for (uint64_t epoch = 20; epoch < 22; ++epoch) {
    Ranks ranks(10, epoch);
    const auto out = runAll(ranks, {config(port, 0, 2), config(port, 1, 2)}, {"a", "b"});
    ASSERT_TRUE(out[0]->ok && out[1]->ok) << out[0]->message << out[1]->message;
    EXPECT_EQ(out[1]->rv.prefix, "hora/" + std::to_string(epoch) + "/");
    expectTopology(out[1]->rv.topology, 1, 2, 0, 1, 1, 2);
  }
}

TEST(Rendezvous, PortInUseAndUnreachableMaster) {
  int holder = -1;
  const int port = freePort(&holder);
  try {
    rendezvous(config(port, 0, 2), 5, 0, "a");
    ADD_FAILURE() << "served on a port in use";
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_INVALID_ARGUMENT);
    EXPECT_NE(e.message().find("MASTER_PORT " + std::to_string(port)), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("is in use by pid " + std::to_string(getpid())), std::string::npos)
        << e.message();
  }
  close(holder);
  const int nobody = freePort();
  const Clock::time_point start = Clock::now();
  try {
    rendezvous(config(nobody, 1, 2), 0.4, 0, "a");
    ADD_FAILURE() << "reached a master that does not exist";
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_TIMEOUT);
    EXPECT_EQ(e.message().find("master 127.0.0.1:" + std::to_string(nobody) + " unreachable after 0.4 s"),
              0u)
        << e.message();
  }
  EXPECT_LT(since(start), 3);
}

// A world spanning hosts hands NCCL the interface its store connection used, unless the user
// chose one; loopback is never handed on.
TEST(Rendezvous, NcclSocketInterfaceIsSeededFromTheStoreRoute) {
  EXPECT_EQ(interfaceOfAddress("127.0.0.1"), "lo");
  EXPECT_EQ(interfaceOfAddress("203.0.113.77"), "") << "an address no interface holds";
  std::string name, address;  // the first IPv4 interface other than loopback, if any
  ifaddrs *all = nullptr;
  ASSERT_EQ(getifaddrs(&all), 0);
  for (ifaddrs *i = all; i != nullptr && name.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET || std::string(i->ifa_name) == "lo") continue;
    char text[INET_ADDRSTRLEN] = {0};
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in *>(i->ifa_addr)->sin_addr, text, sizeof text);
    name = i->ifa_name;
    address = text;
  }
  freeifaddrs(all);
  const char *saved = std::getenv("NCCL_SOCKET_IFNAME");
  const std::string before = saved != nullptr ? saved : "";
  unsetenv("NCCL_SOCKET_IFNAME");
  seedNcclSocketInterface("127.0.0.1");
  EXPECT_EQ(std::getenv("NCCL_SOCKET_IFNAME"), nullptr) << "loopback is not handed to NCCL";
  if (!name.empty()) {
    EXPECT_EQ(interfaceOfAddress(address), name);
    seedNcclSocketInterface(address);
    ASSERT_NE(std::getenv("NCCL_SOCKET_IFNAME"), nullptr);
    EXPECT_EQ(std::string(std::getenv("NCCL_SOCKET_IFNAME")), "=" + name);
  }
  setenv("NCCL_SOCKET_IFNAME", "ib0", 1);
  seedNcclSocketInterface(address.empty() ? "127.0.0.1" : address);
  EXPECT_EQ(std::string(std::getenv("NCCL_SOCKET_IFNAME")), "ib0") << "the user's choice stands";
  if (saved != nullptr) {
    setenv("NCCL_SOCKET_IFNAME", before.c_str(), 1);
  } else {
    unsetenv("NCCL_SOCKET_IFNAME");
  }
}

TEST(Rendezvous, BadConfigIsRejectedBeforeAnyNetworking) {
  LaunchConfig c = config(1234, 3, 3);
  try {
    rendezvous(c, 1, 0, "a");
    ADD_FAILURE();
  } catch (const Error &e) {
    EXPECT_EQ(e.message(), "RANK=3 is not below WORLD_SIZE=3");
  }
  c = config(0, 0, 1);
  EXPECT_THROW(rendezvous(c, 1, 0, "a"), Error);
}

}  // namespace
}  // namespace hora

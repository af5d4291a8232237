// SPDX-License-Identifier: Apache-2.0
// The rendezvous protocol on the store, rank 0's verdict, and topology from host names.
#include "bootstrap/env/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <sstream>

#include "base/error.h"
#include "base/knobs.h"
#include "base/logging.h"
#include "base/process.h"

namespace hora {

// Keys, all under prefix P = "<HORA_STORE_PREFIX>hora/<epoch>/" (the prefix is empty unless a
// horarun agent serves the store):
//   P claims          counter: every process adds 1 and gets its claimant number k (1, 2, ...)
//   P claimant/<k>    what claimant k said (rank, WORLD_SIZE, local variables, host, pid)
//   P arrived/<r>     set once RANK=r has registered (what ranks that time out on their own check)
//   P verdict         rank 0's judgement: an error for everyone, or the world with each topology
//   P ack/<k>         claimant k has read the verdict (rank 0 keeps an error's store up until then)
// Rank 0 reads claimants in order, waiting each time for the next claimant key to appear, so it
// sees a duplicate or a disagreeing WORLD_SIZE as soon as it arrives, without polling.
namespace {

using Clock = std::chrono::steady_clock;

// While ranks are missing, rank 0 says which after this long, and again this often.
constexpr std::chrono::seconds kFirstReport{10};
constexpr std::chrono::seconds kReportEvery{30};

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// What a rank's variables are called, for messages in the user's terms.
struct Names {
  const char *rank, *worldSize, *localRank, *localSize, *nodeRank;
};
Names namesFor(const std::string &launcher) {
  if (launcher == "slurm") {
    return {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_TASKS_PER_NODE", "SLURM_NODEID"};
  }
  return {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK"};
}

struct Claim {
  int rank = -1, worldSize = -1, localRank = -1, localSize = -1, nodeRank = -1;
  long long pid = 0;
  long long index = 0;  // claimant number
  std::string host;
};

std::string encodeClaim(const Claim &c) {
  std::ostringstream out;
  out << c.rank << ' ' << c.worldSize << ' ' << c.localRank << ' ' << c.localSize << ' '
      << c.nodeRank << ' ' << c.pid << ' ' << c.host;
  return out.str();
}

bool decodeClaim(const std::string &text, long long index, Claim *c) {
  std::istringstream in(text);
  if (!(in >> c->rank >> c->worldSize >> c->localRank >> c->localSize >> c->nodeRank >> c->pid)) {
    return false;
  }
  in.get();  // the separator; the host name is the rest (it may hold anything but a newline)
  std::getline(in, c->host);
  c->index = index;
  return c->rank >= 0 && c->worldSize >= 1;
}

// "0,1,3" with runs of three or more shortened: "0-2,5".
std::string rankList(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    if (j - i >= 2) {
      out += std::to_string(ranks[i]) + "-" + std::to_string(ranks[j]);
    } else {
      for (size_t k = i; k <= j; ++k) out += (k == i ? "" : ",") + std::to_string(ranks[k]);
    }
    i = j + 1;
  }
  return out;
}

std::string ranksWord(const std::vector<int> &ranks) {
  std::vector<int> distinct = ranks;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  return (distinct.size() == 1 ? "rank " : "ranks ") + rankList(distinct);
}

double secondsUntil(Clock::time_point deadline) {
  return std::max(0.0, std::chrono::duration<double>(deadline - Clock::now()).count());
}

std::string who(const Claim &c) { return "host " + c.host + " pid " + std::to_string(c.pid); }

// "RANK=2 is claimed by two processes: host a pid 10 and host b pid 11" (claimants in arrival order).
std::string duplicateMessage(const Names &names, int rank, std::vector<const Claim *> claims) {
  std::sort(claims.begin(), claims.end(), [](const Claim *a, const Claim *b) { return a->index < b->index; });
  std::string out = std::string(names.rank) + "=" + std::to_string(rank) + " is claimed by " +
                    (claims.size() == 2 ? std::string("two") : std::to_string(claims.size())) +
                    " processes: ";
  for (size_t i = 0; i < claims.size(); ++i) {
    out += (i == 0 ? "" : i + 1 == claims.size() ? " and " : ", ") + who(*claims[i]);
  }
  return out;
}

// "ranks disagree on WORLD_SIZE: ranks 0,1,3 say 4; rank 2 says 5", groups by their lowest rank.
std::string disagreementMessage(const Names &names, const std::vector<std::pair<int, int>> &rankSizes) {
  std::map<int, std::vector<int>> bySize;
  for (const auto &[rank, size] : rankSizes) bySize[size].push_back(rank);
  std::vector<std::pair<int, int>> order;  // lowest rank, size
  for (auto &[size, ranks] : bySize) order.push_back({*std::min_element(ranks.begin(), ranks.end()), size});
  std::sort(order.begin(), order.end());
  std::string out = std::string("ranks disagree on ") + names.worldSize + ": ";
  for (size_t i = 0; i < order.size(); ++i) {
    const std::vector<int> &ranks = bySize[order[i].second];
    const std::string word = ranksWord(ranks);
    out += (i == 0 ? "" : "; ") + word + (word.rfind("ranks", 0) == 0 ? " say " : " says ") +
           std::to_string(order[i].second);
  }
  return out;
}

std::string missingMessage(const std::vector<int> &missing, int worldSize, const std::string &store,
                           double timeoutS) {
  return ranksWord(missing) + " of " + std::to_string(worldSize) + " never arrived at the store at " +
         store + " within " + detail::concat(timeoutS) + " s";
}

struct Verdict {
  hora_status_t status = HORA_SUCCESS;
  std::string message;
  // On success, per rank:
  std::vector<Claim> claims;
  std::vector<Topology> topologies;
};

std::string encodeVerdict(const Verdict &v) {
  std::ostringstream out;
  if (v.status != HORA_SUCCESS) {
    out << "error " << static_cast<int>(v.status) << '\n' << v.message;
    return out.str();
  }
  out << "ok " << v.claims.size() << '\n';
  for (size_t r = 0; r < v.claims.size(); ++r) {
    const Claim &c = v.claims[r];
    const Topology &t = v.topologies[r];
    out << c.index << ' ' << c.pid << ' ' << t.localRank << ' ' << t.localSize << ' ' << t.crossRank
        << ' ' << t.crossSize << ' ' << c.host << '\n';
  }
  return out.str();
}

Verdict decodeVerdict(const std::string &text) {
  Verdict v;
  std::istringstream in(text);
  std::string kind;
  in >> kind;
  if (kind == "error") {
    int status = 0;
    in >> status;
    in.get();
    v.status = static_cast<hora_status_t>(status);
    std::getline(in, v.message, '\0');
    return v;
  }
  size_t n = 0;
  HORA_ENFORCE(kind == "ok" && (in >> n), "malformed rendezvous verdict");
  for (size_t r = 0; r < n; ++r) {
    Claim c;
    Topology t;
    HORA_ENFORCE(in >> c.index >> c.pid >> t.localRank >> t.localSize >> t.crossRank >> t.crossSize,
                 "malformed rendezvous verdict line ", r);
    in.get();
    std::getline(in, c.host);
    c.rank = t.rank = static_cast<int>(r);
    c.worldSize = t.size = static_cast<int>(n);
    v.claims.push_back(c);
    v.topologies.push_back(t);
  }
  return v;
}

Verdict failure(hora_status_t status, std::string message) {
  Verdict v;
  v.status = status;
  v.message = std::move(message);
  return v;
}

// Topology of every rank from what each said (claims[r] is RANK=r). Given local variables must be
// given by all ranks or none; nodes are NODE_RANK values when given, else host names.
Verdict topologyVerdict(const Names &names, const std::vector<Claim> &claims) {
  const int n = static_cast<int>(claims.size());
  struct Field {
    const char *name;
    int Claim::*member;
  };
  const Field fields[] = {{names.localRank, &Claim::localRank},
                          {names.localSize, &Claim::localSize},
                          {names.nodeRank, &Claim::nodeRank}};
  bool given[3] = {false, false, false};
  for (int f = 0; f < 3; ++f) {
    std::vector<int> set, unset;
    for (const Claim &c : claims) (c.*fields[f].member >= 0 ? set : unset).push_back(c.rank);
    if (!set.empty() && !unset.empty()) {
      return failure(HORA_ERR_INVALID_ARGUMENT, std::string(fields[f].name) + " is set on " +
                                                    ranksWord(set) + " but not on " + ranksWord(unset));
    }
    given[f] = unset.empty();
  }
  const bool localGiven = given[0], sizeGiven = given[1], nodeGiven = given[2];

  // Nodes in order: by NODE_RANK when given, else by each host's lowest rank.
  std::vector<std::string> nodeNames;
  std::vector<std::vector<int>> nodes;
  std::vector<int> nodeOf(static_cast<size_t>(n));
  {
    std::map<std::string, int> index;
    std::vector<int> order(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) order[static_cast<size_t>(r)] = r;
    if (nodeGiven) {
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
        return claims[static_cast<size_t>(a)].nodeRank < claims[static_cast<size_t>(b)].nodeRank;
      });
    }
    for (int r : order) {
      const Claim &c = claims[static_cast<size_t>(r)];
      const std::string key = nodeGiven ? std::string("node ") + std::to_string(c.nodeRank) : "host " + c.host;
      auto it = index.find(key);
      if (it == index.end()) {
        it = index.emplace(key, static_cast<int>(nodes.size())).first;
        nodeNames.push_back(key);
        nodes.emplace_back();
      }
      nodes[static_cast<size_t>(it->second)].push_back(r);
      nodeOf[static_cast<size_t>(r)] = it->second;
    }
    for (auto &ranks : nodes) std::sort(ranks.begin(), ranks.end());
  }

  std::vector<Topology> topo(static_cast<size_t>(n));
  for (size_t g = 0; g < nodes.size(); ++g) {
    const std::vector<int> &ranks = nodes[g];
    const int size = static_cast<int>(ranks.size());
    const std::string has = nodeNames[g] + " has " + std::to_string(size) +
                            (size == 1 ? " rank (" : " ranks (") + rankList(ranks) + ")";
    std::map<int, int> seen;  // local rank -> rank
    for (size_t i = 0; i < ranks.size(); ++i) {
      const int r = ranks[i];
      const Claim &c = claims[static_cast<size_t>(r)];
      Topology &t = topo[static_cast<size_t>(r)];
      t.rank = r;
      t.size = n;
      t.localSize = size;
      t.localRank = localGiven ? c.localRank : static_cast<int>(i);
      if (sizeGiven && c.localSize != size) {
        return failure(HORA_ERR_INVALID_ARGUMENT, std::string(names.localSize) + "=" +
                                                      std::to_string(c.localSize) + " on rank " +
                                                      std::to_string(r) + ", but " + has);
      }
      if (localGiven) {
        if (c.localRank >= size) {
          return failure(HORA_ERR_INVALID_ARGUMENT, std::string(names.localRank) + "=" +
                                                        std::to_string(c.localRank) + " on rank " +
                                                        std::to_string(r) + ", but " + has);
        }
        auto [it, fresh] = seen.emplace(c.localRank, r);
        if (!fresh) {
          return failure(HORA_ERR_INVALID_ARGUMENT,
                         std::string(names.localRank) + "=" + std::to_string(c.localRank) +
                             " is given to ranks " + std::to_string(it->second) + " and " +
                             std::to_string(r) + ", both on " + nodeNames[g]);
        }
      }
    }
  }
  // Cross ranks: among the nodes (in node order) that have a rank of this local rank.
  std::map<int, int> crossCount;
  for (size_t g = 0; g < nodes.size(); ++g) {
    for (int r : nodes[g]) {
      Topology &t = topo[static_cast<size_t>(r)];
      t.crossRank = crossCount[t.localRank]++;
    }
  }
  for (Topology &t : topo) t.crossSize = crossCount[t.localRank];

  Verdict v;
  v.claims = claims;
  v.topologies = std::move(topo);
  return v;
}

// Rank 0: reads claimants as they come until the world can be judged, then judges.
Verdict judge(TcpStoreClient &store, const std::string &p, const LaunchConfig &config,
              Clock::time_point deadline, double timeoutS, const std::string &storeName) {
  const Names names = namesFor(config.launcher);
  const int n = config.worldSize;
  std::vector<Claim> claimants;  // claimants[k - 1]
  auto fetch = [&](long long k, Clock::time_point until) -> bool {
    const std::string key = p + "claimant/" + std::to_string(k);
    try {
      store.wait({key}, secondsUntil(until));
    } catch (const Error &e) {
      if (e.status() == HORA_ERR_TIMEOUT) return false;
      throw;
    }
    Claim c;
    if (!decodeClaim(store.get(key), k, &c)) {
      HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "malformed registration '", key,
                 "' in the store at ", storeName, ": is another program using this port?");
    }
    claimants.push_back(c);
    return true;
  };

  // Decides on what has arrived; `final` = nothing more is coming (deadline) or all are here.
  auto decide = [&](bool final) -> std::pair<bool, Verdict> {
    std::map<int, std::vector<const Claim *>> byRank;
    int minSize = n;
    for (const Claim &c : claimants) {
      byRank[c.rank].push_back(&c);
      minSize = std::min(minSize, c.worldSize);
    }
    std::string duplicates;
    for (const auto &[rank, claims] : byRank) {
      if (claims.size() > 1) {
        duplicates += (duplicates.empty() ? "" : "; ") + duplicateMessage(names, rank, claims);
      }
    }
    if (!duplicates.empty()) return {true, failure(HORA_ERR_INVALID_ARGUMENT, duplicates)};
    std::vector<int> missing;
    for (int r = 0; r < n; ++r) {
      if (byRank.count(r) == 0) missing.push_back(r);
    }
    bool disagree = false;
    for (const Claim &c : claimants) disagree = disagree || c.worldSize != n;
    // With sizes in dispute, judge once the ranks below the smallest claimed size are here, so
    // that the message lists every rank that could be expected.
    bool ready = final || missing.empty();
    if (disagree && !ready) ready = missing.empty() || missing.front() >= minSize;
    if (!ready) return {false, Verdict()};
    if (disagree) {
      std::vector<std::pair<int, int>> sizes;
      for (const Claim &c : claimants) sizes.push_back({c.rank, c.worldSize});
      return {true, failure(HORA_ERR_INVALID_ARGUMENT, disagreementMessage(names, sizes))};
    }
    if (!missing.empty()) {
      return {true, failure(HORA_ERR_TIMEOUT, missingMessage(missing, n, storeName, timeoutS))};
    }
    std::vector<Claim> byRankClaims;
    for (int r = 0; r < n; ++r) byRankClaims.push_back(*byRank[r][0]);
    return {true, topologyVerdict(names, byRankClaims)};
  };

  const Clock::time_point started = Clock::now();
  Clock::time_point nextReport = started + kFirstReport;
  for (;;) {
    if (decide(false).first) {
      // Before saying yes, take in every claimant counted so far: a duplicate RANK or a rank
      // beyond WORLD_SIZE that registered while we read must not slip through.
      const long long total = store.add(p + "claims", 0);
      const Clock::time_point soon = std::min(deadline, Clock::now() + std::chrono::seconds(2));
      while (static_cast<long long>(claimants.size()) < total && fetch(static_cast<long long>(claimants.size()) + 1, soon)) {
      }
      return decide(true).second;
    }
    // Silence while a job forms looks like a hang: every so often, say who is still missing.
    const Clock::time_point until = std::min(deadline, nextReport);
    if (fetch(static_cast<long long>(claimants.size()) + 1, until)) continue;
    if (until == deadline) return decide(true).second;
    std::vector<int> missing;
    for (int r = 0; r < n; ++r) {
      if (std::none_of(claimants.begin(), claimants.end(), [r](const Claim &c) { return c.rank == r; })) {
        missing.push_back(r);
      }
    }
    HORA_LOG(kWarning) << "rendezvous: " << (n - static_cast<int>(missing.size())) << " of " << n
                       << " ranks are here after " << static_cast<long>(since(started)) << " s; waiting for "
                       << ranksWord(missing) << " (the store is at " << storeName << "; HORA_TIMEOUT_S="
                       << timeoutS << ")";
    nextReport = Clock::now() + kReportEvery;
  }
}

// A rank whose wait for the verdict ran out: find the absent ranks itself.
[[noreturn]] void ownTimeout(TcpStoreClient &store, const std::string &p, const LaunchConfig &config,
                             const std::string &storeName, double timeoutS, const Error &original) {
  std::vector<int> missing;
  try {
    for (int r = 0; r < config.worldSize; ++r) {
      if (!store.check({p + "arrived/" + std::to_string(r)})) missing.push_back(r);
    }
  } catch (const Error &) {
    throw original;
  }
  if (!missing.empty()) {
    HORA_THROW(HORA_ERR_TIMEOUT, missingMessage(missing, config.worldSize, storeName, timeoutS));
  }
  HORA_THROW(HORA_ERR_TIMEOUT, "every rank arrived at the store at ", storeName,
             " but rank 0 gave no verdict within ", timeoutS, " s; is rank 0 stuck?");
}

}  // namespace

StoreSecurity storeSecurityFromEnvironment() {
  const Knobs knobs = Knobs::fromEnvironment();
  return {knobs.jobToken, knobs.storeBind};
}

std::pair<std::string, bool> storeBindHost(const std::string &masterAddr, const std::string &bind) {
  if (!bind.empty()) {
    if (bind == "*" || bind == "0.0.0.0" || bind == "::" || bind == "[::]") return {"", false};
    return {bind, false};
  }
  std::string host = masterAddr;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  in6_addr v6{};
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1 || inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    return {host, true};
  }
  if (host == "localhost" || host == "ip6-localhost" || host == "localhost.localdomain") return {host, true};
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo *found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return {"", false};
  bool loopback = false;
  for (addrinfo *a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      const uint32_t ip = ntohl(reinterpret_cast<sockaddr_in *>(a->ai_addr)->sin_addr.s_addr);
      loopback = loopback || (ip >> 24) == 127;
    } else if (a->ai_family == AF_INET6) {
      loopback = loopback || IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<sockaddr_in6 *>(a->ai_addr)->sin6_addr);
    }
  }
  freeaddrinfo(found);
  if (loopback) return {"", false};
  return {host, true};
}

// Rank 0's server for this runtime, shared with any rendezvous of the same runtime in this
// process (threads in tests). It lives as long as the runtime that formed it: hora_shutdown
// closes it, and with it every key. A peer that re-initialises faster than rank 0 and reaches
// the old server is told that it serves another session (the key prefix) and retries until
// rank 0's next runtime serves the port.
static std::shared_ptr<TcpStoreServer> storeServerFor(const LaunchConfig &config, double timeoutS,
                                                      const std::string &session,
                                                      const StoreSecurity &security) {
  static std::mutex mutex;  // guards servers
  static std::map<int, std::weak_ptr<TcpStoreServer>> servers;
  std::lock_guard<std::mutex> lock(mutex);
  std::weak_ptr<TcpStoreServer> &slot = servers[config.masterPort];
  if (auto live = slot.lock()) return live;
  StoreServerOptions options;
  options.token = security.token;
  options.session = session;
  // Each rank holds one connection, and a few for process sets and retries; strangers beyond
  // this are turned away at once.
  options.maxConnections = 4 * static_cast<size_t>(config.worldSize) + 64;
  options.idleTimeoutS = std::min(10.0, std::max(1.0, timeoutS));
  const auto [host, anyIfNotLocal] = storeBindHost(config.masterAddr, security.bind);
  options.anyIfNotLocal = anyIfNotLocal;
  auto server = std::make_shared<TcpStoreServer>(host, config.masterPort, options);
  slot = server;
  return server;
}

Rendezvous rendezvous(const LaunchConfig &config, double timeoutS, uint64_t epoch,
                      const std::string &hostname) {
  return rendezvous(config, timeoutS, epoch, hostname, storeSecurityFromEnvironment());
}

Rendezvous rendezvous(const LaunchConfig &config, double timeoutS, uint64_t epoch,
                      const std::string &hostname, const StoreSecurity &security) {
  const Names names = namesFor(config.launcher);
  if (config.worldSize < 1 || config.rank < 0 || config.rank >= config.worldSize) {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, names.rank, "=", config.rank, " is not below ",
               names.worldSize, "=", config.worldSize);
  }
  if (config.masterPort < 1 || config.masterPort > 65535) {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "MASTER_PORT=", config.masterPort, " is outside 1..65535");
  }
  const Clock::time_point deadline =
      Clock::now() + std::chrono::microseconds(static_cast<int64_t>(std::min(std::max(timeoutS, 0.0), 1e8) * 1e6));
  const std::string storeName = formatHostPort(config.masterAddr, config.masterPort);

  Rendezvous rv;
  rv.prefix = config.storePrefix + "hora/" + std::to_string(epoch) + "/";
  const std::string &p = rv.prefix;
  // Under a horarun agent the agents serve the store, and it outlives this runtime.
  if (config.rank == 0 && !config.agentStore) rv.server = storeServerFor(config, timeoutS, p, security);
  rv.store = std::make_shared<TcpStoreClient>(config.masterAddr, config.masterPort, timeoutS,
                                              StoreClientOptions{security.token, p});
  if (!config.abandonKey.empty()) rv.store->setAbandonKey(config.abandonKey);
  TcpStoreClient &store = *rv.store;

  Claim me;
  me.rank = config.rank;
  me.worldSize = config.worldSize;
  me.localRank = config.localRank;
  me.localSize = config.localWorldSize;
  me.nodeRank = config.nodeRank;
  me.pid = static_cast<long long>(getpid());
  me.host = hostname.empty() ? hostNameOr("unknown-host") : hostname;
  // Newlines would break the line-based records; no real host name has one.
  std::replace(me.host.begin(), me.host.end(), '\n', ' ');
  me.index = store.add(p + "claims", 1);
  store.set(p + "claimant/" + std::to_string(me.index), encodeClaim(me));
  store.set(p + "arrived/" + std::to_string(me.rank), "");

  Verdict verdict;
  if (config.rank == 0) {
    verdict = judge(store, p, config, deadline, timeoutS, storeName);
    store.set(p + "verdict", encodeVerdict(verdict));
  } else {
    try {
      // Slack past our own deadline: rank 0 started its clock at about the same time and
      // answers for everyone when it times out, so prefer its verdict to our own guess.
      store.wait({p + "verdict"}, secondsUntil(deadline) + 1.0);
    } catch (const Error &e) {
      if (e.status() != HORA_ERR_TIMEOUT) throw;
      try {
        store.set(p + "ack/" + std::to_string(me.index), "");
      } catch (const Error &) {
      }
      ownTimeout(store, p, config, storeName, timeoutS, e);
    }
    verdict = decodeVerdict(store.get(p + "verdict"));
  }
  store.set(p + "ack/" + std::to_string(me.index), "");

  if (verdict.status != HORA_SUCCESS) {
    if (config.rank == 0) {
      // Let every claimant read the verdict before this rank fails, briefly: whoever owns the
      // server next may close it, and the others should fail with the reason, not a lost
      // connection.
      std::vector<std::string> acks;
      const long long total = store.add(p + "claims", 0);
      for (long long k = 1; k <= total; ++k) acks.push_back(p + "ack/" + std::to_string(k));
      try {
        store.wait(acks, std::min(2.0, std::max(timeoutS, 0.1)));
      } catch (const Error &) {
      }
    }
    throw Error(verdict.status, verdict.message, __FILE__, __LINE__);
  }

  // Rank 0 judged without us only if we registered after its verdict: check we are the process
  // it counted, and that we agree with its world.
  const int n = static_cast<int>(verdict.claims.size());
  if (me.rank < n && verdict.claims[static_cast<size_t>(me.rank)].index != me.index) {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT,
               duplicateMessage(names, me.rank, {&verdict.claims[static_cast<size_t>(me.rank)], &me}));
  }
  if (me.worldSize != n) {
    std::vector<std::pair<int, int>> sizes;
    for (int r = 0; r < n; ++r) sizes.push_back({r, n});
    sizes.push_back({me.rank, me.worldSize});
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, disagreementMessage(names, sizes));
  }

  rv.topology = verdict.topologies[static_cast<size_t>(me.rank)];
  for (const Claim &c : verdict.claims) rv.hosts.push_back(c.host);
  HORA_LOG(kDebug) << "rendezvous done: launcher " << config.launcher << ", rank " << rv.topology.rank << " (local "
                  << rv.topology.localRank << ") of " << rv.topology.size << ", store " << storeName;
  rv.address = storeName;
  return rv;
}

}  // namespace hora

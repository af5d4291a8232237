// SPDX-License-Identifier: Apache-2.0
// Joining the agents' next world, and asking whether they are forming one (elastic.h).
#include "bootstrap/env/elastic.h"

#include <chrono>
#include <mutex>
#include <sstream>

#include "base/error.h"
#include "base/logging.h"

namespace hora {
namespace {

using Clock = std::chrono::steady_clock;

std::string worldPrefix(const std::string &prefix, uint64_t world) {
  return prefix + "w" + std::to_string(world) + "/";
}

double secondsLeft(Clock::time_point deadline) {
  return std::chrono::duration<double>(deadline - Clock::now()).count();
}

// The one elastic world of this process, and a connection of its own for the checks (the
// world's connection may be held by a group's wait).
struct Current {
  std::mutex mutex;  // guards the fields below
  std::weak_ptr<TcpStoreClient> world;
  std::shared_ptr<TcpStoreClient> own;
  std::string key;
};
Current &current() {
  static Current c;
  return c;
}

}  // namespace

std::string elasticUpdateKey(const std::string &prefix, uint64_t world) {
  return worldPrefix(prefix, world) + "update";
}

ElasticPlace joinElasticWorld(TcpStoreClient &store, const std::string &prefix, const std::string &id,
                              double timeoutS) {
  const Clock::time_point deadline =
      Clock::now() + std::chrono::microseconds(static_cast<int64_t>(std::min(std::max(timeoutS, 0.1), 1e8) * 1e6));
  uint64_t world = std::stoull(store.get(prefix + "w/open"));
  for (;;) {
    const std::string p = worldPrefix(prefix, world);
    const int64_t k = store.add(p + "n", 1);
    store.set(p + "reg/" + std::to_string(k), id);
    HORA_LOG(kDebug) << "elastic: " << id << " asks to be in world " << world;
    const double left = secondsLeft(deadline);
    if (left <= 0) break;
    std::string answer;
    try {
      store.wait({p + "world"}, left);
      answer = store.get(p + "world");
    } catch (const Error &e) {
      if (e.status() != HORA_ERR_TIMEOUT) throw;
      break;
    }
    std::istringstream in(answer);
    std::string head;
    std::getline(in, head);
    if (head.rfind("error", 0) == 0) {
      int status = HORA_ERR_TIMEOUT;
      std::istringstream(head.substr(5)) >> status;
      std::string why((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      throw Error(static_cast<hora_status_t>(status), "horarun's agents: " + why, __FILE__, __LINE__);
    }
    ElasticPlace place;
    place.world = world;
    std::string member;
    for (int r = 0; std::getline(in, member); ++r) {
      if (member == id) place.rank = r;
      place.size = r + 1;
    }
    if (place.rank >= 0) return place;
    // Asked after the agents closed world g: they count us for the next one.
    ++world;
  }
  HORA_THROW(HORA_ERR_TIMEOUT, "elastic worker ", id, ": horarun's agents formed no world with it within ",
             timeoutS, " s (HORA_TIMEOUT_S); are the agents running?");
}

void enterElasticWorld(const std::shared_ptr<TcpStoreClient> &store, const std::string &updateKey) {
  Current &c = current();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.world = store;
  c.own = store;  // a connection nothing else waits on: the checks use it as it is
  c.key = updateKey;
}

void leaveElasticWorld(const std::string &updateKey) {
  Current &c = current();
  std::lock_guard<std::mutex> lock(c.mutex);
  if (c.key != updateKey) return;  // already in a later world
  c.world.reset();
  c.own.reset();
  c.key.clear();
}

bool takeElasticFormationAbandoned() { return TcpStoreClient::takeAbandoned(); }

int elasticWorldChanged() {
  Current &c = current();
  std::lock_guard<std::mutex> lock(c.mutex);
  if (c.key.empty()) return 0;
  if (!c.own) {
    std::shared_ptr<TcpStoreClient> world = c.world.lock();
    if (!world) return 0;
    c.own = world->reconnect();
  }
  return c.own->check({c.key}) ? 1 : 0;
}

}  // namespace hora

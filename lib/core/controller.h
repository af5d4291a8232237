// SPDX-License-Identifier: Apache-2.0
// Negotiation for one process set: which requests are ready on every rank, checked for
// agreement, in one order that every rank then executes.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/control_plane.h"
#include "core/request.h"
#include "core/response_cache.h"

namespace hora {

// Requests of one set that this rank submitted and that have not completed, by name.
// A rank's requests under negotiation, by name: each key views its own request's name (the
// entry goes before the request does).
using PendingMap = std::unordered_map<std::string_view, RequestPtr>;

// One negotiation round ("cycle"), collective over the set:
//  1. every rank classifies its pending requests against the response cache and contributes one
//     bit vector: [flags | cache hits | cache entries to drop], combined with a bitwise AND (the
//     flag and drop words are inverted so that AND computes OR for them);
//  2. cache entries whose bit is set on every rank are ready everywhere and need no coordinator;
//  3. only if some rank has requests the cache could not place (or entries were dropped), ranks
//     send those to rank 0 (the coordinator), which matches them by name across ranks, checks
//     agreement, and broadcasts the responses of the names now submitted everywhere.
// The result is the same list on every rank: cached responses in slot order, then new ones.
// The set's cycles only (one thread at a time: SetEngine's cycle lock).
// Stalls (rank 0, the coordinator, sees them): a name that some ranks submitted and others did
// not is reported after `warningS` (HORA_STALL_WARNING_S), again every `warningS`, and at once
// after a SIGUSR1 (stallReportRequests() changes); one log line and one JSON line per name. With
// `shutdownS` > 0 (HORA_STALL_SHUTDOWN_S) such a name fails with HORA_ERR_TIMEOUT on every rank
// that submitted it. 0 turns either off.
struct StallPolicy {
  double warningS = 0;
  double shutdownS = 0;
  int32_t processSet = 0;  // named in the reports
};

// Bumped by the SIGUSR1 handler that Engine installs: every coordinator reports its stalls.
std::atomic<uint32_t> &stallReportRequests();

class Controller {
 public:
  Controller(ControlPlane &plane, int cacheCapacity, StallPolicy stall = {});

  struct Outcome {
    // Shared with the response cache (a hit is not copied); in the order every rank runs them.
    std::vector<std::shared_ptr<const Response>> responses;
    bool shutdown = false;       // some rank asked to shut down: stop without executing
    bool deviceAgreed = false;   // every rank offered to launch device work now (deviceOffer)
    int coordinatorRounds = 0;   // 0 or 1: whether this cycle needed the coordinator
  };
  // `deviceOffer`: this rank holds its GPU's turn for this set (DeviceTurn), carried in the
  // cycle's AND at no cost: Outcome::deviceAgreed says whether every rank did.
  Outcome negotiate(const PendingMap &pending, bool requestShutdown, bool deviceOffer = false);

  const ResponseCache &cache() const { return cache_; }
  // Coordinator side, for tests and stall reports: names waiting for some ranks.
  size_t coordinatorBacklog() const { return table_.size(); }

 private:
  using Clock = std::chrono::steady_clock;
  struct TableEntry {
    std::vector<std::optional<RequestMsg>> perRank;
    uint64_t arrival = 0;  // order in which names first reached the coordinator
    Clock::time_point firstSeen;
    Clock::time_point lastReport;  // of this name as stalled; epoch: never
  };
  std::vector<Response> coordinate(const std::vector<std::string> &blobs);
  bool ready(const TableEntry &entry) const;
  // Rank 0, every cycle: logs the stalled names that are due, and returns whether some name has
  // reached HORA_STALL_SHUTDOWN_S (the cycle then needs a coordinator round to fail it).
  bool inspectStalls();
  // Rank 0, in a coordinator round: the responses failing every name past HORA_STALL_SHUTDOWN_S.
  std::vector<Response> expireStalls();

  ControlPlane &plane_;
  ResponseCache cache_;
  // Rank 0 only: requests by name until every rank (that has not joined) has sent its own, and
  // the ranks that have joined, with the last one to do so.
  std::unordered_map<std::string, TableEntry> table_;
  uint64_t arrivals_ = 0;
  std::vector<bool> joinedRanks_;
  int lastJoined_ = -1;
  StallPolicy stall_;
  Clock::time_point lastStallScan_;
  uint32_t reportRequestsSeen_ = 0;
  std::string lastCompleted_;  // the last name every rank executed (the same on every rank)
  // How long a pending request may wait as a cache hit before its cache entry is dropped, so
  // that it goes through the coordinator, where a stall can be seen and named.
  static constexpr std::chrono::seconds kHitPatience{1};
};

// The coordinator's agreement check, exposed for unit tests: the response for one name, given
// each rank's RequestMsg (nullptr for ranks that have joined and send nothing).
Response checkAgreement(const std::vector<const RequestMsg *> &perRank);
Response checkAgreement(const std::vector<RequestMsg> &perRank);

// Whether a response may be reused from the cache: ops that repeat step after step, and not
// while some rank has joined (the response then depends on who has).
bool cacheable(const Response &response);

}  // namespace hora

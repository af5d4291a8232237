// SPDX-License-Identifier: Apache-2.0
// Controller: cache bit vector, coordinator matching and the agreement check.
#include "core/controller.h"

#include <algorithm>
#include <functional>
#include <sstream>

#include "base/error.h"
#include "base/json.h"
#include "base/logging.h"
#include "core/op_table.h"

namespace hora {
namespace {

constexpr uint64_t kFlagNothingNew = 1u << 0;  // inverted: cleared by a rank with new requests
constexpr uint64_t kFlagNoShutdown = 1u << 1;  // inverted: cleared by a rank shutting down
constexpr uint64_t kFlagNobodyJoined = 1u << 2;  // inverted: cleared by a rank in hora_join
constexpr uint64_t kFlagDeviceOffer = 1u << 3;   // cleared by a rank not offering its GPU's turn

size_t wordsFor(int bits) { return (static_cast<size_t>(bits) + 63) / 64; }
void setBit(std::vector<uint64_t> &w, size_t base, int bit) {
  w[base + static_cast<size_t>(bit) / 64] |= uint64_t{1} << (bit % 64);
}
void clearBit(std::vector<uint64_t> &w, size_t base, int bit) {
  w[base + static_cast<size_t>(bit) / 64] &= ~(uint64_t{1} << (bit % 64));
}
// fn(bit) for each bit below `bits` of the nwords words at `base` that is set (or clear), in
// ascending order.
template <typename Fn>
void forEachBit(const std::vector<uint64_t> &w, size_t base, size_t nwords, int bits, bool set, Fn &&fn) {
  for (size_t i = 0; i < nwords; ++i) {
    uint64_t word = set ? w[base + i] : ~w[base + i];
    while (word != 0) {
      const int bit = static_cast<int>(i * 64) + __builtin_ctzll(word);
      if (bit >= bits) return;
      fn(bit);
      word &= word - 1;
    }
  }
}

// "0-2,5,7": ranks in ascending order with runs collapsed.
std::string rankList(const std::vector<int> &ranks) {
  std::ostringstream s;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    s << (i ? "," : "") << ranks[i];
    if (j > i + 1) s << '-' << ranks[j];
    else if (j == i + 1) s << ',' << ranks[j];
    i = j + 1;
  }
  return s.str();
}

std::string fmtDouble(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// If ranks disagree on `field` (rendered by `show`), the message naming which ranks sent what.
// Ranks without a request (joined) are left out.
std::optional<std::string> disagreement(const std::vector<const RequestMsg *> &perRank,
                                        const RequestMsg &first, const char *field,
                                        const std::function<std::string(const RequestMsg &)> &show) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (size_t r = 0; r < perRank.size(); ++r) {
    if (perRank[r] == nullptr) continue;
    const std::string v = show(*perRank[r]);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto &g) { return g.first == v; });
    if (it == groups.end()) groups.push_back({v, {static_cast<int>(r)}});
    else it->second.push_back(static_cast<int>(r));
  }
  if (groups.size() <= 1) return std::nullopt;
  std::ostringstream s;
  s << opTypeName(first.op) << " '" << first.name << "': ranks disagree on " << field << ": ";
  for (size_t g = 0; g < groups.size(); ++g) {
    s << (g ? "; " : "") << (groups[g].second.size() == 1 ? "rank " : "ranks ")
      << rankList(groups[g].second) << ' ' << groups[g].first;
  }
  return s.str();
}

std::string splitsString(const std::vector<int64_t> &v) { return shapeString(v); }

std::string jsonRanks(const std::vector<int> &ranks) {
  std::string out = "[";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? "," : "") + std::to_string(ranks[i]);
  return out + "]";
}

}  // namespace

std::atomic<uint32_t> &stallReportRequests() {
  static std::atomic<uint32_t> requests{0};
  return requests;
}

bool cacheable(const Response &response) {
  if (!response.ok() || !response.joined.empty() || response.agreed.isTombstone()) return false;
  return opSpec(response.agreed.op).cacheable;
}

Response checkAgreement(const std::vector<RequestMsg> &perRank) {
  std::vector<const RequestMsg *> ptrs;
  for (const RequestMsg &m : perRank) ptrs.push_back(&m);
  return checkAgreement(ptrs);
}

Response checkAgreement(const std::vector<const RequestMsg *> &perRank) {
  const RequestMsg *firstPtr = nullptr;
  for (const RequestMsg *m : perRank) {
    if (m != nullptr) {
      firstPtr = m;
      break;
    }
  }
  HORA_ENFORCE(firstPtr != nullptr, "agreement check over no requests");
  const RequestMsg &first = *firstPtr;
  Response resp;
  resp.agreed = first;
  const int size = static_cast<int>(perRank.size());
  for (int r = 0; r < size; ++r) {
    if (perRank[static_cast<size_t>(r)] == nullptr) resp.joined.push_back(r);
  }
  const OpSpec &spec = opSpec(first.op);
  auto fail = [&](hora_status_t status, std::string message) {
    resp.status = status;
    resp.error = std::move(message);
    return resp;
  };
  // Tombstones: a rank refused the op before submitting it. That decides, whatever the others
  // sent: a tombstone has no parameters to compare, and the op cannot run without that rank.
  std::vector<int> rejecting;
  const RequestMsg *submitted = nullptr;  // the first real request: the op the others called
  for (int r = 0; r < size; ++r) {
    const RequestMsg *m = perRank[static_cast<size_t>(r)];
    if (m == nullptr) continue;
    if (m->isTombstone()) rejecting.push_back(r);
    else if (submitted == nullptr) submitted = m;
  }
  if (!rejecting.empty()) {
    const RequestMsg &named = submitted != nullptr ? *submitted : first;
    resp.agreed = named;
    std::ostringstream why;
    why << opTypeName(named.op) << " '" << named.name << "': "
        << (rejecting.size() == 1 ? "rank " : "ranks ") << rankList(rejecting)
        << " rejected it before submitting: ";
    for (size_t i = 0; i < rejecting.size(); ++i) {
      const RequestMsg &m = *perRank[static_cast<size_t>(rejecting[i])];
      if (rejecting.size() > 1) why << (i ? "; " : "") << "rank " << rejecting[i] << ": ";
      if (m.op != named.op) why << "(its " << opTypeName(m.op) << " of that name) ";
      why << m.rejected;
    }
    return fail(HORA_ERR_MISMATCH, why.str());
  }
  using Show = std::function<std::string(const RequestMsg &)>;
  std::vector<std::pair<const char *, Show>> fields = {
      {"op", [](const RequestMsg &m) { return std::string(opTypeName(m.op)); }},
      {"dtype", [](const RequestMsg &m) { return std::string(dtypeName(m.dtype)); }},
      {"device type",
       [](const RequestMsg &m) { return std::string(m.device.isCpu() ? "cpu" : "cuda"); }},
      {"number of tensors", [](const RequestMsg &m) { return std::to_string(m.shapes.size()); }},
  };
  if (spec.reduces) {
    fields.push_back({"reduce op", [](const RequestMsg &m) { return std::string(reduceOpName(m.reduceOp)); }});
    fields.push_back({"prescale", [](const RequestMsg &m) { return fmtDouble(m.prescale); }});
    fields.push_back({"postscale", [](const RequestMsg &m) { return fmtDouble(m.postscale); }});
  }
  if (spec.rooted) {
    fields.push_back({"root", [](const RequestMsg &m) { return std::to_string(m.root); }});
  }
  if (spec.agreedSplits != nullptr) {
    fields.push_back({spec.agreedSplits, [](const RequestMsg &m) { return splitsString(m.splits); }});
  }
  for (const auto &f : fields) {
    if (auto msg = disagreement(perRank, first, f.first, f.second)) {
      return fail(HORA_ERR_MISMATCH, *msg);
    }
  }
  // Shapes: allgather and alltoall may differ in the first dimension only.
  const bool firstDimFree = spec.firstDimFree;
  const size_t ntensors = first.shapes.size();
  for (size_t t = 0; t < ntensors; ++t) {
    const std::string suffix = ntensors == 1 ? "" : " of tensor " + std::to_string(t);
    const std::string field =
        (firstDimFree ? "rank or trailing dimensions" : "shape") + suffix;
    auto msg = disagreement(perRank, first, field.c_str(), [&](const RequestMsg &m) {
      const Shape &s = m.shapes[t];
      if (!firstDimFree || s.empty()) return shapeString(s);
      std::string text = "[*";  // the first dimension is each rank's own
      for (size_t d = 1; d < s.size(); ++d) text += "," + std::to_string(s[d]);
      return text + "]";
    });
    if (msg) return fail(HORA_ERR_MISMATCH, *msg);
  }
  // Horovod's join (HORA_JOIN_ALLREDUCE_ONLY on any rank that sent the op: the ranks are to set
  // the same mode, and the stricter one wins if they do not): only allreduce runs while a rank
  // of the set has joined.
  if (spec.refusedWhileJoined && !resp.joined.empty() &&
      std::any_of(perRank.begin(), perRank.end(), [](const RequestMsg *m) {
        return m != nullptr && m->joinMode == HORA_JOIN_ALLREDUCE_ONLY;
      })) {
    const std::vector<int> joined(resp.joined.begin(), resp.joined.end());
    return fail(HORA_ERR_UNSUPPORTED,
                detail::concat(spec.name, " '", first.name, "': ",
                               joined.size() == 1 ? "rank " : "ranks ", rankList(joined),
                               joined.size() == 1 ? " has" : " have",
                               " joined (hora_join); under Horovod's join semantics only "
                               "allreduce runs while a rank has joined (join mode "
                               "HORA_JOIN_ALLREDUCE_ONLY, hora_set_join_mode)"));
  }
  if (spec.rooted && first.root >= 0 && first.root < size &&
      perRank[static_cast<size_t>(first.root)] == nullptr) {
    return fail(HORA_ERR_INVALID_ARGUMENT,
                detail::concat(spec.name, " '", first.name, "': root rank ", first.root,
                               " has joined (hora_join) and has no data to send"));
  }
  if (spec.firstDims == OpSpec::FirstDims::kRows) {
    resp.firstDims.reserve(ntensors * perRank.size());
    for (size_t t = 0; t < ntensors; ++t) {
      for (const RequestMsg *m : perRank) resp.firstDims.push_back(m ? m->shapes[t].at(0) : 0);
    }
  }
  if (spec.firstDims == OpSpec::FirstDims::kSendSplits) {
    resp.firstDims.reserve(perRank.size() * perRank.size());
    for (const RequestMsg *m : perRank) {
      for (int r = 0; r < size; ++r) {
        resp.firstDims.push_back(m ? m->splits.at(static_cast<size_t>(r)) : 0);
      }
    }
  }
  return resp;
}

Controller::Controller(ControlPlane &plane, int cacheCapacity, StallPolicy stall)
    : plane_(plane), cache_(cacheCapacity), stall_(stall),
      reportRequestsSeen_(stallReportRequests().load()) {}

Controller::Outcome Controller::negotiate(const PendingMap &pending, bool requestShutdown,
                                          bool deviceOffer) {
  Outcome out;
  const int capacity = cache_.capacity();
  const size_t nwords = wordsFor(capacity);
  const size_t hitBase = 1, dropBase = 1 + nwords;
  std::vector<uint64_t> words(1 + 2 * nwords, 0);
  words[0] = ~uint64_t{0};
  for (size_t i = 0; i < nwords; ++i) words[dropBase + i] = ~uint64_t{0};

  // Requests not yet sent to the coordinator, oldest first, with their cache standing.
  std::vector<Request *> unsent;
  bool joined = false;
  for (const auto &kv : pending) {
    if (!kv.second->sentToCoordinator) unsent.push_back(kv.second.get());
    if (kv.second->msg().op == OpType::kJoin) joined = true;
  }
  std::sort(unsent.begin(), unsent.end(),
            [](const Request *a, const Request *b) { return a->submitted() < b->submitted(); });
  // A join is never looked up. A tombstone is never a hit: its name's entry (if any) is dropped
  // on every rank, so that the other ranks' requests of the name, hits until then, go to the
  // coordinator in this same round and meet it there.
  auto standing = [this](const RequestMsg &m, int *slot) {
    if (m.op == OpType::kJoin) return ResponseCache::Lookup::kMiss;
    const ResponseCache::Lookup found = cache_.lookup(m, slot);
    return found == ResponseCache::Lookup::kHit && m.isTombstone() ? ResponseCache::Lookup::kChanged
                                                                   : found;
  };
  auto isHit = [&standing](const Request *r, int *slot) {
    return standing(r->msg(), slot) == ResponseCache::Lookup::kHit;
  };
  bool haveNew = false;
  const Clock::time_point now = Clock::now();
  for (Request *r : unsent) {
    int slot = -1;
    switch (standing(r->msg(), &slot)) {
      case ResponseCache::Lookup::kHit:
        // A hit waits silently: only the coordinator can tell who has not submitted a name. One
        // that has waited this long is dropped from every rank's cache, and goes there.
        if (now - r->submitted() > kHitPatience) {
          clearBit(words, dropBase, slot);
        } else {
          setBit(words, hitBase, slot);
        }
        break;
      case ResponseCache::Lookup::kChanged: clearBit(words, dropBase, slot); break;
      case ResponseCache::Lookup::kMiss: haveNew = true; break;
    }
  }
  // The coordinator forces a round to fail the names past HORA_STALL_SHUTDOWN_S.
  const bool expire = plane_.rank() == 0 && inspectStalls();
  if (haveNew || expire) words[0] &= ~kFlagNothingNew;
  if (requestShutdown) words[0] &= ~kFlagNoShutdown;
  if (joined) words[0] &= ~kFlagNobodyJoined;
  if (!deviceOffer) words[0] &= ~kFlagDeviceOffer;

  plane_.allreduceAnd(words);
  out.deviceAgreed = (words[0] & kFlagDeviceOffer) != 0;

  if (!(words[0] & kFlagNoShutdown)) {
    out.shutdown = true;
    return out;
  }
  // Both scans go a word at a time: a cycle usually drops nothing and hits a few slots of many.
  bool dropped = false;
  forEachBit(words, dropBase, nwords, capacity, /*set=*/false, [&](int slot) {
    cache_.erase(slot);
    dropped = true;
  });
  // A joined rank sets no hit bits, so no cached response can be ready while one is joined;
  // everything then goes through the coordinator, which counts joined ranks as present.
  const bool someoneJoined = !(words[0] & kFlagNobodyJoined);
  std::vector<int> hitSlots;
  forEachBit(words, hitBase, nwords, capacity, /*set=*/true, [&](int slot) {
    if (cache_.occupied(slot)) hitSlots.push_back(slot);
  });
  out.responses.reserve(hitSlots.size() + unsent.size());
  for (int slot : hitSlots) out.responses.push_back(cache_.shared(slot));

  const bool coordinatorRound = !(words[0] & kFlagNothingNew) || dropped || someoneJoined;
  std::vector<Response> fresh;
  if (coordinatorRound) {
    out.coordinatorRounds = 1;
    std::vector<RequestMsg> toSend;
    for (Request *r : unsent) {
      int slot = -1;
      if (!someoneJoined && isHit(r, &slot)) continue;
      toSend.push_back(r->msg());
      r->sentToCoordinator = true;
    }
    std::vector<std::string> blobs = plane_.gatherToRoot(encodeRequests(toSend));
    std::string answer;
    if (plane_.rank() == 0) {
      fresh = coordinate(blobs);
      for (Response &expired : expireStalls()) fresh.push_back(std::move(expired));
      answer = encodeResponses(fresh);
    }
    plane_.broadcastFromRoot(answer);
    if (plane_.rank() != 0) fresh = decodeResponses(answer);
  }

  // Same updates in the same order on every rank keeps the caches (and slot numbers) identical.
  for (int slot : hitSlots) cache_.touch(slot);
  const int me = plane_.rank();
  for (Response &answer : fresh) {
    auto resp = std::make_shared<const Response>(std::move(answer));
    out.responses.push_back(resp);
    auto it = pending.find(resp->agreed.name);
    // A stalled name failed by the coordinator reaches every rank, so that each keeps the same
    // sequence of operations; the ranks that never submitted it only count it.
    if (it == pending.end() && resp->status == HORA_ERR_TIMEOUT) continue;
    if (it == pending.end()) {
      HORA_ENFORCE(std::find(resp->joined.begin(), resp->joined.end(), me) != resp->joined.end(),
                   "coordinator answered '", resp->agreed.name,
                   "', which this rank has not submitted");
      continue;  // joined: takes part with zeros; such responses are never cached
    }
    if (cacheable(*resp)) cache_.put(resp, it->second->msg());
  }
  for (auto r = out.responses.rbegin(); r != out.responses.rend(); ++r) {
    if ((*r)->ok()) {
      lastCompleted_ = (*r)->agreed.name;
      break;
    }
  }
  return out;
}

bool Controller::inspectStalls() {
  if (stall_.warningS <= 0 && stall_.shutdownS <= 0) return false;
  const uint32_t requests = stallReportRequests().load();
  const bool asked = requests != reportRequestsSeen_;  // SIGUSR1
  reportRequestsSeen_ = requests;
  const Clock::time_point now = Clock::now();
  if (table_.empty() || (!asked && now - lastStallScan_ < std::chrono::seconds(1))) return false;
  lastStallScan_ = now;

  std::vector<std::pair<uint64_t, TableEntry *>> due;
  bool expire = false;
  for (auto &kv : table_) {
    TableEntry &e = kv.second;
    const double waited = std::chrono::duration<double>(now - e.firstSeen).count();
    if (stall_.shutdownS > 0 && waited >= stall_.shutdownS) expire = true;
    const bool reported = e.lastReport.time_since_epoch().count() != 0;
    if (asked || (stall_.warningS > 0 && waited >= stall_.warningS &&
                  (!reported || std::chrono::duration<double>(now - e.lastReport).count() >= stall_.warningS))) {
      due.push_back({e.arrival, &e});
    }
  }
  std::sort(due.begin(), due.end());
  for (auto &d : due) {
    TableEntry &e = *d.second;
    e.lastReport = now;
    std::vector<int> submitted, missing, refused;
    const RequestMsg *first = nullptr;
    for (size_t r = 0; r < e.perRank.size(); ++r) {
      if (e.perRank[r]) {
        submitted.push_back(static_cast<int>(r));
        if (e.perRank[r]->isTombstone()) refused.push_back(static_cast<int>(r));
        if (first == nullptr) first = &*e.perRank[r];
      } else if (joinedRanks_.empty() || !joinedRanks_[r]) {
        missing.push_back(static_cast<int>(r));
      }
    }
    if (first == nullptr) continue;
    const double waited = std::chrono::duration<double>(now - e.firstSeen).count();
    const std::string shape = first->shapes.empty() ? "[]" : shapeString(first->shapes[0]);
    const std::string more =
        first->shapes.size() > 1 ? " and " + std::to_string(first->shapes.size() - 1) + " more tensors" : "";
    std::ostringstream line;
    line.setf(std::ios::fixed);
    line.precision(1);
    line << "stall: " << opTypeName(first->op) << " '" << first->name << "' (" << dtypeName(first->dtype)
         << ' ' << shape << more << ", process set " << stall_.processSet << ") has waited " << waited
         << " s: submitted by " << (submitted.size() == 1 ? "rank " : "ranks ") << rankList(submitted)
         << ", not by " << (missing.size() == 1 ? "rank " : "ranks ") << rankList(missing)
         << (lastCompleted_.empty() ? std::string(", which have completed nothing in this set yet")
                                    : ", whose last completed op in this set was '" + lastCompleted_ + "'");
    if (!refused.empty()) {
      line << " (" << (refused.size() == 1 ? "rank " : "ranks ") << rankList(refused)
           << " refused it before submitting: it fails once the others submit it)";
    }
    if (stall_.shutdownS > 0) {
      line << "; it fails with HORA_ERR_TIMEOUT at " << stall_.shutdownS << " s (HORA_STALL_SHUTDOWN_S)";
    }
    HORA_LOG(kWarning) << line.str();
    std::ostringstream json;
    json.setf(std::ios::fixed);
    json.precision(3);
    json << R"({"hora_stall":{"process_set":)" << stall_.processSet << R"(,"name":)" << jsonQuoted(first->name)
         << R"(,"op":")" << opTypeName(first->op) << R"(","dtype":")" << dtypeName(first->dtype)
         << R"(","shape":)" << shape << R"(,"tensors":)" << first->shapes.size() << R"(,"waited_s":)"
         << waited << R"(,"submitted":)" << jsonRanks(submitted) << R"(,"missing":)" << jsonRanks(missing)
         << R"(,"last_completed":)" << (lastCompleted_.empty() ? "null" : jsonQuoted(lastCompleted_)) << "}}";
    HORA_LOG(kWarning) << json.str();
  }
  return expire;
}

std::vector<Response> Controller::expireStalls() {
  std::vector<Response> failed;
  if (stall_.shutdownS <= 0) return failed;
  const Clock::time_point now = Clock::now();
  std::vector<std::pair<uint64_t, std::string>> expired;
  for (const auto &kv : table_) {
    if (std::chrono::duration<double>(now - kv.second.firstSeen).count() >= stall_.shutdownS) {
      expired.push_back({kv.second.arrival, kv.first});
    }
  }
  std::sort(expired.begin(), expired.end());
  for (const auto &x : expired) {
    const TableEntry &e = table_.at(x.second);
    std::vector<int> submitted, missing;
    Response resp;
    for (size_t r = 0; r < e.perRank.size(); ++r) {
      if (e.perRank[r]) {
        if (submitted.empty()) resp.agreed = *e.perRank[r];
        submitted.push_back(static_cast<int>(r));
      } else if (joinedRanks_.empty() || !joinedRanks_[r]) {
        missing.push_back(static_cast<int>(r));
      }
    }
    resp.status = HORA_ERR_TIMEOUT;
    std::ostringstream why;
    why.setf(std::ios::fixed);
    why.precision(1);
    why << opTypeName(resp.agreed.op) << " '" << resp.agreed.name << "' (process set " << stall_.processSet
        << ") stalled for " << std::chrono::duration<double>(now - e.firstSeen).count()
        << " s (HORA_STALL_SHUTDOWN_S=" << stall_.shutdownS << "): submitted by "
        << (submitted.size() == 1 ? "rank " : "ranks ") << rankList(submitted) << ", never by "
        << (missing.size() == 1 ? "rank " : "ranks ") << rankList(missing);
    resp.error = why.str();
    HORA_LOG(kError) << resp.error;
    failed.push_back(std::move(resp));
    table_.erase(x.second);
  }
  return failed;
}

bool Controller::ready(const TableEntry &entry) const {
  for (size_t r = 0; r < entry.perRank.size(); ++r) {
    if (!entry.perRank[r].has_value() && !joinedRanks_[r]) return false;
  }
  return true;
}

std::vector<Response> Controller::coordinate(const std::vector<std::string> &blobs) {
  const int size = plane_.size();
  if (joinedRanks_.empty()) joinedRanks_.assign(static_cast<size_t>(size), false);
  bool joinsArrived = false;
  std::vector<std::string> candidates;  // names that may have become ready, in arrival order
  for (int r = 0; r < size; ++r) {
    for (RequestMsg &msg : decodeRequests(blobs[static_cast<size_t>(r)])) {
      TableEntry &entry = table_[msg.name];
      if (entry.perRank.empty()) {
        entry.perRank.resize(static_cast<size_t>(size));
        entry.arrival = arrivals_++;
        entry.firstSeen = Clock::now();
      }
      auto &slot = entry.perRank[static_cast<size_t>(r)];
      HORA_ENFORCE(!slot.has_value(), "rank ", r, " sent '", msg.name, "' twice");
      if (msg.op == OpType::kJoin) {
        joinedRanks_[static_cast<size_t>(r)] = true;
        lastJoined_ = r;
        joinsArrived = true;
      }
      candidates.push_back(msg.name);
      slot = std::move(msg);
    }
  }
  // A join can make any waiting name ready: look at the whole table then.
  if (joinsArrived) {
    candidates.clear();
    std::vector<std::pair<uint64_t, std::string>> all;
    for (const auto &kv : table_) all.push_back({kv.second.arrival, kv.first});
    std::sort(all.begin(), all.end());
    for (auto &a : all) candidates.push_back(std::move(a.second));
  }
  std::vector<Response> ready, joins;
  for (const std::string &name : candidates) {
    auto it = table_.find(name);
    if (it == table_.end() || !this->ready(it->second)) continue;
    std::vector<const RequestMsg *> perRank;
    for (const auto &m : it->second.perRank) perRank.push_back(m ? &*m : nullptr);
    Response resp = checkAgreement(perRank);
    if (!resp.ok()) {
      // Refused on every rank that sent it: each caller has its error already, no op failed here.
      const bool allRefused = std::all_of(perRank.begin(), perRank.end(), [](const RequestMsg *m) {
        return m == nullptr || m->isTombstone();
      });
      if (allRefused) {
        HORA_LOG(kDebug) << resp.error;
      } else {
        HORA_LOG(kWarning) << resp.error;
      }
    }
    if (resp.agreed.op == OpType::kJoin) {
      // Every rank has joined: the join completes, and nobody is joined any more.
      resp.joined.clear();
      resp.firstDims = {lastJoined_};
      joinedRanks_.assign(static_cast<size_t>(size), false);
      lastJoined_ = -1;
      joins.push_back(std::move(resp));
    } else {
      ready.push_back(std::move(resp));
    }
    table_.erase(it);
  }
  // Joins last, so joined ranks take part in everything that became ready with them.
  for (Response &j : joins) ready.push_back(std::move(j));
  return ready;
}

}  // namespace hora

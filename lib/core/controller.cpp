// SPDX-License-Identifier: Apache-2.0
// Controller: cache bit vector, coordinator matching and the agreement check.
#include "core/controller.h"

#include <algorithm>
#include <functional>
#include <sstream>

#include "base/error.h"
#include "base/logging.h"

namespace hora {
namespace {

constexpr uint64_t kFlagNothingNew = 1u << 0;  // inverted: cleared by a rank with new requests
constexpr uint64_t kFlagNoShutdown = 1u << 1;  // inverted: cleared by a rank shutting down

size_t wordsFor(int bits) { return (static_cast<size_t>(bits) + 63) / 64; }
bool testBit(const std::vector<uint64_t> &w, size_t base, int bit) {
  return (w[base + static_cast<size_t>(bit) / 64] >> (bit % 64)) & 1u;
}
void setBit(std::vector<uint64_t> &w, size_t base, int bit) {
  w[base + static_cast<size_t>(bit) / 64] |= uint64_t{1} << (bit % 64);
}
void clearBit(std::vector<uint64_t> &w, size_t base, int bit) {
  w[base + static_cast<size_t>(bit) / 64] &= ~(uint64_t{1} << (bit % 64));
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
std::optional<std::string> disagreement(const std::vector<RequestMsg> &perRank, const char *field,
                                        const std::function<std::string(const RequestMsg &)> &show) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (size_t r = 0; r < perRank.size(); ++r) {
    const std::string v = show(perRank[r]);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto &g) { return g.first == v; });
    if (it == groups.end()) groups.push_back({v, {static_cast<int>(r)}});
    else it->second.push_back(static_cast<int>(r));
  }
  if (groups.size() <= 1) return std::nullopt;
  std::ostringstream s;
  s << opTypeName(perRank[0].op) << " '" << perRank[0].name << "': ranks disagree on " << field
    << ": ";
  for (size_t g = 0; g < groups.size(); ++g) {
    s << (g ? "; " : "") << (groups[g].second.size() == 1 ? "rank " : "ranks ")
      << rankList(groups[g].second) << ' ' << groups[g].first;
  }
  return s.str();
}

}  // namespace

Response checkAgreement(const std::vector<RequestMsg> &perRank) {
  HORA_ENFORCE(!perRank.empty(), "agreement check over no ranks");
  Response resp;
  resp.agreed = perRank[0];
  const OpType op = perRank[0].op;
  auto fail = [&](std::string message) {
    resp.status = HORA_ERR_MISMATCH;
    resp.error = std::move(message);
    return resp;
  };
  using Show = std::function<std::string(const RequestMsg &)>;
  std::vector<std::pair<const char *, Show>> fields = {
      {"op", [](const RequestMsg &m) { return std::string(opTypeName(m.op)); }},
      {"dtype", [](const RequestMsg &m) { return std::string(dtypeName(m.dtype)); }},
      {"device type",
       [](const RequestMsg &m) { return std::string(m.device.isCpu() ? "cpu" : "cuda"); }},
      {"number of tensors", [](const RequestMsg &m) { return std::to_string(m.shapes.size()); }},
  };
  const bool reduces = op == OpType::kAllreduce || op == OpType::kReducescatter;
  if (reduces) {
    fields.push_back({"reduce op", [](const RequestMsg &m) { return std::string(reduceOpName(m.reduceOp)); }});
    fields.push_back({"prescale", [](const RequestMsg &m) { return fmtDouble(m.prescale); }});
    fields.push_back({"postscale", [](const RequestMsg &m) { return fmtDouble(m.postscale); }});
  }
  if (op == OpType::kBroadcast) {
    fields.push_back({"root", [](const RequestMsg &m) { return std::to_string(m.root); }});
  }
  for (const auto &f : fields) {
    if (auto msg = disagreement(perRank, f.first, f.second)) return fail(*msg);
  }
  // Shapes: allgather may differ in the first dimension only.
  const bool firstDimFree = op == OpType::kAllgather;
  const size_t ntensors = perRank[0].shapes.size();
  for (size_t t = 0; t < ntensors; ++t) {
    std::string field = ntensors == 1 ? "shape" : "shape of tensor " + std::to_string(t);
    if (firstDimFree) field = ntensors == 1 ? "rank or trailing dimensions"
                                            : "rank or trailing dimensions of tensor " +
                                                  std::to_string(t);
    auto msg = disagreement(perRank, field.c_str(), [&](const RequestMsg &m) {
      const Shape &s = m.shapes[t];
      if (!firstDimFree || s.empty()) return shapeString(s);
      std::string text = "[*";  // the first dimension is each rank's own
      for (size_t d = 1; d < s.size(); ++d) text += "," + std::to_string(s[d]);
      return text + "]";
    });
    if (msg) return fail(*msg);
  }
  if (firstDimFree) {
    resp.firstDims.reserve(ntensors * perRank.size());
    for (size_t t = 0; t < ntensors; ++t) {
      for (const RequestMsg &m : perRank) resp.firstDims.push_back(m.shapes[t].at(0));
    }
  }
  return resp;
}

Controller::Controller(ControlPlane &plane, int cacheCapacity)
    : plane_(plane), cache_(cacheCapacity) {}

Controller::Outcome Controller::negotiate(const PendingMap &pending, bool requestShutdown) {
  Outcome out;
  const int capacity = cache_.capacity();
  const size_t nwords = wordsFor(capacity);
  const size_t hitBase = 1, dropBase = 1 + nwords;
  std::vector<uint64_t> words(1 + 2 * nwords, 0);
  words[0] = ~uint64_t{0};
  for (size_t i = 0; i < nwords; ++i) words[dropBase + i] = ~uint64_t{0};

  // Requests not yet sent to the coordinator, oldest first, with their cache standing.
  std::vector<Request *> unsent;
  for (const auto &kv : pending) {
    if (!kv.second->sentToCoordinator) unsent.push_back(kv.second.get());
  }
  std::sort(unsent.begin(), unsent.end(),
            [](const Request *a, const Request *b) { return a->submitted() < b->submitted(); });
  bool haveNew = false;
  for (Request *r : unsent) {
    int slot = -1;
    switch (cache_.lookup(r->msg(), &slot)) {
      case ResponseCache::Lookup::kHit: setBit(words, hitBase, slot); break;
      case ResponseCache::Lookup::kChanged: clearBit(words, dropBase, slot); break;
      case ResponseCache::Lookup::kMiss: haveNew = true; break;
    }
  }
  if (haveNew) words[0] &= ~kFlagNothingNew;
  if (requestShutdown) words[0] &= ~kFlagNoShutdown;

  plane_.allreduceAnd(words);

  if (!(words[0] & kFlagNoShutdown)) {
    out.shutdown = true;
    return out;
  }
  bool dropped = false;
  for (int slot = 0; slot < capacity; ++slot) {
    if (!testBit(words, dropBase, slot)) {
      cache_.erase(slot);
      dropped = true;
    }
  }
  std::vector<int> hitSlots;
  for (int slot = 0; slot < capacity; ++slot) {
    if (testBit(words, hitBase, slot) && cache_.occupied(slot)) {
      hitSlots.push_back(slot);
      out.responses.push_back(cache_.response(slot));
    }
  }

  const bool coordinatorRound = !(words[0] & kFlagNothingNew) || dropped;
  std::vector<Response> fresh;
  if (coordinatorRound) {
    out.coordinatorRounds = 1;
    std::vector<RequestMsg> toSend;
    for (Request *r : unsent) {
      int slot = -1;
      if (cache_.lookup(r->msg(), &slot) == ResponseCache::Lookup::kHit) continue;
      toSend.push_back(r->msg());
      r->sentToCoordinator = true;
    }
    std::vector<std::string> blobs = plane_.gatherToRoot(encodeRequests(toSend));
    std::string answer;
    if (plane_.rank() == 0) {
      fresh = coordinate(blobs);
      answer = encodeResponses(fresh);
    }
    plane_.broadcastFromRoot(answer);
    if (plane_.rank() != 0) fresh = decodeResponses(answer);
  }

  // Same updates in the same order on every rank keeps the caches (and slot numbers) identical.
  for (int slot : hitSlots) cache_.touch(slot);
  for (const Response &resp : fresh) {
    auto it = pending.find(resp.agreed.name);
    HORA_ENFORCE(it != pending.end(), "coordinator answered '", resp.agreed.name,
                 "', which this rank has not submitted");
    cache_.put(resp, it->second->msg());
  }
  for (Response &resp : fresh) out.responses.push_back(std::move(resp));
  return out;
}

std::vector<Response> Controller::coordinate(const std::vector<std::string> &blobs) {
  const int size = plane_.size();
  std::vector<Response> ready;
  for (int r = 0; r < size; ++r) {
    for (RequestMsg &msg : decodeRequests(blobs[static_cast<size_t>(r)])) {
      TableEntry &entry = table_[msg.name];
      if (entry.perRank.empty()) entry.perRank.resize(static_cast<size_t>(size));
      auto &slot = entry.perRank[static_cast<size_t>(r)];
      HORA_ENFORCE(!slot.has_value(), "rank ", r, " sent '", msg.name, "' twice");
      const std::string name = msg.name;
      slot = std::move(msg);
      if (++entry.count == size) {
        ready.push_back(validate(name, entry));
        table_.erase(name);
      }
    }
  }
  return ready;
}

Response Controller::validate(const std::string &, const TableEntry &entry) const {
  std::vector<RequestMsg> perRank;
  perRank.reserve(entry.perRank.size());
  for (const auto &m : entry.perRank) perRank.push_back(*m);
  Response resp = checkAgreement(perRank);
  if (!resp.ok()) {
    HORA_LOG(kWarning) << resp.error;
  }
  return resp;
}

}  // namespace hora

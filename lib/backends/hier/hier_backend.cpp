// SPDX-License-Identifier: Apache-2.0
// HierBackend: a set's plane with large allreduces split by topology (hier_backend.h).
#include "backends/hier/hier_backend.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <map>

#include "backends/shm/hier_allreduce.h"
#include "backends/shm/shm_channel.h"
#include "backends/shm/shm_segment.h"
#include "base/error.h"
#include "core/kernels.h"
#include "core/wrapping_backend.h"
#include "base/logging.h"
#include "base/process.h"

namespace hora {
namespace {

// Where every rank of a set is, from every rank's hostIdentity(): hosts numbered in order of
// their lowest rank, each rank's index among its host's ranks (in rank order).
struct Layout {
  std::vector<int> host;        // by rank
  std::vector<int> localIndex;  // by rank
  std::vector<int> hostSize;    // by host
  std::vector<std::string> hostName;  // by host
  int hosts() const { return static_cast<int>(hostSize.size()); }
  int fewest() const { return *std::min_element(hostSize.begin(), hostSize.end()); }
  int most() const { return *std::max_element(hostSize.begin(), hostSize.end()); }
  std::string describe() const {  // "2 hosts: a x2, b x1"
    std::string s = std::to_string(hosts()) + " hosts:";
    for (int h = 0; h < hosts(); ++h) {
      s += detail::concat(h ? ", " : " ", hostName[static_cast<size_t>(h)], " x", hostSize[static_cast<size_t>(h)]);
    }
    return s;
  }
};

Layout layoutOf(ControlPlane &control) {
  std::vector<std::string> ids = control.gatherToRoot(hostIdentity());
  std::string all;
  for (const std::string &id : ids) all += id + '\n';
  control.broadcastFromRoot(all);
  Layout layout;
  std::map<std::string, int> index;
  size_t at = 0;
  while (at < all.size()) {
    const size_t eol = all.find('\n', at);
    const std::string id = all.substr(at, eol - at);
    at = eol + 1;
    auto found = index.find(id);
    if (found == index.end()) {
      found = index.emplace(id, layout.hosts()).first;
      layout.hostSize.push_back(0);
      layout.hostName.push_back(hostOfIdentity(id));
    }
    layout.host.push_back(found->second);
    layout.localIndex.push_back(layout.hostSize[static_cast<size_t>(found->second)]++);
  }
  return layout;
}

// Whether `ok` holds on every rank of `control`, with the first reason any rank gave.
bool everyRank(ControlPlane &control, bool ok, const std::string &why, std::string *first) {
  std::vector<uint64_t> word{ok ? 1ull : 0ull};
  control.allreduceAnd(word);
  if (word[0] == 1) return true;
  std::vector<std::string> reasons = control.gatherToRoot(ok ? "" : why);
  std::string reason;
  if (control.rank() == 0) {
    for (size_t r = 0; r < reasons.size() && reason.empty(); ++r) {
      if (!reasons[r].empty()) reason = detail::concat("rank ", r, ": ", reasons[r]);
    }
  }
  control.broadcastFromRoot(reason);
  *first = reason;
  return false;
}

// HORA_HIERARCHICAL=auto, before the calibration below has run: no hierarchy.
constexpr int64_t kNever = INT64_MAX;

// Every call it does not take over goes to the inner backend (WrappingBackend): the negotiation
// plane, the bell, the AND, fused spans.
class HierBackend final : public WrappingBackend {
 public:
  HierBackend(std::unique_ptr<Backend> inner, std::unique_ptr<Group> local,
              std::unique_ptr<ShmChannel> channel, std::unique_ptr<Backend> localPlane,
              std::unique_ptr<Group> cross, std::unique_ptr<Backend> crossPlane, int owners, bool always,
              const Layout &layout, int rank)
      : WrappingBackend(std::move(inner)),
        local_(std::move(local)),
        channel_(std::move(channel)),
        localPlane_(std::move(localPlane)),
        cross_(std::move(cross)),
        crossPlane_(std::move(crossPlane)),
        layout_(layout),
        rank_(rank),
        allreduce_(*channel_, owners,
                   [this](void *buf, int64_t count, DType dtype, ReduceOp op) {
                     crossPlane_->allreduce(buf, buf, count, dtype, op);
                   },
                   /*halfAcross=*/false),
        always_(always),
        caps_(this->inner().caps()) {
    for (size_t r = 0; r < layout_.host.size(); ++r) {
      hostRanks_.resize(static_cast<size_t>(layout_.hosts()));
      hostRanks_[static_cast<size_t>(layout_.host[r])].push_back(static_cast<int>(r));
    }
    name_ = detail::concat(this->inner().name(), "+hier(", layout_.describe(), "; ", owners, " owner",
                           owners == 1 ? "" : "s", " per host across ",
                           crossPlane_ ? crossPlane_->name() : "-", ")");
  }

  const char *name() const override { return name_.c_str(); }
  const BackendCaps &caps() const override { return caps_; }
  void interrupt(const Status &why) override {
    WrappingBackend::interrupt(why);
    if (channel_) channel_->barrier().interrupt(why);
    for (Group *g : {local_.get(), cross_.get()}) {
      if (g != nullptr) g->interrupt(why);
    }
    for (Backend *b : {localPlane_.get(), crossPlane_.get()}) {
      if (b != nullptr) b->interrupt(why);
    }
  }

  // The engine has packed, prescaled and (for float16/bfloat16 the planes do not reduce) widened
  // the vector; every rank sees the same count, so all choose alike.
  void allreduce(const void *in, void *out, int64_t count, DType dtype, ReduceOp op) override {
    if (!always_ && count * static_cast<int64_t>(dtypeSize(dtype)) < threshold_) {
      WrappingBackend::allreduce(in, out, count, dtype, op);  // the plane's own algorithm
      return;
    }
    ranHere("hierarchical");
    allreduce_.run({{in, out, count}}, dtype, op, 1.0, 1.0);
  }

  // HORA_HIERARCHICAL=auto: from how many bytes a collective goes hierarchical. Each path's time
  // is modelled as a + b x bytes, both measured here on this set (after a warm-up, the median
  // of three runs back to back at 64 B and at 4 MiB, flat on the plane and hierarchical: a
  // shaped link lets a burst through at line rate, which a smaller or a best-of size would
  // mistake for its speed); the hierarchy pays where its smaller per-byte cost (fewer bytes
  // cross the hosts' links) has repaid its larger fixed cost (two hand-offs through shared
  // memory): from (a_h - a_f) / (b_f - b_h) bytes, never if b_h >= b_f. Rank 0's figures decide
  // for every rank. Collective over the set, once, before any other call.
  std::string calibrate(ControlPlane &control) {
    constexpr int64_t kSmall = 16, kBig = 1 << 20;  // float32 elements: 64 B and 4 MiB
    std::vector<float> buf(static_cast<size_t>(kBig), 1.0f);
    auto once = [&](bool hier, int64_t n) {
      const auto t0 = std::chrono::steady_clock::now();
      if (hier) {
        allreduce_.run({{buf.data(), buf.data(), n}}, DType::kFloat32, ReduceOp::kMax, 1.0, 1.0);
      } else {
        inner().allreduce(buf.data(), buf.data(), n, DType::kFloat32, ReduceOp::kMax);
      }
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    auto median = [&](bool hier, int64_t n) {
      std::vector<double> times;
      for (int rep = 0; rep < 3; ++rep) times.push_back(once(hier, n));
      std::sort(times.begin(), times.end());
      return times[1];
    };
    // Untimed first: the planes' connections are fresh (TCP starts slow, UCX connects lazily)
    // and the scratch buffers unfaulted, which once made the hierarchy look no faster per byte.
    once(false, kBig);
    once(true, kBig);
    const double fs = median(false, kSmall), hs = median(true, kSmall);
    const double fb = median(false, kBig), hb = median(true, kBig);
    const double bytes = static_cast<double>((kBig - kSmall) * 4);
    const double bf = (fb - fs) / bytes, bh = (hb - hs) / bytes;
    std::string verdict;
    if (control.rank() == 0) {
      double from = 0;
      if (bh >= bf) {
        from = -1;
      } else if (hs > fs) {
        from = (hs - fs) / (bf - bh);
      }
      verdict = from < 0 ? std::string("never") : std::to_string(static_cast<int64_t>(from)) + " bytes";
      verdict += detail::concat(" (measured: plane ", static_cast<int>(fs * 1e6), " us + ", bf * 1e9,
                                " ns/B, hierarchical ", static_cast<int>(hs * 1e6), " us + ", bh * 1e9, " ns/B)");
    }
    control.broadcastFromRoot(verdict);
    threshold_ = verdict.rfind("never", 0) == 0 ? kNever : std::stoll(verdict);
    return verdict;
  }
  bool leader() const { return layout_.localIndex[static_cast<size_t>(rank_)] == 0; }

  // The leader's step across hosts, then a barrier of the host's ranks on the segment: a leader
  // whose step failed marks the segment, and the host's other ranks fail at once with its status
  // rather than wait in the plane inside the host for HORA_TIMEOUT_S.
  template <typename Step>
  void acrossThenMeet(const char *what, Step step) {
    if (leader()) {
      try {
        step();
      } catch (const Error &e) {
        channel_->barrier().fail(e.status());
        throw;
      }
    }
    channel_->barrier().wait(what);
  }

  // Hierarchical: the root's host shares it, its local rank 0 sends it to local rank 0 of every
  // other host (the cross plane of local index 0, where rank h is host h), which shares it: the
  // buffer crosses into each host once.
  void broadcast(void *buf, int64_t bytes, int root) override {
    if (!always_ && bytes < threshold_) {
      WrappingBackend::broadcast(buf, bytes, root);
      return;
    }
    ranHere("hierarchical");
    const int myHost = layout_.host[static_cast<size_t>(rank_)];
    const int rootHost = layout_.host[static_cast<size_t>(root)];
    if (myHost == rootHost) localPlane_->broadcast(buf, bytes, layout_.localIndex[static_cast<size_t>(root)]);
    acrossThenMeet("hierarchical broadcast", [&] { crossPlane_->broadcast(buf, bytes, rootHost); });
    if (myHost != rootHost) localPlane_->broadcast(buf, bytes, 0);
  }

  // Hierarchical: the blocks of each host gathered inside it, one exchange among local rank 0 of
  // every host (each host's blocks cross each link once, where a flat allgather sends every block
  // to every rank of a host separately), then shared inside each host.
  void allgatherv(const void *in, void *out, const std::vector<int64_t> &bytesPerRank) override {
    int64_t total = 0;
    for (int64_t b : bytesPerRank) total += b;
    if (!always_ && total < threshold_) {
      WrappingBackend::allgatherv(in, out, bytesPerRank);
      return;
    }
    ranHere("hierarchical");
    const int myHost = layout_.host[static_cast<size_t>(rank_)];
    std::vector<int64_t> localBytes, hostBytes(hostRanks_.size(), 0);
    for (int r : hostRanks_[static_cast<size_t>(myHost)]) localBytes.push_back(bytesPerRank[static_cast<size_t>(r)]);
    for (size_t h = 0; h < hostRanks_.size(); ++h) {
      for (int r : hostRanks_[h]) hostBytes[h] += bytesPerRank[static_cast<size_t>(r)];
    }
    hostBlocks_.resize(static_cast<size_t>(hostBytes[static_cast<size_t>(myHost)]));
    all_.resize(static_cast<size_t>(total));
    // `in` may lie inside `out` (the engine's in-place form): it is read here only.
    localPlane_->allgatherv(in, hostBlocks_.data(), localBytes);
    acrossThenMeet("hierarchical allgather",
                   [&] { crossPlane_->allgatherv(hostBlocks_.data(), all_.data(), hostBytes); });
    localPlane_->broadcast(all_.data(), total, 0);
    // all_ holds the blocks host by host; out wants them in set-rank order.
    std::vector<int64_t> offset(bytesPerRank.size() + 1, 0);
    for (size_t r = 0; r < bytesPerRank.size(); ++r) offset[r + 1] = offset[r] + bytesPerRank[r];
    int64_t at = 0;
    for (const std::vector<int> &ranks : hostRanks_) {
      for (int r : ranks) {
        const int64_t b = bytesPerRank[static_cast<size_t>(r)];
        if (b > 0) copyBytes(static_cast<char *>(out) + offset[static_cast<size_t>(r)], all_.data() + at, static_cast<size_t>(b));
        at += b;
      }
    }
  }

 private:
  std::unique_ptr<Group> local_;
  std::unique_ptr<ShmChannel> channel_;  // over local_
  std::unique_ptr<Backend> localPlane_;  // over local_: allgather and broadcast inside the host
  std::unique_ptr<Group> cross_;         // nullptr on ranks that own no share
  std::unique_ptr<Backend> crossPlane_;  // over cross_ (local index 0: every host's first rank)
  const Layout layout_;
  const int rank_;                              // in the set
  std::vector<std::vector<int>> hostRanks_;     // by host: its ranks, in rank order
  std::vector<char> hostBlocks_, all_;          // allgatherv's staging
  HierAllreduce allreduce_;
  const bool always_;  // HORA_HIERARCHICAL=on
  BackendCaps caps_;
  std::string name_;
  int64_t threshold_ = kNever;  // HORA_HIERARCHICAL=auto: from calibrate()
};

}  // namespace

std::unique_ptr<Backend> wrapHierarchical(std::unique_ptr<Backend> inner, Bootstrap &bootstrap,
                                          Group &group, const Knobs &knobs, const MakeHierPlane &makePlane,
                                          std::string *why) {
  if (knobs.hierarchical == "off") {
    *why = "HORA_HIERARCHICAL=off";
    return inner;
  }
  ControlPlane &control = group.control();
  const Layout layout = layoutOf(control);
  if (layout.hosts() == 1) {
    *why = "every rank of the set is on one host";
    return inner;
  }
  if (layout.most() == 1) {
    *why = "no host holds two ranks of the set";
    return inner;
  }
  if (layout.most() > ShmBarrierState::kMaxRanks) {
    *why = detail::concat("a host holds more than ", ShmBarrierState::kMaxRanks, " ranks of the set");
    return inner;
  }
  const int me = control.rank();
  const int host = layout.host[static_cast<size_t>(me)];
  const int local = layout.localIndex[static_cast<size_t>(me)];
  // HORA_HIER_OWNERS narrows it (1: Horovod's way); the same knobs on every rank.
  int owners = layout.fewest();
  if (knobs.hierOwners > 0) owners = static_cast<int>(std::min<int64_t>(owners, knobs.hierOwners));
  // Both splits on every rank, in this order, whatever happens after: they are collective.
  std::unique_ptr<Group> localGroup = bootstrap.splitGroup(group, host, me);
  std::unique_ptr<Group> crossGroup = bootstrap.splitGroup(group, local < owners ? local : -1, host);
  std::string failure;
  // A host with one rank of the set gets a segment of its own too: the algorithm is the same.
  std::unique_ptr<ShmSegment> segment =
      ShmSegment::create(localGroup->control(), ShmChannel::segmentBytes(localGroup->size()), &failure);
  if (!everyRank(control, segment != nullptr, failure, why)) {
    *why = "no shared segment on some host (" + *why + ")";
    return inner;
  }
  auto channel = std::make_unique<ShmChannel>(std::move(segment), localGroup->rank(), localGroup->size(),
                                              knobs.timeoutS);
  channel->connect(localGroup->control());
  // Inside the host, allgather and broadcast go through a plane of the host's ranks.
  std::unique_ptr<Backend> localPlane;
  try {
    localPlane = makePlane(HierPlane::kInsideHost, *localGroup);
  } catch (const Error &e) {
    failure = e.what();
  }
  if (!everyRank(control, localPlane != nullptr, failure, why)) {
    *why = "no plane inside a host (" + *why + ")";
    return inner;
  }
  std::unique_ptr<Backend> crossPlane;
  if (crossGroup) {
    try {
      crossPlane = makePlane(HierPlane::kAcrossHosts, *crossGroup);
    } catch (const Error &e) {
      failure = e.what();
    }
  }
  if (!everyRank(control, crossGroup == nullptr || crossPlane != nullptr, failure, why)) {
    *why = "no cross-host plane (" + *why + ")";
    return inner;
  }
  const std::string where = layout.describe();
  HORA_LOG(kInfo) << "hierarchical allreduce: " << where << "; " << owners << " rank"
                  << (owners == 1 ? "" : "s") << " per host carr" << (owners == 1 ? "ies" : "y")
                  << " the shares across hosts"
                  << (crossPlane ? detail::concat(" (this rank, on ", crossPlane->name(), ")") : "");
  auto hier = std::make_unique<HierBackend>(std::move(inner), std::move(localGroup), std::move(channel),
                                            std::move(localPlane), std::move(crossGroup), std::move(crossPlane),
                                            owners, knobs.hierarchical == "on", layout, me);
  if (knobs.hierarchical == "auto") {
    // Not inside the log statement: that is skipped below the info level.
    const std::string verdict = hier->calibrate(control);
    HORA_LOG(kInfo) << "hierarchical collectives from " << verdict;
  }
  return hier;
}

}  // namespace hora

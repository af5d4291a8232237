// SPDX-License-Identifier: Apache-2.0
// The algorithm tables: per collective, its algorithms in the order their size rules are tried.
// Adding an algorithm is its function in its family's file and a row here.
#include <cstring>

#include "core/collectives/algorithms.h"
#include "core/collectives/common.h"

namespace hora::collectives {

// The families' algorithms (ring.cpp, exchange.cpp, tree.cpp, alltoall.cpp).
void ringAllreduce(Link &link, const Call &call);
void hierarchicalRingAllreduce(Link &link, const Call &call);
void ringReduceScatter(Link &link, const Call &call);
void ringAllgatherv(Link &link, const Call &call);
bool hostsAreEven(const Link &link);
void recursiveDoubling(Link &link, const Call &call);
void directAllreduce(Link &link, const Call &call);
void hostAwareAllreduce(Link &link, const Call &call);
bool hostAwareFits(const Link &link);
void binomialBroadcast(Link &link, const Call &call);
void chainBroadcast(Link &link, const Call &call);
void pairwiseAlltoallv(Link &link, const Call &call);
void directAlltoallv(Link &link, const Call &call);
void directAllgatherv(Link &link, const Call &call);

namespace {

bool always(const Link &, const Call &) { return true; }
bool small(const Link &link, const Call &call) { return call.bytes <= link.tuning().smallBytes; }
bool concurrent(const Link &link, const Call &) { return link.tuning().concurrentPeers; }

const std::vector<Algorithm> kAllreduce = {
    {"host_aware", "small, across several hosts with two ranks or more on some (a link that knows hosts)",
     [](const Link &link, const Call &) { return hostAwareFits(link); },
     [](const Link &link, const Call &call) {
       return link.tuning().topologyAware && small(link, call) && hostAwareFits(link);
     },
     hostAwareAllreduce},
    {"direct", "(size-1) x bytes up to the link's direct limit", always,
     [](const Link &link, const Call &call) {
       return call.bytes * static_cast<size_t>(link.size() - 1) <= link.tuning().directBytes;
     },
     directAllreduce},
    {"recursive_doubling", "small (up to the link's small limit), or fewer elements than ranks", always,
     [](const Link &link, const Call &call) { return small(link, call) || call.count < link.size(); },
     recursiveDoubling},
    {"hierarchical_ring", "large, across hosts with the same number of ranks each",
     [](const Link &link, const Call &) { return hostsAreEven(link); },
     [](const Link &link, const Call &) { return link.tuning().topologyAware && hostsAreEven(link); },
     hierarchicalRingAllreduce},
    {"ring", "large", always, always, ringAllreduce},
};

const std::vector<Algorithm> kReducescatter = {
    {"recursive_doubling", "small: the whole vector, keeping this rank's block", always, small,
     [](Link &link, const Call &call) {
       Call whole = call;
       whole.count = offsetsOf(*call.sizes).back();
       recursiveDoubling(link, whole);
     }},
    {"ring", "large", always, always, ringReduceScatter},
};

const std::vector<Algorithm> kBroadcast = {
    {"binomial", "small, or a plane that moves one peer at a time", always,
     [](const Link &link, const Call &call) { return small(link, call) || !concurrent(link, call); },
     binomialBroadcast},
    {"chain", "large", always, always, chainBroadcast},
};

const std::vector<Algorithm> kAllgatherv = {
    {"direct", "a plane that moves to every peer at once", always, concurrent, directAllgatherv},
    {"ring", "otherwise", always, always, ringAllgatherv},
};

const std::vector<Algorithm> kAlltoallv = {
    {"direct", "a plane that moves to every peer at once", always, concurrent, directAlltoallv},
    {"pairwise", "otherwise", always, always, pairwiseAlltoallv},
};

const char *const kNames[kNumCollectives] = {"allreduce", "reducescatter", "broadcast",
                                             "allgatherv", "alltoallv"};

const char *run(Collective c, Link &link, const Choices &choices, const Call &call) {
  const Algorithm &a = choices.choose(c, link, call);
  a.run(link, call);
  return a.name;
}

}  // namespace

const char *collectiveName(Collective c) { return kNames[static_cast<size_t>(c)]; }

const std::vector<Algorithm> &table(Collective c) {
  static const std::vector<Algorithm> *const kTables[kNumCollectives] = {
      &kAllreduce, &kReducescatter, &kBroadcast, &kAllgatherv, &kAlltoallv};
  return *kTables[static_cast<size_t>(c)];
}

Choices Choices::parse(const std::string &spec) {
  Choices out;
  size_t at = 0;
  while (at < spec.size()) {
    size_t end = spec.find(',', at);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(at, end - at);
    at = end + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    const std::string coll = item.substr(0, eq), name = eq == std::string::npos ? "" : item.substr(eq + 1);
    int found = -1;
    for (size_t c = 0; c < kNumCollectives; ++c) {
      if (coll != kNames[c]) continue;
      const std::vector<Algorithm> &t = table(static_cast<Collective>(c));
      for (size_t i = 0; i < t.size(); ++i) {
        if (name == t[i].name) found = static_cast<int>(i);
      }
      if (found < 0) break;
      out.forced_[c] = found;
    }
    if (found < 0) {
      HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "HORA_ALGORITHM: \"", item,
                 "\" is not COLLECTIVE=ALGORITHM from these tables: ", describeTables());
    }
  }
  return out;
}

const Algorithm &Choices::choose(Collective c, const Link &link, const Call &call) const {
  const std::vector<Algorithm> &t = table(c);
  const int forced = forced_[static_cast<size_t>(c)];
  if (forced >= 0 && t[static_cast<size_t>(forced)].fits(link, call)) return t[static_cast<size_t>(forced)];
  for (const Algorithm &a : t) {
    if (a.picks(link, call)) return a;
  }
  return t.back();
}

std::string describeTables() {
  std::string out;
  for (size_t c = 0; c < kNumCollectives; ++c) {
    out += std::string(out.empty() ? "" : "; ") + kNames[c] + ":";
    for (const Algorithm &a : table(static_cast<Collective>(c))) {
      out += std::string(" ") + a.name + " (" + a.rule + ")";
    }
  }
  return out;
}

const char *allreduce(Link &link, const Choices &choices, void *buf, int64_t count, size_t esize,
                      const Combine &combine, std::vector<uint8_t> &scratch) {
  Call call;
  call.buf = buf;
  call.count = count;
  call.esize = esize;
  call.bytes = static_cast<size_t>(count) * esize;
  call.combine = &combine;
  call.scratch = &scratch;
  return run(Collective::kAllreduce, link, choices, call);
}

const char *reducescatter(Link &link, const Choices &choices, void *work,
                          const std::vector<int64_t> &counts, size_t esize, const Combine &combine,
                          std::vector<uint8_t> &scratch) {
  Call call;
  call.buf = work;
  call.sizes = &counts;
  call.esize = esize;
  call.bytes = static_cast<size_t>(offsetsOf(counts).back()) * esize;
  call.combine = &combine;
  call.scratch = &scratch;
  return run(Collective::kReducescatter, link, choices, call);
}

const char *broadcast(Link &link, const Choices &choices, void *buf, size_t bytes, int root) {
  Call call;
  call.buf = buf;
  call.bytes = bytes;
  call.root = root;
  return run(Collective::kBroadcast, link, choices, call);
}

const char *allgatherv(Link &link, const Choices &choices, const void *in, void *out,
                       const std::vector<int64_t> &bytesPerRank) {
  Call call;
  call.in = in;
  call.out = out;
  call.sizes = &bytesPerRank;
  call.bytes = static_cast<size_t>(offsetsOf(bytesPerRank).back());
  return run(Collective::kAllgatherv, link, choices, call);
}

const char *alltoallv(Link &link, const Choices &choices, const void *in,
                      const std::vector<int64_t> &sendBytes, void *out,
                      const std::vector<int64_t> &recvBytes) {
  Call call;
  call.in = in;
  call.out = out;
  call.sizes = &sendBytes;
  call.recvSizes = &recvBytes;
  call.bytes = static_cast<size_t>(offsetsOf(sendBytes).back());
  return run(Collective::kAlltoallv, link, choices, call);
}

}  // namespace hora::collectives

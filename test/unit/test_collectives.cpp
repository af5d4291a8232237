// SPDX-License-Identifier: Apache-2.0
// The collectives of core/collectives, every algorithm of every table, over an in-memory Link:
// ranks are threads, and a send completes only when its receive is posted (no buffering at all,
// stricter than TCP or UCX), so an algorithm that relies on a transport's buffers deadlocks here
// (the wait gives up after 20 s and fails the test instead of hanging). Expected values are
// computed from the inputs directly; every rank must also hold the same bits.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "core/collectives/algorithms.h"
#include "core/collectives/link_backend.h"
#include "core/kernels.h"

namespace hora {
namespace {

using collectives::Call;
using collectives::Collective;

// The post office of one group of in-process ranks.
class MemoryFabric {
 public:
  explicit MemoryFabric(int size) : size_(size) {}
  int size() const { return size_; }

  Link::Ticket post(int from, int to, bool isSend, void *data, size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    const Link::Ticket ticket = ++nextTicket_;
    Pair &pair = pairs_[{from, to}];
    (isSend ? pair.sends : pair.recvs).push_back({ticket, data, bytes});
    while (!pair.sends.empty() && !pair.recvs.empty()) {
      const Post s = pair.sends.front(), r = pair.recvs.front();
      pair.sends.pop_front();
      pair.recvs.pop_front();
      if (s.bytes != r.bytes) {
        broken_ = detail::concat("rank ", from, " sent ", s.bytes, " bytes to rank ", to,
                                 ", which expected ", r.bytes);
      } else if (s.bytes > 0) {
        std::memcpy(r.data, s.data, s.bytes);
      }
      done_.insert(s.ticket);
      done_.insert(r.ticket);
    }
    cv_.notify_all();
    return ticket;
  }

  void wait(Link::Ticket ticket) {
    std::unique_lock<std::mutex> lock(mutex_);
    const bool arrived = cv_.wait_for(lock, std::chrono::seconds(20), [&] {
      return done_.count(ticket) > 0 || !broken_.empty();
    });
    if (!broken_.empty()) HORA_THROW(HORA_ERR_INTERNAL, broken_);
    if (!arrived) HORA_THROW(HORA_ERR_TIMEOUT, "transfer ", ticket, " never matched (deadlock)");
    done_.erase(ticket);
  }

  void drop(Link::Ticket ticket) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto &entry : pairs_) {
      for (std::deque<Post> *q : {&entry.second.sends, &entry.second.recvs}) {
        for (auto it = q->begin(); it != q->end(); ++it) {
          if (it->ticket == ticket) {
            q->erase(it);
            break;
          }
        }
      }
    }
  }

  // Transfers posted and never matched: an algorithm whose two sides disagree.
  size_t unmatched() {
    std::lock_guard<std::mutex> lock(mutex_);
    size_t n = 0;
    for (auto &entry : pairs_) n += entry.second.sends.size() + entry.second.recvs.size();
    return n;
  }

 private:
  struct Post {
    Link::Ticket ticket;
    void *data;
    size_t bytes;
  };
  struct Pair {
    std::deque<Post> sends, recvs;
  };
  int size_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::pair<int, int>, Pair> pairs_;
  std::set<Link::Ticket> done_;
  Link::Ticket nextTicket_ = 0;
  std::string broken_;
};

class MemoryLink final : public Link {
 public:
  MemoryLink(MemoryFabric &fabric, int rank, std::vector<std::vector<int>> hosts, LinkTuning tuning)
      : fabric_(fabric), rank_(rank), hosts_(std::move(hosts)), tuning_(tuning) {
    for (size_t h = 0; h < hosts_.size(); ++h) {
      for (int r : hosts_[h]) {
        if (r == rank) hostIndex_ = static_cast<int>(h);
      }
    }
  }
  const char *name() const override { return "memory"; }
  int rank() const override { return rank_; }
  int size() const override { return fabric_.size(); }
  const LinkTuning &tuning() const override { return tuning_; }
  const std::vector<std::vector<int>> &hosts() const override { return hosts_; }
  int hostIndex() const override { return hostIndex_; }
  Ticket postSend(int peer, const void *data, size_t bytes) override {
    EXPECT_NE(peer, rank_);
    return fabric_.post(rank_, peer, true, const_cast<void *>(data), bytes);
  }
  Ticket postRecv(int peer, void *data, size_t bytes) override {
    EXPECT_NE(peer, rank_);
    return fabric_.post(peer, rank_, false, data, bytes);
  }
  void wait(Ticket ticket) override { fabric_.wait(ticket); }
  void drop(Ticket ticket) override { fabric_.drop(ticket); }
  void interrupt(const Status &) override {}

 private:
  MemoryFabric &fabric_;
  int rank_;
  std::vector<std::vector<int>> hosts_;
  int hostIndex_ = 0;
  LinkTuning tuning_;
};

// Hosts for a size: two or more ranks a host where the size allows (even, and one uneven
// layout), else every rank alone.
std::vector<std::vector<int>> hostsFor(int size) {
  std::vector<std::vector<int>> hosts;
  if (size == 5) return {{0, 1}, {2, 3, 4}};  // uneven: no two-level ring, host-aware fits
  const int perHost = size % 3 == 0 && size > 3 ? 3 : size % 2 == 0 && size > 2 ? 2 : 1;
  for (int r = 0; r < size; r += perHost) {
    hosts.emplace_back();
    for (int i = 0; i < perHost; ++i) hosts.back().push_back(r + i);
  }
  return hosts;
}

// Small thresholds so that small vectors already take several chunks.
LinkTuning testTuning() {
  LinkTuning t;
  t.directBytes = 1 << 10;
  t.smallBytes = 512;
  t.chunkBytes = 96;
  t.concurrentPeers = true;
  t.topologyAware = true;
  return t;
}

// Runs body(link) on `size` threads; rethrows the first failure.
void onRanks(int size, const std::function<void(Link &)> &body, LinkTuning tuning = testTuning()) {
  MemoryFabric fabric(size);
  std::vector<std::thread> threads;
  std::vector<std::string> failures(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      MemoryLink link(fabric, r, hostsFor(size), tuning);
      try {
        body(link);
      } catch (const std::exception &e) {
        failures[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (std::thread &t : threads) t.join();
  for (int r = 0; r < size; ++r) EXPECT_EQ(failures[static_cast<size_t>(r)], "") << "rank " << r;
  EXPECT_EQ(fabric.unmatched(), 0u);
}

const collectives::Combine kSum = [](void *dst, const void *src, int64_t n) {
  reduceInto(dst, src, n, DType::kInt64, ReduceOp::kSum);
};
const collectives::Combine kFloatSum = [](void *dst, const void *src, int64_t n) {
  reduceInto(dst, src, n, DType::kFloat32, ReduceOp::kSum);
};

int64_t value(int rank, int64_t i) { return (rank + 1) * 1000003 + i * 7 - (i % 5) * rank; }

const int kSizes[] = {2, 3, 4, 5, 6, 7, 8};

// Runs algorithm `index` of the table directly when it fits the call, else skips it (a forced
// choice would fall back to the rule, which tests something else).
bool runIfFits(Collective c, size_t index, Link &link, const Call &call) {
  const collectives::Algorithm &a = collectives::table(c)[index];
  if (!a.fits(link, call)) return false;
  a.run(link, call);
  return true;
}

TEST(Collectives, EveryAllreduceAlgorithmSumsExactlyAndAgreesBitwise) {
  for (size_t index = 0; index < collectives::table(Collective::kAllreduce).size(); ++index) {
    const char *name = collectives::table(Collective::kAllreduce)[index].name;
    for (int size : kSizes) {
      for (int64_t count : {int64_t{1}, int64_t{size - 1}, int64_t{13}, int64_t{1000}}) {
        if (count == 0) continue;
        std::vector<std::vector<float>> floats(static_cast<size_t>(size));
        onRanks(size, [&](Link &link) {
          const int r = link.rank();
          std::vector<int64_t> data(static_cast<size_t>(count));
          for (int64_t i = 0; i < count; ++i) data[static_cast<size_t>(i)] = value(r, i);
          std::vector<uint8_t> scratch;
          Call call;
          call.buf = data.data();
          call.count = count;
          call.esize = sizeof(int64_t);
          call.bytes = static_cast<size_t>(count) * sizeof(int64_t);
          call.combine = &kSum;
          call.scratch = &scratch;
          if (!runIfFits(Collective::kAllreduce, index, link, call)) return;
          for (int64_t i = 0; i < count; ++i) {
            int64_t want = 0;
            for (int p = 0; p < size; ++p) want += value(p, i);
            ASSERT_EQ(data[static_cast<size_t>(i)], want)
                << name << " size " << size << " count " << count << " rank " << r << " element " << i;
          }
          // Floats whose sum depends on the order: every rank must still hold the same bits.
          std::vector<float> &f = floats[static_cast<size_t>(r)];
          f.resize(static_cast<size_t>(count));
          for (int64_t i = 0; i < count; ++i) f[static_cast<size_t>(i)] = 1.0f / static_cast<float>(3 + r * 7 + i);
          call.buf = f.data();
          call.esize = sizeof(float);
          call.bytes = static_cast<size_t>(count) * sizeof(float);
          call.combine = &kFloatSum;
          runIfFits(Collective::kAllreduce, index, link, call);
        });
        if (floats[0].empty()) continue;  // the algorithm does not fit this size
        for (int r = 1; r < size; ++r) {
          ASSERT_EQ(floats[0].size(), floats[static_cast<size_t>(r)].size());
          ASSERT_EQ(0, std::memcmp(floats[0].data(), floats[static_cast<size_t>(r)].data(),
                                   floats[0].size() * sizeof(float)))
              << name << " size " << size << " count " << count << ": rank " << r << " differs from rank 0";
        }
      }
    }
  }
}

TEST(Collectives, EveryReducescatterAlgorithmLeavesEachRankItsBlock) {
  for (size_t index = 0; index < collectives::table(Collective::kReducescatter).size(); ++index) {
    for (int size : kSizes) {
      for (int64_t base : {0, 3, 40}) {
        std::vector<int64_t> counts(static_cast<size_t>(size));
        for (int r = 0; r < size; ++r) counts[static_cast<size_t>(r)] = (r * 5 + base) % (base + 1) + (r == 1 ? 0 : base);
        const std::vector<int64_t> starts = [&] {
          std::vector<int64_t> s(1, 0);
          for (int64_t c : counts) s.push_back(s.back() + c);
          return s;
        }();
        onRanks(size, [&](Link &link) {
          const int r = link.rank();
          std::vector<int64_t> work(static_cast<size_t>(starts.back()));
          for (size_t i = 0; i < work.size(); ++i) work[i] = value(r, static_cast<int64_t>(i));
          std::vector<uint8_t> scratch;
          Call call;
          call.buf = work.data();
          call.sizes = &counts;
          call.esize = sizeof(int64_t);
          call.bytes = work.size() * sizeof(int64_t);
          call.combine = &kSum;
          call.scratch = &scratch;
          if (!runIfFits(Collective::kReducescatter, index, link, call)) return;
          for (int64_t i = starts[static_cast<size_t>(r)]; i < starts[static_cast<size_t>(r) + 1]; ++i) {
            int64_t want = 0;
            for (int p = 0; p < size; ++p) want += value(p, i);
            ASSERT_EQ(work[static_cast<size_t>(i)], want)
                << collectives::table(Collective::kReducescatter)[index].name << " size " << size << " rank " << r;
          }
        });
      }
    }
  }
}

TEST(Collectives, EveryBroadcastAlgorithmCopiesTheRootsBytes) {
  for (size_t index = 0; index < collectives::table(Collective::kBroadcast).size(); ++index) {
    for (int size : kSizes) {
      for (int root : {0, size - 1, size / 2}) {
        for (size_t bytes : {size_t{1}, size_t{100}, size_t{1000}}) {
          onRanks(size, [&](Link &link) {
            std::vector<uint8_t> buf(bytes);
            for (size_t i = 0; i < bytes; ++i) {
              buf[i] = static_cast<uint8_t>(link.rank() == root ? i * 31 + 7 : 0xEE);
            }
            Call call;
            call.buf = buf.data();
            call.bytes = bytes;
            call.root = root;
            ASSERT_TRUE(runIfFits(Collective::kBroadcast, index, link, call));
            for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(buf[i], static_cast<uint8_t>(i * 31 + 7));
          });
        }
      }
    }
  }
}

TEST(Collectives, EveryAllgathervAlgorithmConcatenatesInRankOrder) {
  for (size_t index = 0; index < collectives::table(Collective::kAllgatherv).size(); ++index) {
    for (int size : kSizes) {
      std::vector<int64_t> bytes(static_cast<size_t>(size));
      for (int r = 0; r < size; ++r) bytes[static_cast<size_t>(r)] = r == 1 ? 0 : 50 * r + 3;
      onRanks(size, [&](Link &link) {
        const int r = link.rank();
        std::vector<uint8_t> mine(static_cast<size_t>(bytes[static_cast<size_t>(r)]));
        for (size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<uint8_t>(r * 17 + i);
        int64_t total = 0;
        for (int64_t b : bytes) total += b;
        std::vector<uint8_t> out(static_cast<size_t>(total), 0xEE);
        Call call;
        call.in = mine.data();
        call.out = out.data();
        call.sizes = &bytes;
        call.bytes = static_cast<size_t>(total);
        ASSERT_TRUE(runIfFits(Collective::kAllgatherv, index, link, call));
        size_t at = 0;
        for (int p = 0; p < size; ++p) {
          for (int64_t i = 0; i < bytes[static_cast<size_t>(p)]; ++i, ++at) {
            ASSERT_EQ(out[at], static_cast<uint8_t>(p * 17 + i)) << "size " << size << " from rank " << p;
          }
        }
      });
    }
  }
}

TEST(Collectives, EveryAlltoallvAlgorithmDeliversEachBlockToItsRank) {
  auto amount = [](int from, int to) { return static_cast<int64_t>(((from + 2 * to) % 4) * 10); };
  auto byte = [](int from, int to, int64_t i) { return static_cast<uint8_t>(from * 41 + to * 13 + i); };
  for (size_t index = 0; index < collectives::table(Collective::kAlltoallv).size(); ++index) {
    for (int size : kSizes) {
      onRanks(size, [&](Link &link) {
        const int r = link.rank();
        std::vector<int64_t> sendBytes, recvBytes;
        std::vector<uint8_t> in, out;
        for (int p = 0; p < size; ++p) {
          sendBytes.push_back(amount(r, p));
          recvBytes.push_back(amount(p, r));
          for (int64_t i = 0; i < amount(r, p); ++i) in.push_back(byte(r, p, i));
        }
        int64_t total = 0;
        for (int64_t b : recvBytes) total += b;
        out.assign(static_cast<size_t>(total), 0xEE);
        Call call;
        call.in = in.data();
        call.out = out.data();
        call.sizes = &sendBytes;
        call.recvSizes = &recvBytes;
        call.bytes = in.size();
        ASSERT_TRUE(runIfFits(Collective::kAlltoallv, index, link, call));
        size_t at = 0;
        for (int p = 0; p < size; ++p) {
          for (int64_t i = 0; i < amount(p, r); ++i, ++at) ASSERT_EQ(out[at], byte(p, r, i));
        }
      });
    }
  }
}

TEST(Collectives, BlobsOfAnyLengthGatherAndBroadcast) {
  for (int size : {1, 2, 3, 5, 8}) {
    onRanks(size, [&](Link &link) {
      const int r = link.rank();
      const std::vector<std::string> got = collectives::gatherBlobs(link, std::string(static_cast<size_t>(r * 3), static_cast<char>('a' + r)));
      if (r == 0) {
        ASSERT_EQ(got.size(), static_cast<size_t>(size));
        for (int p = 0; p < size; ++p) EXPECT_EQ(got[static_cast<size_t>(p)], std::string(static_cast<size_t>(p * 3), static_cast<char>('a' + p)));
      } else {
        EXPECT_TRUE(got.empty());
      }
      std::string blob = r == 0 ? "the coordinator's answer" : "stale";
      collectives::broadcastBlob(link, blob);
      EXPECT_EQ(blob, "the coordinator's answer");
      std::string empty = r == 0 ? "" : "stale";
      collectives::broadcastBlob(link, empty);
      EXPECT_EQ(empty, "");
    });
  }
}

TEST(Collectives, SizeRulesPickByTheLinksTuning) {
  onRanks(4, [&](Link &link) {
    std::vector<uint8_t> scratch;
    std::vector<int64_t> small(4, 1), large(1000, 1);  // 32 bytes; 8000 bytes
    const collectives::Choices byRule;
    // Hosts of two ranks each, topology-aware: host-aware small, two-level ring large.
    EXPECT_STREQ(collectives::allreduce(link, byRule, small.data(), 4, 8, kSum, scratch), "host_aware");
    EXPECT_STREQ(collectives::allreduce(link, byRule, large.data(), 1000, 8, kSum, scratch), "hierarchical_ring");
    EXPECT_EQ(large[0], 4);  // an allreduce of ones over 4 ranks
    std::vector<uint8_t> buf(4000);
    EXPECT_STREQ(collectives::broadcast(link, byRule, buf.data(), 100, 0), "binomial");
    EXPECT_STREQ(collectives::broadcast(link, byRule, buf.data(), 4000, 0), "chain");
    const auto forced = collectives::Choices::parse("allreduce=ring,broadcast=binomial");
    EXPECT_STREQ(collectives::allreduce(link, forced, small.data(), 4, 8, kSum, scratch), "ring");
    EXPECT_STREQ(collectives::broadcast(link, forced, buf.data(), 4000, 0), "binomial");
  });
  LinkTuning flat = testTuning();
  flat.topologyAware = false;
  flat.concurrentPeers = false;
  flat.directBytes = 0;
  onRanks(3, [&](Link &link) {
    std::vector<uint8_t> scratch;
    std::vector<int64_t> small(4, 1), large(1000, 1);
    const collectives::Choices byRule;
    EXPECT_STREQ(collectives::allreduce(link, byRule, small.data(), 4, 8, kSum, scratch), "recursive_doubling");
    EXPECT_STREQ(collectives::allreduce(link, byRule, large.data(), 1000, 8, kSum, scratch), "ring");
    // A forced algorithm that cannot run here (no hosts) leaves the choice to the rule.
    const auto forced = collectives::Choices::parse("allreduce=hierarchical_ring");
    EXPECT_STREQ(collectives::allreduce(link, forced, large.data(), 1000, 8, kSum, scratch), "ring");
    std::vector<uint8_t> buf(4000);
    EXPECT_STREQ(collectives::broadcast(link, byRule, buf.data(), 4000, 0), "binomial");
    std::vector<int64_t> sizes(3, 10);
    std::vector<uint8_t> out(30);
    EXPECT_STREQ(collectives::allgatherv(link, byRule, buf.data(), out.data(), sizes), "ring");
    EXPECT_STREQ(collectives::alltoallv(link, byRule, buf.data(), sizes, out.data(), sizes), "pairwise");
  }, flat);
}

TEST(Collectives, ABadAlgorithmKnobNamesTheTables) {
  for (const char *bad : {"allreduce=nope", "gather=ring", "ring"}) {
    try {
      collectives::Choices::parse(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error &e) {
      EXPECT_EQ(e.status(), HORA_ERR_INVALID_ARGUMENT);
      const std::string what = e.what();
      EXPECT_NE(what.find("HORA_ALGORITHM"), std::string::npos) << what;
      EXPECT_NE(what.find("recursive_doubling"), std::string::npos) << what;
    }
  }
  const std::string tables = collectives::describeTables();
  for (const char *name : {"allreduce:", "host_aware", "direct", "hierarchical_ring", "ring",
                           "reducescatter:", "broadcast:", "binomial", "chain", "allgatherv:",
                           "alltoallv:", "pairwise"}) {
    EXPECT_NE(tables.find(name), std::string::npos) << name;
  }
}

// The backend over a link: dtype handling around the algorithms, and the timeline's name.
TEST(Collectives, LinkBackendRunsTheTablesAndSaysWhichAlgorithmRan) {
  onRanks(3, [&](Link &link) {
    std::shared_ptr<Link> shared(&link, [](Link *) {});
    Knobs knobs;
    knobs.algorithm = "allreduce=direct";
    LinkBackend backend(shared, BackendCaps::plain(false, BackendCaps::Scope::kAnyHost), knobs, true);
    const int r = link.rank();
    std::vector<double> in{1.0 * r, 2.0 * r, 3.0 * r}, out(3);
    backend.allreduce(in.data(), out.data(), 3, DType::kFloat64, ReduceOp::kMax);
    EXPECT_EQ(out, (std::vector<double>{2.0, 4.0, 6.0}));
    EXPECT_STREQ(backend.lastAlgorithm(), "direct");
    // Booleans are 0 or 1 after any reduction; reducescatter keeps the caller's input.
    std::vector<uint8_t> flags{static_cast<uint8_t>(r == 2 ? 7 : 0), 1, 5}, result(1);
    const std::vector<uint8_t> kept = flags;
    backend.reducescatter(flags.data(), result.data(), {1, 1, 1}, DType::kBool, ReduceOp::kMax);
    EXPECT_EQ(result[0], r == 0 ? 1 : 1);
    EXPECT_EQ(flags, kept);
    std::vector<uint64_t> words{~0ull, 0xF0F0ull | static_cast<uint64_t>(r)};
    backend.negotiationPlane()->allreduceAnd(words);
    EXPECT_EQ(words[1], 0xF0F0ull);
  });
}

}  // namespace
}  // namespace hora

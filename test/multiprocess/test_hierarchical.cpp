// SPDX-License-Identifier: Apache-2.0
// Allreduce on sets that span hosts, where hora reduces inside each host through shared memory
// and across hosts among one rank per host and share (HORA_HIERARCHICAL=on; test/netns runs this
// on namespace hosts, 2 x 2 and 3 x 2). The sets: the world, the world less one rank of the last
// host (hosts hold different numbers of the set's ranks), and one host's ranks plus one rank of
// every other host (one rank per host carries the shares). Every dtype x op, in place and out of
// place, from one element to several pipeline windows cut into uneven shares, with pre/post
// scaling and many tensors fused into one operation; allgather with uneven blocks and broadcast
// from every root, which go hierarchical too; every element is checked against a value computed
// here, and every rank of a set must hold the same bytes. On one host (mpirun, CI's
// multiprocess suite) the same sets run flat, which checks the test itself.
#include <hora/hora.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mp_cases.h"
#include "mp_harness.h"
#include "mp_ops.h"

namespace {

using mp::AllgatherCase;
using mp::AllreduceCase;
using mp::BroadcastCase;
using mp::Case;
using mp::DType;
using mp::HostTensor;

// Elements: one, a few, and (for every dtype) more than one 512 KiB pipeline window of float32,
// a count that no number of owners divides into whole 64-byte units.
const std::vector<int64_t> kCounts = {1, 37, 200003};

struct World {
  std::vector<int> host;   // by world rank: its host's index (hora_cross_rank of its local rank 0)
  std::vector<int> local;  // by world rank: hora_local_rank
  int hosts = 0;
};

// Every rank's host and local index, as hora reports them.
World worldLayout() {
  World w;
  const auto rows = mp::allgatherRows("hier.layout", {hora_local_rank(), hora_cross_rank(),
                                                      hora_local_size()});
  // Ranks with local rank 0 number the hosts (their cross rank); the others follow theirs.
  std::map<int64_t, int> hostOfLeader;
  for (size_t r = 0; r < rows.size(); ++r) {
    if (rows[r][0] == 0) hostOfLeader[static_cast<int64_t>(r)] = static_cast<int>(rows[r][1]);
  }
  w.hosts = static_cast<int>(hostOfLeader.size());
  // Ranks of one host are consecutive under every launcher hora's tests use (horarun and
  // hora-cluster place them so; mpirun fills hosts in order by default).
  int current = -1;
  for (size_t r = 0; r < rows.size(); ++r) {
    if (rows[r][0] == 0) current = hostOfLeader[static_cast<int64_t>(r)];
    w.host.push_back(current);
    w.local.push_back(static_cast<int>(rows[r][0]));
  }
  return w;
}

// The sets this test runs on, by name: members in world-rank order.
std::vector<std::pair<std::string, std::vector<int>>> setsOf(const World &w) {
  const int n = static_cast<int>(w.host.size());
  std::vector<std::pair<std::string, std::vector<int>>> sets;
  std::vector<int> all(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) all[static_cast<size_t>(r)] = r;
  sets.emplace_back("world", all);
  if (n >= 3) {
    std::vector<int> lessOne(all.begin(), all.end() - 1);  // the last host loses a rank
    sets.emplace_back("uneven", lessOne);
    std::vector<int> hostAndOne;  // all of host 0, local rank 0 of the others
    for (int r = 0; r < n; ++r) {
      if (w.host[static_cast<size_t>(r)] == 0 || w.local[static_cast<size_t>(r)] == 0) hostAndOne.push_back(r);
    }
    if (hostAndOne.size() >= 2 && hostAndOne != all && hostAndOne != lessOne) {
      sets.emplace_back("one_per_host", hostAndOne);
    }
  }
  return sets;
}

// An allreduce into a tensor of its own (out of place); the input must be left as it was.
class OutOfPlaceCase : public Case {
 public:
  OutOfPlaceCase(std::string name, int32_t set, const DType &dt, int64_t count, hora_reduce_op_t op,
                 int64_t salt, double pre, double post)
      : Case(std::move(name), set), dt_(dt), count_(count), op_(op), salt_(salt), pre_(pre), post_(post) {}

 protected:
  hora_status_t doSubmit(hora_request_t *req) override {
    in_ = mp::makeTensor(dt_, {count_});
    out_ = mp::makeTensor(dt_, {count_});
    mp::fillInputAs(*in_, op_, salt_, me_, n_);
    out_->fill([](int64_t) { return 0.0; });
    return hora_allreduce_async(name_.c_str(), in_->dl(), out_->dl(), op_, pre_, post_, set_, req);
  }
  void doCheck() override {
    EXPECT_TRUE(mp::matchesReductionOf(*out_, op_, salt_, pre_, post_, n_)) << name_;
    EXPECT_TRUE(mp::matches(*in_, [&](int64_t j) { return mp::inputValue(op_, dt_, me_, n_, j, salt_); }))
        << name_ << ": the input changed";
  }

 private:
  DType dt_;
  int64_t count_;
  hora_reduce_op_t op_;
  int64_t salt_;
  double pre_, post_;
  std::unique_ptr<HostTensor> in_, out_;
};

// FNV-1a of a tensor's bytes, for comparing results across ranks without moving them.
int64_t digest(const HostTensor &t) {
  const auto *p = static_cast<const unsigned char *>(t.dl()->data);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < static_cast<size_t>(t.numel()) * t.dtype().bytes(); ++i) {
    h = (h ^ p[i]) * 1099511628211ull;
  }
  return static_cast<int64_t>(h >> 1);
}

class Hierarchical : public ::testing::Test {
 protected:
  void SetUp() override {
    world_ = worldLayout();
    for (const auto &named : setsOf(world_)) {
      const int32_t id = named.first == "world" ? 0 : mp::createSet(named.second);
      sets_.push_back({named.first, id, named.second});
    }
  }
  void TearDown() override {
    for (const Set &s : sets_) {
      if (s.id > 0) hora_process_set_destroy(s.id);
    }
  }
  struct Set {
    std::string name;
    int32_t id;
    std::vector<int> ranks;
  };
  bool member(const Set &s) const { return mp::contains(s.ranks, mp::rank()); }

  World world_;
  std::vector<Set> sets_;
};

// Every dtype x op x count, in place and out of place, all of a set's cases submitted before any
// is waited for: many tensors in flight, fused where the runtime fuses them.
TEST_F(Hierarchical, EveryDtypeOpAndSizeInPlaceAndOut) {
  for (const Set &s : sets_) {
    if (!member(s)) continue;
    std::vector<std::unique_ptr<Case>> cases;
    int64_t salt = 1;
    for (const DType &dt : mp::allDTypes()) {
      for (hora_reduce_op_t op : mp::allOps()) {
        if (op == HORA_OP_AVERAGE && !dt.floating) continue;  // refused: an integer average truncates
        for (int64_t count : kCounts) {
          const std::string tag = s.name + "." + dt.name + "." + mp::opName(op) + "." + std::to_string(count);
          cases.push_back(std::make_unique<AllreduceCase>("hier.in." + tag, s.id, dt,
                                                          std::vector<int64_t>{count}, op, salt++));
          cases.push_back(
              std::make_unique<OutOfPlaceCase>("hier.out." + tag, s.id, dt, count, op, salt++, 1.0, 1.0));
        }
      }
    }
    for (auto &c : cases) c->submit();
    for (auto &c : cases) c->check();
  }
}

// Prescale and postscale on every floating dtype and every op that takes them.
TEST_F(Hierarchical, PrescaleAndPostscale) {
  for (const Set &s : sets_) {
    if (!member(s)) continue;
    std::vector<std::unique_ptr<Case>> cases;
    int64_t salt = 7;
    for (const DType &dt : mp::floatDTypes()) {
      for (hora_reduce_op_t op : {HORA_OP_SUM, HORA_OP_AVERAGE, HORA_OP_MAX}) {
        for (int64_t count : kCounts) {
          const std::string tag = s.name + "." + dt.name + "." + mp::opName(op) + "." + std::to_string(count);
          cases.push_back(std::make_unique<OutOfPlaceCase>("hier.scaled." + tag, s.id, dt, count, op,
                                                           salt++, 0.5, 4.0));
        }
      }
    }
    for (auto &c : cases) c->submit();
    for (auto &c : cases) c->check();
  }
}

// Allgather (gathered inside each host, exchanged once per host, shared inside) with blocks that
// differ per rank, some empty, small and past a MiB; broadcast from every root of the set.
TEST_F(Hierarchical, AllgatherAndBroadcast) {
  for (const Set &s : sets_) {
    if (!member(s)) continue;
    const int n = static_cast<int>(s.ranks.size());
    std::vector<std::unique_ptr<Case>> cases;
    int64_t salt = 11;
    for (const DType &dt : {mp::dtypeNamed("uint8"), mp::f32(), mp::f64()}) {
      for (int64_t width : {int64_t{3}, int64_t{70001}}) {
        const std::string tag = s.name + "." + dt.name + "." + std::to_string(width);
        cases.push_back(std::make_unique<AllgatherCase>(
            "hier.gather." + tag, s.id, dt, [](int r) { return static_cast<int64_t>((r * 5 + 2) % 4); },
            std::vector<int64_t>{width}, salt++));
        for (int root = 0; root < n; ++root) {
          cases.push_back(std::make_unique<BroadcastCase>("hier.bcast." + tag + "." + std::to_string(root), s.id, dt,
                                                          std::vector<int64_t>{2, width}, root, salt++));
        }
      }
    }
    for (auto &c : cases) c->submit();
    for (auto &c : cases) c->check();
  }
}

// The result's bytes are the same on every rank of the set, for a float32 sum whose inputs are
// not small integers (so that the order of additions would show in the bits).
TEST_F(Hierarchical, EveryRankHoldsTheSameBits) {
  for (const Set &s : sets_) {
    if (!member(s)) continue;
    const int me = hora_process_set_rank(s.id);
    for (int64_t count : kCounts) {
      auto t = mp::makeTensor(mp::f32(), {count});
      t->fill([&](int64_t j) { return 1.0 / (3.0 + static_cast<double>((j * 7 + me * 13) % 101)); });
      const std::string name = "hier.bits." + s.name + "." + std::to_string(count);
      hora_request_t req = nullptr;
      MP_ASSERT_OK(hora_allreduce_async(name.c_str(), t->dl(), t->dl(), HORA_OP_SUM, 1.0, 1.0, s.id, &req));
      mp::Request guard(req);
      MP_ASSERT_OK(hora_wait(req)) << name;
      const auto digests = mp::allgatherRows(name + ".digest", {digest(*t)}, s.id);
      for (size_t r = 1; r < digests.size(); ++r) {
        EXPECT_EQ(digests[0][0], digests[r][0]) << name << ": set rank " << r << " holds other bits than set rank 0";
      }
    }
  }
}

}  // namespace

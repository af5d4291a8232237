// SPDX-License-Identifier: Apache-2.0
// Soak: rounds of random collectives for a bounded time (HORA_SOAK_SECONDS, default 20). Every
// rank draws the same operations from the round's seed (kinds, dtypes, sizes, reduce ops,
// scales, roots, splits, process sets), then hands them to its user threads in an order of its
// own; each thread submits its share asynchronously and waits for it. Every result is checked
// against values computed here.
#include <hora/hora.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "mp_harness.h"

namespace {

using mp::DType;
using mp::HostTensor;
using mp::makeTensor;

constexpr int kThreads = 3;

enum class Kind { kAllreduce, kGrouped, kAllgather, kBroadcast, kAlltoall, kReducescatter };

const char *kindName(Kind k) {
  switch (k) {
    case Kind::kAllreduce: return "allreduce";
    case Kind::kGrouped: return "grouped_allreduce";
    case Kind::kAllgather: return "allgather";
    case Kind::kBroadcast: return "broadcast";
    case Kind::kAlltoall: return "alltoall";
    case Kind::kReducescatter: return "reducescatter";
  }
  return "?";
}

struct Set {
  int32_t id = 0;
  std::vector<int> ranks;  // world ranks
  int rank = -1;           // this rank's rank in the set, -1 if not a member
  int size() const { return static_cast<int>(ranks.size()); }
};

struct Op {
  Kind kind = Kind::kAllreduce;
  std::string name;
  const Set *set = nullptr;
  const DType *dt = nullptr;
  hora_reduce_op_t redop = HORA_OP_SUM;
  double pre = 1, post = 1;
  int root = 0;
  int64_t cols = 1;
  std::vector<int64_t> counts;  // allreduce: elements per tensor; others: rows by set rank
  int64_t salt = 0;
  std::vector<std::unique_ptr<HostTensor>> tensors;
  hora_request_t request = nullptr;
  hora_status_t submitted = HORA_SUCCESS, waited = HORA_SUCCESS;
  std::string error;

  std::string describe() const {
    std::ostringstream s;
    s << kindName(kind) << " '" << name << "' " << dt->name << " set " << set->id << " op "
      << mp::opName(redop) << " pre " << pre << " post " << post << " root " << root << " cols "
      << cols << " counts";
    for (int64_t c : counts) s << ' ' << c;
    return s.str();
  }
};

double gatherValue(int k, int64_t row, int64_t col) { return static_cast<double>((k * 7 + row * 3 + col) % 50); }
double broadcastValue(int k, int64_t j) { return static_cast<double>((k * 5 + j) % 60); }
double alltoallValue(int sender, int receiver, int64_t row, int64_t col) {
  return static_cast<double>((sender * 11 + receiver * 3 + row + col) % 70);
}
// rows sender k sends to receiver j in alltoall op `i` of a round
int64_t alltoallRows(int k, int j, int64_t i) { return (k + 2 * j + i) % 3; }

// The round's operations: the same on every rank (one seed), whatever each rank's membership.
std::vector<std::unique_ptr<Op>> planRound(uint64_t seed, int round, const Set &world,
                                           const Set *subset) {
  std::mt19937_64 rng(seed * 1000003u + static_cast<uint64_t>(round));
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  const std::vector<int64_t> sizes = {1, 3, 64, 1000, 4096, 50000, 262144};
  const std::vector<double> scales = {1, 1, 2, 0.5};
  const int count = 4 + static_cast<int>(pick(13));
  std::vector<std::unique_ptr<Op>> ops;
  for (int i = 0; i < count; ++i) {
    auto op = std::make_unique<Op>();
    op->kind = static_cast<Kind>(pick(6));
    op->name = "soak." + std::to_string(round) + "." + std::to_string(i);
    op->set = subset != nullptr && pick(10) < 3 ? subset : &world;
    op->salt = round * 100 + i;
    const int n = op->set->size();
    switch (op->kind) {
      case Kind::kAllreduce:
      case Kind::kGrouped: {
        op->dt = &mp::allDTypes()[pick(mp::allDTypes().size())];
        op->redop = mp::allOps()[pick(mp::allOps().size())];
        if (!op->dt->floating && op->redop == HORA_OP_AVERAGE) op->redop = HORA_OP_SUM;
        if (op->dt->floating) {
          op->pre = scales[pick(scales.size())];
          op->post = scales[pick(scales.size())];
        }
        const int tensors = op->kind == Kind::kGrouped ? 2 + static_cast<int>(pick(4)) : 1;
        for (int t = 0; t < tensors; ++t) op->counts.push_back(sizes[pick(sizes.size())]);
        break;
      }
      case Kind::kReducescatter:
        op->dt = &mp::allDTypes()[pick(mp::allDTypes().size())];
        op->redop = std::vector<hora_reduce_op_t>{HORA_OP_SUM, HORA_OP_MIN, HORA_OP_MAX}[pick(3)];
        op->cols = std::vector<int64_t>{1, 7, 300}[pick(3)];
        op->counts = {n + static_cast<int64_t>(pick(static_cast<size_t>(3 * n)))};  // rows
        break;
      case Kind::kAllgather:
      case Kind::kAlltoall:
      case Kind::kBroadcast:
        op->dt = &mp::allDTypes()[pick(mp::allDTypes().size())];
        op->cols = std::vector<int64_t>{1, 5, 300, 4096}[pick(4)];
        op->root = static_cast<int>(pick(static_cast<size_t>(n)));
        for (int k = 0; k < n; ++k) op->counts.push_back((k + i) % 3);  // allgather rows
        break;
    }
    ops.push_back(std::move(op));
  }
  return ops;
}

// This rank's tensors for `op`, and its submission.
void submit(Op &op) {
  const Set &set = *op.set;
  const int me = set.rank, n = set.size();
  hora_status_t s = HORA_SUCCESS;
  switch (op.kind) {
    case Kind::kAllreduce:
    case Kind::kGrouped: {
      std::vector<DLTensor> dls;
      for (size_t t = 0; t < op.counts.size(); ++t) {
        op.tensors.push_back(makeTensor(*op.dt, {op.counts[t]}));
        const int64_t salt = op.salt * 8 + static_cast<int64_t>(t);
        op.tensors.back()->fill([&](int64_t j) {
          return mp::inputValue(op.redop, *op.dt, me, n, j, salt);
        });
        dls.push_back(*op.tensors.back()->dl());
      }
      if (op.kind == Kind::kAllreduce) {
        s = hora_allreduce_async(op.name.c_str(), &dls[0], op.tensors[0]->dl(), op.redop, op.pre,
                                 op.post, set.id, &op.request);
      } else {
        s = hora_grouped_allreduce_async(op.name.c_str(), static_cast<int>(dls.size()),
                                         dls.data(), dls.data(), op.redop, op.pre, op.post,
                                         set.id, &op.request);
      }
      break;
    }
    case Kind::kAllgather: {
      op.tensors.push_back(makeTensor(*op.dt, {op.counts[static_cast<size_t>(me)], op.cols}));
      op.tensors[0]->fill([&](int64_t e) { return gatherValue(me, e / op.cols, e % op.cols); });
      s = hora_allgather_async(op.name.c_str(), op.tensors[0]->dl(), set.id, &op.request);
      break;
    }
    case Kind::kBroadcast: {
      op.tensors.push_back(makeTensor(*op.dt, {3, op.cols}));
      op.tensors[0]->fill([&](int64_t j) { return broadcastValue(me, j); });
      s = hora_broadcast_async(op.name.c_str(), op.tensors[0]->dl(), op.root, set.id, &op.request);
      break;
    }
    case Kind::kAlltoall: {
      const int64_t index = std::stoll(op.name.substr(op.name.rfind('.') + 1));
      std::vector<int64_t> splits;
      int64_t rows = 0;
      for (int j = 0; j < n; ++j) {
        splits.push_back(alltoallRows(me, j, index));
        rows += splits.back();
      }
      op.tensors.push_back(makeTensor(*op.dt, {rows, op.cols}));
      int64_t at = 0;
      for (int j = 0; j < n; ++j) {
        for (int64_t r = 0; r < splits[static_cast<size_t>(j)]; ++r, ++at) {
          for (int64_t c = 0; c < op.cols; ++c) {
            op.tensors[0]->set(at * op.cols + c, alltoallValue(me, j, r, c));
          }
        }
      }
      s = hora_alltoall_async(op.name.c_str(), op.tensors[0]->dl(), splits.data(), set.id,
                              &op.request);
      break;
    }
    case Kind::kReducescatter: {
      op.tensors.push_back(makeTensor(*op.dt, {op.counts[0], op.cols}));
      op.tensors[0]->fill([&](int64_t j) { return mp::inputValue(op.redop, *op.dt, me, n, j, op.salt); });
      s = hora_reducescatter_async(op.name.c_str(), op.tensors[0]->dl(), op.redop, set.id,
                                   &op.request);
      break;
    }
  }
  op.submitted = s;
  if (s != HORA_SUCCESS) op.error = mp::lastError();
}

void wait(Op &op) {
  if (op.submitted != HORA_SUCCESS) return;
  op.waited = hora_wait(op.request);
  if (op.waited != HORA_SUCCESS) op.error = mp::lastError();
}

void check(Op &op) {
  SCOPED_TRACE(op.describe());
  ASSERT_EQ(op.submitted, HORA_SUCCESS) << "submission: " << op.error;
  ASSERT_EQ(op.waited, HORA_SUCCESS) << "wait: " << op.error;
  const Set &set = *op.set;
  const int me = set.rank, n = set.size();
  switch (op.kind) {
    case Kind::kAllreduce:
    case Kind::kGrouped:
      for (size_t t = 0; t < op.tensors.size(); ++t) {
        const int64_t salt = op.salt * 8 + static_cast<int64_t>(t);
        auto want = [&](int64_t j) {
          return mp::expectedValue(op.redop, *op.dt, n, j, salt, op.pre, op.post);
        };
        EXPECT_TRUE(mp::matches(*op.tensors[t], want, [&](int64_t j) {
          return mp::tolerance(op.redop, *op.dt, want(j));
        })) << "tensor " << t;
      }
      break;
    case Kind::kAllgather: {
      const DLTensor *out = hora_request_output(op.request);
      ASSERT_NE(out, nullptr);
      std::vector<double> want;
      for (int k = 0; k < n; ++k) {
        for (int64_t r = 0; r < op.counts[static_cast<size_t>(k)]; ++r) {
          for (int64_t c = 0; c < op.cols; ++c) want.push_back(gatherValue(k, r, c));
        }
      }
      ASSERT_EQ(mp::numel(*out), static_cast<int64_t>(want.size()));
      EXPECT_TRUE(mp::matches(*out, [&](int64_t e) { return want[static_cast<size_t>(e)]; }));
      break;
    }
    case Kind::kBroadcast:
      EXPECT_TRUE(mp::matches(*op.tensors[0], [&](int64_t j) { return broadcastValue(op.root, j); }));
      break;
    case Kind::kAlltoall: {
      const int64_t index = std::stoll(op.name.substr(op.name.rfind('.') + 1));
      const DLTensor *out = hora_request_output(op.request);
      const int64_t *received = hora_request_received_splits(op.request);
      ASSERT_NE(out, nullptr);
      ASSERT_NE(received, nullptr);
      std::vector<double> want;
      for (int s = 0; s < n; ++s) {
        EXPECT_EQ(received[s], alltoallRows(s, me, index)) << "rows from set rank " << s;
        for (int64_t r = 0; r < alltoallRows(s, me, index); ++r) {
          for (int64_t c = 0; c < op.cols; ++c) want.push_back(alltoallValue(s, me, r, c));
        }
      }
      ASSERT_EQ(mp::numel(*out), static_cast<int64_t>(want.size()));
      EXPECT_TRUE(mp::matches(*out, [&](int64_t e) { return want[static_cast<size_t>(e)]; }));
      break;
    }
    case Kind::kReducescatter: {
      const DLTensor *out = hora_request_output(op.request);
      ASSERT_NE(out, nullptr);
      const int64_t rows = op.counts[0];
      int64_t start = 0;
      for (int k = 0; k < me; ++k) start += rows / n + (k < rows % n ? 1 : 0);
      const int64_t mine = rows / n + (me < rows % n ? 1 : 0);
      ASSERT_EQ(mp::numel(*out), mine * op.cols);
      EXPECT_TRUE(mp::matches(*out, [&](int64_t e) {
        return mp::expectedValue(op.redop, *op.dt, n, start * op.cols + e, op.salt, 1, 1);
      }));
      break;
    }
  }
}

TEST(Soak, RandomCollectivesFromSeveralThreads) {
  const char *env = std::getenv("HORA_SOAK_SECONDS");
  const double seconds = env != nullptr ? std::atof(env) : 20.0;
  const uint64_t seed = 20261124;
  const int rank = mp::rank(), size = mp::size();

  Set world;
  world.id = 0;
  world.rank = rank;
  for (int r = 0; r < size; ++r) world.ranks.push_back(r);
  std::unique_ptr<Set> subset;
  if (size >= 3) {  // the first and last ranks: a set some ranks are not in
    subset = std::make_unique<Set>();
    subset->ranks = {0, size - 1};
    MP_ASSERT_OK(hora_process_set_create(subset->ranks.data(), 2, &subset->id));
    subset->rank = rank == 0 ? 0 : rank == size - 1 ? 1 : -1;
  }

  std::mt19937_64 mine(seed ^ (0x9e3779b97f4a7c15ull * static_cast<uint64_t>(rank + 1)));
  const auto start = std::chrono::steady_clock::now();
  int rounds = 0;
  int64_t checked = 0;
  for (bool more = true; more; ++rounds) {
    std::vector<std::unique_ptr<Op>> plan = planRound(seed, rounds, world, subset.get());
    std::vector<Op *> todo;
    for (auto &op : plan) {
      if (op->set->rank >= 0) todo.push_back(op.get());
    }
    // this rank's order and split over its threads
    std::shuffle(todo.begin(), todo.end(), mine);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&todo, t] {
        std::vector<Op *> share;
        for (size_t i = static_cast<size_t>(t); i < todo.size(); i += kThreads) share.push_back(todo[i]);
        for (Op *op : share) submit(*op);
        for (Op *op : share) wait(*op);
      });
    }
    for (std::thread &th : threads) th.join();
    for (Op *op : todo) {
      check(*op);
      hora_request_free(op->request);
      ++checked;
    }
    if (::testing::Test::HasFailure()) break;
    // rank 0's clock decides for everyone
    int32_t go = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds;
    int64_t one = 1;
    DLTensor flag = {&go, {kDLCPU, 0}, 1, {kDLInt, 32, 1}, &one, nullptr, 0};
    hora_request_t r = nullptr;
    const std::string name = "soak.continue." + std::to_string(rounds);
    MP_ASSERT_OK(hora_broadcast_async(name.c_str(), &flag, 0, 0, &r));
    MP_ASSERT_OK(hora_wait(r));
    hora_request_free(r);
    more = go != 0;
  }
  if (subset) {
    MP_EXPECT_OK(hora_process_set_destroy(subset->id));
  }
  std::printf("rank %d: %d rounds, %lld collectives checked in %.1f s\n", rank, rounds,
              static_cast<long long>(checked),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  EXPECT_GE(checked, 20) << "the soak ran too few collectives to mean anything";
}

}  // namespace

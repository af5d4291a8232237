// SPDX-License-Identifier: Apache-2.0
#include "backends/shm/shm_barrier.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "base/error.h"
#include "base/process.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HORA_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define HORA_CPU_RELAX() asm volatile("yield")
#else
#define HORA_CPU_RELAX() ((void)0)
#endif

namespace hora {
namespace {

// About 75 us of pause instructions (19 ns each on this machine class) before sleeping: a futex
// sleep and wake-up costs tens of microseconds on these VMs, more than a peer that is one step
// behind takes to arrive (measured, 4 KiB blocking allreduce: 16 us with this spin, 90-300 us
// with a 4 us one).
constexpr int kSpinPauses = 4000;

long futex(std::atomic<uint32_t> *word, int op, uint32_t value, const timespec *timeout) {
  // Shared (not FUTEX_PRIVATE) operations: the word is in memory mapped by several processes.
  return syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), op, value, timeout, nullptr, 0);
}

}  // namespace

ShmBarrier::ShmBarrier(ShmBarrierState *state, int rank, std::vector<int> pids, double timeoutS,
                       bool spin)
    : state_(state), rank_(rank), pids_(std::move(pids)), timeoutS_(timeoutS), spin_(spin) {
  HORA_ENFORCE(pids_.size() <= static_cast<size_t>(ShmBarrierState::kMaxRanks), pids_.size(),
               " ranks");
  epoch_ = state_->reached[rank_].load(std::memory_order_relaxed);
}

bool ShmBarrier::everyoneReached(uint64_t epoch) const {
  for (size_t r = 0; r < pids_.size(); ++r) {
    if (state_->reached[r].load(std::memory_order_acquire) < epoch) return false;
  }
  return true;
}

void ShmBarrier::wakeSleepers() {
  state_->wakeups.fetch_add(1);  // seq_cst: pairs with the sleeper count in block()
  if (state_->sleepers.load() != 0) {
    futex(&state_->wakeups, FUTEX_WAKE, INT32_MAX, nullptr);
  }
}

template <typename Ready, typename Behind>
void ShmBarrier::block(const char *what, Ready ready, Behind behind) {
  if (ready()) return;
  // A short spin catches a peer that is a few microseconds behind without a sleep and wake-up;
  // on an oversubscribed host it only steals the peer's core, so it is skipped there.
  if (spin_) {
    for (int i = 0; i < kSpinPauses; ++i) {
      HORA_CPU_RELAX();
      if ((i & 15) == 15 && ready()) return;
    }
  }
  auto waitedFor = [&] {
    std::string ranks;
    for (size_t r = 0; r < pids_.size(); ++r) {
      if (behind(r)) ranks += detail::concat(ranks.empty() ? "" : ",", r);
    }
    return ranks;
  };
  const auto start = std::chrono::steady_clock::now();
  const timespec slice{0, 100 * 1000 * 1000};  // wake to look for lost peers and the deadline
  for (;;) {
    const uint32_t seen = state_->wakeups.load();
    if (ready()) return;
    state_->sleepers.fetch_add(1);
    // Re-check after announcing ourselves: an arrival between the load and here either bumped
    // `wakeups` (futex_wait returns at once) or saw sleepers != 0 and wakes us.
    if (!ready()) futex(&state_->wakeups, FUTEX_WAIT, seen, &slice);
    state_->sleepers.fetch_sub(1);
    if (ready()) return;
    interrupted_.check();

    for (size_t r = 0; r < pids_.size(); ++r) {
      const int32_t failed = behind(r) ? state_->failed[r].load(std::memory_order_acquire) : 0;
      if (failed != 0) {
        HORA_THROW(static_cast<hora_status_t>(failed), "shared-memory ", what, ": rank ", r, " of this host failed its part (",
                   statusString(static_cast<hora_status_t>(failed)), "; its log says why)");
      }
      if (behind(r) && processGone(pids_[r])) {
        HORA_THROW(HORA_ERR_PEER_LOST, "shared-memory ", what, ": rank ", r, " (pid ", pids_[r],
                   ") has exited; ranks ", waitedFor(), " never arrived");
      }
    }
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > timeoutS_) {
      HORA_THROW(HORA_ERR_TIMEOUT, "shared-memory ", what, ": rank ", rank_, " waited ", waited,
                 " s (HORA_TIMEOUT_S) for ranks ", waitedFor());
    }
  }
}

void ShmBarrier::wait(const char *what) {
  const uint64_t epoch = ++epoch_;
  state_->reached[rank_].store(epoch, std::memory_order_release);
  wakeSleepers();
  std::atomic_thread_fence(std::memory_order_seq_cst);  // reached[] before bellArmed[] (ShmBell)
  for (size_t r = 0; r < pids_.size(); ++r) {
    if (static_cast<int>(r) != rank_ && state_->bellArmed[r].load() != 0) {
      state_->bell[r].fetch_add(1);
      futex(&state_->bell[r], FUTEX_WAKE, 1, nullptr);
    }
  }
  block(what, [&] { return everyoneReached(epoch); },
        [&](size_t r) { return state_->reached[r].load(std::memory_order_acquire) < epoch; });
}

void ShmBarrier::interrupt(const Status &why) {
  if (!interrupted_.raise(why)) return;
  fail(why.code);
}

void ShmBarrier::fail(int status) {
  state_->failed[rank_].store(status != 0 ? status : HORA_ERR_INTERNAL, std::memory_order_release);
  wakeSleepers();
}

void ShmBarrier::publish(int stage, uint64_t value) {
  state_->progress[rank_].stage[stage].store(value, std::memory_order_release);
  wakeSleepers();
}

void ShmBarrier::awaitPeers(int stage, uint64_t value, const char *what) {
  auto behind = [&](size_t r) {
    return static_cast<int>(r) != rank_ &&
           state_->progress[r].stage[stage].load(std::memory_order_acquire) < value;
  };
  block(what,
        [&] {
          for (size_t r = 0; r < pids_.size(); ++r) {
            if (behind(r)) return false;
          }
          return true;
        },
        behind);
}

double ShmBarrier::pingPong(int peer, int rounds) {
  const int line = rank_ == 0 ? peer : rank_;
  HORA_ENFORCE(line > 0 && line < static_cast<int>(pids_.size()) && (rank_ == 0 || peer == 0),
               "ping between ranks ", rank_, " and ", peer);
  pinged_.resize(pids_.size(), 0);
  std::atomic<uint64_t> &word = state_->ping[line].value;
  uint64_t &at = pinged_[static_cast<size_t>(line)];
  // Rank 0 writes odd values, the peer the next even one. A store wakes the other side only if
  // it has given up spinning (a peer preempted for long), which block() covers.
  auto send = [&](uint64_t v) {
    word.store(v);
    if (state_->sleepers.load() != 0) wakeSleepers();
  };
  auto await = [&](uint64_t v) {
    for (int i = 0; i < (1 << 20); ++i) {
      if (word.load(std::memory_order_acquire) >= v) return;
      HORA_CPU_RELAX();
    }
    block("cache-line probe", [&] { return word.load(std::memory_order_acquire) >= v; },
          [&](size_t r) { return static_cast<int>(r) == peer; });
  };
  auto bounce = [&] {
    if (rank_ == 0) {
      send(at + 1);
      await(at + 2);
    } else {
      await(at + 1);
      send(at + 2);
    }
    at += 2;
  };
  // One untimed round trip first: it waits for the other side to arrive. Then the fastest of
  // four batches, so that a preemption or an interrupt in one batch does not count.
  bounce();
  double best = 0;
  const int batch = std::max(rounds / 4, 1);
  for (int b = 0; b < 4; ++b) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < batch; ++i) bounce();
    const double ns =
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() / batch;
    if (b == 0 || ns < best) best = ns;
  }
  return best;
}

bool ShmBell::arm(uint32_t *ticket) {
  *ticket = state_->bell[rank_].load();
  state_->bellArmed[rank_].store(1);
  std::atomic_thread_fence(std::memory_order_seq_cst);  // bellArmed[] before reached[]
  const uint64_t mine = state_->reached[rank_].load();
  for (int r = 0; r < size_; ++r) {
    if (state_->reached[r].load() > mine) {  // a peer has started the next cycle
      state_->bellArmed[rank_].store(0);
      return false;
    }
  }
  return true;
}

void ShmBell::sleep(uint32_t ticket, std::chrono::nanoseconds limit) {
  if (limit.count() > 0) {
    const timespec slice{static_cast<time_t>(limit.count() / 1000000000),
                         static_cast<long>(limit.count() % 1000000000)};
    futex(&state_->bell[rank_], FUTEX_WAIT, ticket, &slice);
  }
  state_->bellArmed[rank_].store(0);
}

void ShmBell::ring() {
  state_->bell[rank_].fetch_add(1);
  futex(&state_->bell[rank_], FUTEX_WAKE, 1, nullptr);
}

}  // namespace hora

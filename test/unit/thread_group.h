// SPDX-License-Identifier: Apache-2.0
// Ranks as threads: an in-memory ControlPlane so negotiation can be tested without MPI.
#pragma once

#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/control_plane.h"

namespace hora::test {

// Shared state of N in-process ranks. Each collective is a generation-counted rendezvous.
class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : size_(size), slots_(static_cast<size_t>(size)) {}
  int size() const { return size_; }

  // Every rank deposits `mine`, waits for all, then `combine` sees all deposits (same on every
  // rank); returns what combine returns for this rank.
  template <typename T>
  T exchange(int rank, const std::string &mine,
             const std::function<T(const std::vector<std::string> &)> &combine) {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t gen = generation_;
    slots_[static_cast<size_t>(rank)] = mine;
    if (++arrived_ == size_) {
      snapshot_ = slots_;
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != gen; });
    }
    std::vector<std::string> all = snapshot_;
    // Hold the snapshot until every rank of this generation has read it.
    if (++readers_ == size_) {
      readers_ = 0;
      ++readGeneration_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return readGeneration_ != gen; });
    }
    lock.unlock();
    return combine(all);
  }

 private:
  int size_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::string> slots_, snapshot_;
  int arrived_ = 0, readers_ = 0;
  uint64_t generation_ = 0, readGeneration_ = 0;
};

class ThreadControlPlane final : public ControlPlane {
 public:
  ThreadControlPlane(ThreadGroup &group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_.size(); }
  void allreduceAnd(std::vector<uint64_t> &words) override {
    std::string mine(reinterpret_cast<const char *>(words.data()), words.size() * 8);
    words = group_.exchange<std::vector<uint64_t>>(rank_, mine, [&](const auto &all) {
      std::vector<uint64_t> out(words.size(), ~uint64_t{0});
      for (const std::string &s : all) {
        for (size_t i = 0; i < out.size(); ++i) {
          uint64_t w;
          std::memcpy(&w, s.data() + i * 8, 8);
          out[i] &= w;
        }
      }
      return out;
    });
  }
  std::vector<std::string> gatherToRoot(const std::string &blob) override {
    return group_.exchange<std::vector<std::string>>(rank_, blob, [&](const auto &all) {
      return rank_ == 0 ? all : std::vector<std::string>{};
    });
  }
  void broadcastFromRoot(std::string &blob) override {
    blob = group_.exchange<std::string>(rank_, blob, [](const auto &all) { return all[0]; });
  }

 private:
  ThreadGroup &group_;
  int rank_;
};

// Runs body(rank) on `size` threads and joins them.
inline void runRanks(int size, const std::function<void(int)> &body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back(body, r);
  for (auto &t : threads) t.join();
}

}  // namespace hora::test

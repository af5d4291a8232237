// SPDX-License-Identifier: Apache-2.0
#include "core/device_turn.h"

#include <algorithm>
#include <vector>

namespace hora {

DeviceTurn &DeviceTurn::process() {
  static DeviceTurn *turn = new DeviceTurn();  // never destroyed: engines may outlive statics
  return *turn;
}

bool DeviceTurn::firstAmongWaiting(int32_t set) const {
  auto before = [this](int32_t a, int32_t b) {
    const bool aLast = a == lastHolder_, bLast = b == lastHolder_;
    if (aLast != bLast) return bLast;
    return a < b;
  };
  for (const auto &kv : waiting_) {
    if (kv.first != set && before(kv.first, set)) return false;
  }
  return true;
}

bool DeviceTurn::offer(int32_t set) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (holder_ == set) {
    // Work in flight: more of it only while nobody else waits, so that the holder drains and
    // hands over instead of keeping the GPU for as long as it has work.
    for (const auto &kv : waiting_) {
      if (kv.first != set) return false;
    }
    pinned_ = true;
    return true;
  }
  if (holder_ >= 0 || !firstAmongWaiting(set)) return false;
  holder_ = set;
  pinned_ = true;
  launchedThrough_ = finishedThrough_ = 0;
  launchedThisHold_ = false;
  return true;
}

void DeviceTurn::uses(int32_t set) {
  std::lock_guard<std::mutex> lock(mutex_);
  users_.insert(set);
}

bool DeviceTurn::offerAlone(int32_t set) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (users_.size() != 1 || *users_.begin() != set || !waiting_.empty()) return false;
  if (holder_ == set) {
    pinned_ = true;
    return true;
  }
  if (holder_ >= 0) return false;
  holder_ = set;
  pinned_ = true;
  launchedThrough_ = finishedThrough_ = 0;
  launchedThisHold_ = false;
  return true;
}

void DeviceTurn::freeLocked(std::vector<std::function<void()>> *wakes) {
  if (launchedThisHold_) lastHolder_ = holder_;  // a hold that launched nothing does not count
  holder_ = -1;
  pinned_ = false;
  for (const auto &kv : waiting_) {
    if (kv.second) wakes->push_back(kv.second);
  }
}

void DeviceTurn::settle(int32_t set, uint64_t launchedThrough) {
  std::vector<std::function<void()>> wakes;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (holder_ != set) return;
    pinned_ = false;
    if (launchedThrough > 0) {
      launchedThrough_ = std::max(launchedThrough_, launchedThrough);
      launchedThisHold_ = true;
    }
    if (idleLocked()) freeLocked(&wakes);
  }
  for (const auto &wake : wakes) wake();
}

void DeviceTurn::finished(int32_t set, uint64_t ticket) {
  std::vector<std::function<void()>> wakes;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (holder_ != set) return;  // work of an earlier hold, finished before it ended
    // May come before settle() says it was launched (a fast op, while its round is pinned).
    finishedThrough_ = std::max(finishedThrough_, ticket);
    if (idleLocked()) freeLocked(&wakes);
  }
  for (const auto &wake : wakes) wake();
}

void DeviceTurn::wait(int32_t set, std::function<void()> wake) {
  std::lock_guard<std::mutex> lock(mutex_);
  waiting_[set] = std::move(wake);
}

void DeviceTurn::stopWaiting(int32_t set) {
  std::lock_guard<std::mutex> lock(mutex_);
  waiting_.erase(set);
}

void DeviceTurn::leave(int32_t set) {
  std::vector<std::function<void()>> wakes;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    waiting_.erase(set);
    users_.erase(set);
    if (holder_ == set) freeLocked(&wakes);
  }
  for (const auto &wake : wakes) wake();
}

int32_t DeviceTurn::holder() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return holder_;
}

}  // namespace hora

// SPDX-License-Identifier: Apache-2.0
#include "core/device_turn.h"

#include <vector>

namespace hora {

DeviceTurn &DeviceTurn::process() {
  static DeviceTurn *turn = new DeviceTurn();  // never destroyed: engines may outlive statics
  return *turn;
}

bool DeviceTurn::firstAmongWaiting(int32_t set) const {
  // Sets other than the last holder come first, then the lowest id; `set` itself counts as
  // waiting (it offers now).
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

bool DeviceTurn::tryTake(int32_t set) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (holder_ == set) {
    // Holding it (work in flight): go on only while nobody else waits, so that the holder
    // drains and hands over instead of keeping the GPU for as long as it has work.
    for (const auto &kv : waiting_) {
      if (kv.first != set) return false;
    }
    return true;
  }
  if (holder_ >= 0 || !firstAmongWaiting(set)) return false;
  holder_ = set;
  kept_ = false;
  return true;
}

void DeviceTurn::keep(int32_t set) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (holder_ == set) kept_ = true;
}

void DeviceTurn::release(int32_t set) {
  std::vector<std::function<void()>> wakes;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (holder_ != set) return;
    if (kept_) lastHolder_ = set;
    holder_ = -1;
    kept_ = false;
    for (const auto &kv : waiting_) {
      if (kv.first != set && kv.second) wakes.push_back(kv.second);
    }
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

int32_t DeviceTurn::holder() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return holder_;
}

}  // namespace hora

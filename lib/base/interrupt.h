// SPDX-License-Identifier: Apache-2.0
// A flag any thread raises to end a plane's blocked waits with a given status (a set's abort).
#pragma once

#include <atomic>
#include <mutex>

#include "base/error.h"

namespace hora {

// Raised once (later raises keep the first reason); read without a lock by the waits that check
// it between their slices. A plane holds one and checks it where it would otherwise wait on a
// peer for up to HORA_TIMEOUT_S.
class Interrupt {
 public:
  // Any thread. Returns false if it was raised already (the first reason stays).
  bool raise(const Status &why) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (raised_.load(std::memory_order_relaxed)) return false;
    why_ = why;
    raised_.store(true, std::memory_order_release);
    return true;
  }
  bool raised() const { return raised_.load(std::memory_order_acquire); }
  Status why() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return why_;
  }
  // Throws Error(why) if raised.
  void check() const {
    if (!raised()) return;
    const Status s = why();
    throw Error(s.code, s.message, __FILE__, __LINE__);
  }

 private:
  std::atomic<bool> raised_{false};
  mutable std::mutex mutex_;  // guards why_
  Status why_;
};

}  // namespace hora

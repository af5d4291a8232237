// SPDX-License-Identifier: Apache-2.0
// Whose turn it is to run collectives on this process's GPU. NCCL's kernels wait on the GPU for
// their peers, so two process sets whose collectives reach the GPU in different orders on two
// ranks can wait for each other forever (NVIDIA's guide: use communicators in different epochs,
// in the same order on every rank). Each set's engine launches device work only while it holds
// the turn on every member at once, which its negotiation checks in the same AND as everything
// else (Controller::negotiate's deviceOffer): so device work of different sets never overlaps
// on a GPU, and every rank runs the sets' epochs in an order all their members agreed on.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>

namespace hora {

class DeviceTurn {
 public:
  // The process's (every set engine of this process shares it).
  static DeviceTurn &process();

  // Set `set` offers to launch now: true if it holds the turn already and no other set waits,
  // or the turn is free and `set` comes first among the sets that wait (sets other than the
  // last holder first, then the lowest id: the same choice on every rank that has the same
  // sets waiting). Taking it is tentative until keep() or release().
  bool tryTake(int32_t set);
  // After a negotiation: `set` launched under the turn and keeps it until release().
  void keep(int32_t set);
  // `set` no longer needs the turn (nothing in flight, nothing launched); wakes the waiting sets.
  void release(int32_t set);
  // `set` has device work it could not launch (wake: called when the turn may have come free),
  // or has none any more.
  void wait(int32_t set, std::function<void()> wake);
  void stopWaiting(int32_t set);

  int32_t holder() const;  // -1: free

 private:
  bool firstAmongWaiting(int32_t set) const;  // mutex_ held

  mutable std::mutex mutex_;
  int32_t holder_ = -1;
  bool kept_ = false;
  int32_t lastHolder_ = -1;
  std::map<int32_t, std::function<void()>> waiting_;
};

}  // namespace hora

// SPDX-License-Identifier: Apache-2.0
// Whose turn it is to run collectives on this process's GPU. NCCL's kernels wait on the GPU for
// their peers, so two process sets whose collectives reach the GPU in different orders on two
// ranks can wait for each other forever (NVIDIA's guide: use communicators in different epochs,
// in the same order on every rank). A set's engine launches device work only in a negotiation
// round in which every member offered, and a rank offers only while it holds the turn for that
// set (Controller::negotiate's deviceOffer, one bit of the round's AND): device work of
// different sets never overlaps on a GPU, and every rank runs the sets' epochs in an order all
// their members agreed on.
//
// A set offers only when it has device work already agreed (so every member enters the round at
// once: the round is short), and holds the turn from its offer to the end of that round, then
// while its launched work is in flight. A set that is the only one of its process with device
// work offers in any round it has work pending (offerAlone): nobody can wait for the turn it
// holds, and the round that agrees its work launches it, one control-plane round trip sooner. A
// rank with two such sets stops offering alone, so its members' AND falls back to the rule
// above, at the same round on every member. The end of its work (a stream callback: drained()) gives
// the turn back even while the set's engine waits in a long negotiation for its peers' next
// submissions; a set holding the turn then could keep another set's collective, which a peer may
// need before it submits, from ever starting.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <vector>

namespace hora {

class DeviceTurn {
 public:
  // The process's (every set engine of this process shares it).
  static DeviceTurn &process();

  // Set `set` is about to negotiate with device work agreed and unlaunched: true if it holds the
  // turn for this round (it held it already and no other set waits, or it was free and `set`
  // comes first among the sets that wait: those other than the last holder first, then the
  // lowest id, the same choice on every rank with the same sets waiting).
  bool offer(int32_t set);
  // `set` has device work in this process (its first CUDA submission); until leave().
  void uses(int32_t set);
  // Set `set`, with work pending but none agreed: true if it holds the turn for this round
  // because no other set of this process uses the GPU (uses()) and the turn is free or its own.
  bool offerAlone(int32_t set);
  // After that round: work up to ticket `launchedThrough` (the executor's, 0: nothing launched
  // this round) is in flight; the turn stays until finished() has seen it all, else it is given
  // back now.
  void settle(int32_t set, uint64_t launchedThrough);
  // Any thread (a CUDA driver thread): `set`'s device work up to `ticket` has finished.
  void finished(int32_t set, uint64_t ticket);
  // `set` has agreed device work it could not launch (wake: called when the turn comes free),
  // or has none any more.
  void wait(int32_t set, std::function<void()> wake);
  void stopWaiting(int32_t set);
  // `set` stops: the turn given back whatever it holds.
  void leave(int32_t set);

  int32_t holder() const;  // -1: free

 private:
  bool firstAmongWaiting(int32_t set) const;  // mutex_ held
  void freeLocked(std::vector<std::function<void()>> *wakes);
  bool idleLocked() const { return !pinned_ && finishedThrough_ >= launchedThrough_; }

  mutable std::mutex mutex_;
  int32_t holder_ = -1;
  bool pinned_ = false;  // the holder is in a round it offered in
  uint64_t launchedThrough_ = 0;  // the holder's work launched in this hold, by ticket
  uint64_t finishedThrough_ = 0;  // and finished
  bool launchedThisHold_ = false;
  int32_t lastHolder_ = -1;
  std::map<int32_t, std::function<void()>> waiting_;
  std::set<int32_t> users_;  // sets with device work (uses)
};

}  // namespace hora

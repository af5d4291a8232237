// SPDX-License-Identifier: Apache-2.0
// Forming a group in named phases: while a phase runs, the group's other ranks can read which
// one it is; a phase that fails says which set, which phase, and what the other ranks were doing.
#pragma once

#include <functional>
#include <string>

#include "core/world.h"

namespace hora {

// The set this thread is forming, for messages: "the world", "process set 3". The engine sets it
// around the formation of each set (its group, its backend); a phase outside any scope says "a
// group".
class FormingScope {
 public:
  explicit FormingScope(std::string set);
  ~FormingScope();
  FormingScope(const FormingScope &) = delete;
  FormingScope &operator=(const FormingScope &) = delete;
  // "" outside any scope.
  static const std::string &current();

 private:
  std::string previous_;
};

// Runs `body` as one phase of forming the group in which this process is `rank` of `size`, whose
// side channel is `presence` (nullptr: none). Before it starts, the phase is this rank's word on
// the channel ("forming process set 3: agreeing on the shared-memory segment"), so that a rank
// left waiting can say where this one is. Each phase has its own deadline: the waits inside
// `body` (HORA_TIMEOUT_S each) are counted from the phase's start, not the formation's. An Error
// that `body` throws is thrown again, with the same status, as
//   "forming process set 3: agreeing on the shared-memory segment: <why>; the other ranks:
//    rank 1 (alive, forming process set 3: connecting the gloo mesh for 4.1 s)"
// naming only the ranks that are not in this same phase (all of them are, when the phase itself
// is slow). Reading the peers' words never blocks for long: a channel that fails is left out.
void formingPhase(Presence *presence, int rank, int size, const std::string &phase,
                  const std::function<void()> &body);

// The same for a group (its presence, rank and size).
inline void formingPhase(Group &group, const std::string &phase, const std::function<void()> &body) {
  formingPhase(group.presence(), group.rank(), group.size(), phase, body);
}

}  // namespace hora

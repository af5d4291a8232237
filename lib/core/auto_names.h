// SPDX-License-Identifier: Apache-2.0
// Names for requests submitted without one: "<op>.noname.<n>", counted per process set and op, so
// that every rank names its k-th unnamed allreduce in a set alike. One per runtime.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "core/types.h"

namespace hora {

class AutoNames {
 public:
  // Any thread. The next name of `op` in `processSet`, taken by every unnamed call that gets as
  // far as its set: one enqueued, and also one refused before enqueueing, whose tombstone carries
  // the name (hora_reject). Ranks run the same program, so a call that one rank refuses (a bad
  // argument of its own) is a call that the others make too: its name must be used up on the
  // refusing rank as on theirs, or every later unnamed call of that rank would pair with the
  // previous call of the others, and the others' call would wait forever for the refused one.
  // With the name used up, that call fails on every rank (HORA_ERR_MISMATCH, naming the refusal)
  // and the calls after it pair as before. (A call that only one rank makes, refused or not,
  // shifts that rank's names against the others': with a refusal, the others' next call of the
  // op at least fails, naming it.)
  std::string next(int32_t processSet, OpType op);
  // Any thread, after a completed join in `processSet`: ranks make different numbers of unnamed
  // calls before joining (that is what join is for), so the counters restart together, under a
  // new epoch that keeps the new names apart from the old ones ("<op>.noname.<epoch>.<n>").
  void newEpoch(int32_t processSet);

 private:
  std::mutex mutex_;  // guards counts_ and epochs_
  std::map<std::pair<int32_t, int>, uint64_t> counts_;  // (set, op) -> names taken this epoch
  std::map<int32_t, uint64_t> epochs_;                  // set -> completed joins
};

}  // namespace hora

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
  // Any thread. The next name of `op` in `processSet`: take it only when the request is about to
  // be enqueued, so that a call refused on one rank does not shift that rank's names.
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

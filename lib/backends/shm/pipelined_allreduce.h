// SPDX-License-Identifier: Apache-2.0
// Large allreduce through the segment: a pipeline over windows of the vector, with rings of
// exported inputs and reduced results, and non-temporal stores where the ranks share no cache.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backends/shm/shm_channel.h"
#include "backends/shm/shm_op.h"

namespace hora {

// One thread at a time (the backend's caller).
class PipelinedAllreduce {
 public:
  // stream: HORA_SHM_STREAM, "on", "off" or "auto" (probe()).
  PipelinedAllreduce(ShmChannel &channel, const std::string &stream)
      : channel_(channel), probeStream_(stream == "auto"), stream_(stream == "on") {}
  // checked: the caller has already compared this op with the peers' after a barrier.
  void run(const ShmOp &o, const SpanTable &table, bool checked);

 private:
  using Range = std::pair<int64_t, int64_t>;  // elements [first, second) of the vector
  // Share r of window [a, b): elements [share(r), share(r + 1)).
  struct Shares {
    int64_t a, b, units, unit;
    int size;
    int64_t operator()(int r) const { return std::min(b, a + units * r / size * unit); }
  };
  Shares sharesOf(Range range, int64_t unit) const {
    return {range.first, range.second, (range.second - range.first + unit - 1) / unit, unit,
            channel_.size()};
  }
  // How this rank copies into the segment for the peers to read (see probe()).
  SpanTable::Copy publishCopy() const { return stream_ ? streamBytes : copyBytes; }

  void probe(uint64_t window);
  void touchPages(const ShmOp &o, const SpanTable &table, Range range) const;
  void exportWindow(const ShmOp &o, const SpanTable &table, uint64_t w, Range range, int64_t unit);
  void reduceWindow(const ShmOp &o, const SpanTable &table, uint64_t w, Range range, int64_t unit,
                    bool check);
  void copyBackWindow(const ShmOp &o, const SpanTable &table, uint64_t w, Range range, int64_t unit);

  ShmChannel &channel_;
  const bool probeStream_;  // HORA_SHM_STREAM=auto: probe() decides stream_
  bool stream_;             // non-temporal stores into the segment (see probe())
  uint64_t nextProbe_ = 0;  // window at which the next pipelined operation probes
  uint64_t windows_ = 0;    // pipeline windows run, over all operations: picks the ring slots
  std::vector<float> acc_;  // float32 accumulator for float16/bfloat16
};

}  // namespace hora

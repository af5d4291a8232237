// SPDX-License-Identifier: Apache-2.0
// Small allreduce (up to ShmChannel::kEagerBytes) through the staging halves of the segment.
#pragma once

#include <cstdint>
#include <vector>

#include "backends/shm/shm_channel.h"
#include "backends/shm/shm_op.h"

namespace hora {

// Every rank copies its input into its staging half; after one barrier every rank reduces all
// halves itself, in rank order. One thread at a time (the backend's caller).
class EagerAllreduce {
 public:
  explicit EagerAllreduce(ShmChannel &channel) : channel_(channel) {}
  void run(const ShmOp &o, const SpanTable &table);

 private:
  ShmChannel &channel_;
  uint64_t ops_ = 0;        // eager operations run: picks the staging half
  std::vector<char> tmp_;   // the float16/bfloat16 result, before it is scattered
  std::vector<float> acc_;  // float32 accumulator for float16/bfloat16
};

}  // namespace hora

// SPDX-License-Identifier: Apache-2.0
// Allreduce among the ranks of a shared segment: picks one of the three algorithms per operation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backends/shm/cma_allreduce.h"
#include "backends/shm/eager_allreduce.h"
#include "backends/shm/pipelined_allreduce.h"
#include "backends/shm/shm_channel.h"
#include "backends/shm/shm_op.h"

namespace hora {

// One thread at a time (the backend's caller, in its set's cycles).
class ShmAllreduce {
 public:
  // wantSingleCopy: HORA_SHM=cma; stream: HORA_SHM_STREAM.
  ShmAllreduce(ShmChannel &channel, bool wantSingleCopy, const std::string &stream)
      : channel_(channel), wantSingleCopy_(wantSingleCopy), eager_(channel), pipelined_(channel, stream),
        cma_(channel) {}

  // Collective over `control`, once, after ShmChannel::connect: whether large operations take the
  // single-copy path (the same answer on every rank).
  bool connect(ControlPlane &control) { return singleCopy_ = cma_.agree(control, wantSingleCopy_); }

  // Backend::allreduceSpans: the spans, concatenated, are one vector.
  void run(const std::vector<Backend::Span> &spans, DType dtype, ReduceOp op, double pre, double post);

 private:
  enum class Algorithm { kEager, kSingleCopy, kPipelined };
  // Depends only on what every rank agrees on, so all take the same path.
  static Algorithm choose(int64_t bytes, bool singleCopy) {
    if (bytes <= ShmChannel::kEagerBytes) return Algorithm::kEager;
    return singleCopy ? Algorithm::kSingleCopy : Algorithm::kPipelined;
  }

  ShmChannel &channel_;
  const bool wantSingleCopy_;
  bool singleCopy_ = false;  // every rank can read every peer's memory (set by connect())
  uint64_t seq_ = 0;         // operations run: ShmOp::seq
  SpanTable table_;          // this operation's tensors
  EagerAllreduce eager_;
  PipelinedAllreduce pipelined_;
  CmaAllreduce cma_;
};

}  // namespace hora

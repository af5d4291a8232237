// SPDX-License-Identifier: Apache-2.0
// Runs one planned group of responses on a backend: packing, scaling, the collective, unpacking.
#pragma once

#include <vector>

#include "core/backend.h"
#include "core/fusion_buffer.h"
#include "core/request.h"
#include "core/timeline.h"

namespace hora {

// The set's cycles only (one thread at a time: SetEngine's cycle lock). Throws Error on failure;
// the engine decides the blast radius.
class Executor {
 public:
  Executor(Backend &backend, int setSize, int rank)
      : backend_(backend), setSize_(setSize), rank_(rank) {}

  // Allreduce of every tensor of `requests` (all agreeing on dtype, op, scales, device) in one
  // backend call. A single tensor is reduced where it lies; several are packed into the fusion
  // buffer; float16/bfloat16 are widened to float32 while packing when the backend cannot
  // accumulate them in float32 itself. Prescale is applied on the way in, postscale (and 1/size
  // for AVERAGE) on the way out.
  // Steps of fused operations go to `timeline` (may be null) as process set `set`'s.
  void setTimeline(Timeline *timeline, int32_t set) {
    timeline_ = timeline;
    set_ = set;
  }
  void allreduce(const std::vector<Request *> &requests, const Response &response);
  void broadcast(Request &request, const Response &response);
  // Allocates each request's output ([sum of first dims, trailing dims...]). Several requests
  // (a fused group, responses[i] for requests[i]) travel in one allgatherv through the fusion
  // buffer; a single one goes straight into its output.
  void allgather(const std::vector<Request *> &requests,
                 const std::vector<const Response *> &responses);
  // Allocates the request's output ([rows received, trailing dims...]) and received splits.
  void alltoall(Request &request, const Response &response);
  // Allocates each request's output: this rank's block of the first dimension (rows / size, one
  // more for the first rows % size ranks), reduced over ranks, with scaling as for allreduce.
  // Several requests are packed rank-major (every tensor's block for rank 0, then rank 1, ...)
  // and reduced in one call.
  void reducescatter(const std::vector<Request *> &requests,
                     const std::vector<const Response *> &responses);

  const FusionBuffer &fusionBuffer() const { return fusion_; }

 private:
  // Postscale to apply after a sum: the user's, divided by the ranks that contributed data when
  // the op is AVERAGE (ranks that joined contribute nothing).
  double postscaleFor(const Response &response) const;
  // While a timeline records: one step of the operation (fusion copy in, collective, copy out)
  // from construction to destruction, on the engine's row.
  class Step {
   public:
    Step(const Executor &e, const char *what)
        : timeline_(e.timeline_ != nullptr && e.timeline_->active() ? e.timeline_ : nullptr),
          set_(e.set_), what_(what), begin_(timeline_ ? Timeline::Clock::now() : Timeline::Clock::time_point{}) {}
    ~Step() {
      if (timeline_ != nullptr) timeline_->step(set_, what_, begin_, Timeline::Clock::now());
    }
    Step(const Step &) = delete;
    Step &operator=(const Step &) = delete;

   private:
    Timeline *timeline_;
    int32_t set_;
    const char *what_;
    Timeline::Clock::time_point begin_;
  };

  Backend &backend_;
  int setSize_;
  int rank_;
  FusionBuffer fusion_;
  Timeline *timeline_ = nullptr;
  int32_t set_ = 0;
};

}  // namespace hora

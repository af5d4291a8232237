// SPDX-License-Identifier: Apache-2.0
// Runs one planned group of responses on a backend: packing, scaling, the collective, unpacking.
#pragma once

#include <vector>

#include "core/backend.h"
#include "core/fusion_buffer.h"
#include "core/request.h"

namespace hora {

// Engine thread only. Throws Error on failure; the engine decides the blast radius.
class Executor {
 public:
  Executor(Backend &backend, int setSize, int rank)
      : backend_(backend), setSize_(setSize), rank_(rank) {}

  // Allreduce of every tensor of `requests` (all agreeing on dtype, op, scales, device) in one
  // backend call. A single tensor is reduced where it lies; several are packed into the fusion
  // buffer; float16/bfloat16 are widened to float32 while packing when the backend cannot
  // accumulate them in float32 itself. Prescale is applied on the way in, postscale (and 1/size
  // for AVERAGE) on the way out.
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

  Backend &backend_;
  int setSize_;
  int rank_;
  FusionBuffer fusion_;
};

}  // namespace hora

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
  Executor(Backend &backend, int setSize) : backend_(backend), setSize_(setSize) {}

  // Allreduce of every tensor of `requests` (all agreeing on dtype, op, scales, device) in one
  // backend call. A single tensor is reduced where it lies; several are packed into the fusion
  // buffer; float16/bfloat16 are widened to float32 while packing when the backend cannot
  // accumulate them in float32 itself. Prescale is applied on the way in, postscale (and 1/size
  // for AVERAGE) on the way out.
  void allreduce(const std::vector<Request *> &requests, const Response &response);
  void broadcast(Request &request, const Response &response);
  // Allocates the request's output ([sum of first dims, trailing dims...]).
  void allgather(Request &request, const Response &response);

  const FusionBuffer &fusionBuffer() const { return fusion_; }

 private:
  Backend &backend_;
  int setSize_;
  FusionBuffer fusion_;
};

}  // namespace hora

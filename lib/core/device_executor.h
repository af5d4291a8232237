// SPDX-License-Identifier: Apache-2.0
// The executor for tensors on a GPU: what the engine asks of the NCCL backend. Created on a
// process set's first response on a device; like every response, that is collective over the set.
#pragma once

#include <vector>

#include "core/request.h"

namespace hora {

// Engine thread only. Each call orders its work after every request's readiness event (the
// caller's stream at submission) and returns once the results are in place on the device, so a
// completed request's output is visible to any stream. Throws Error on failure: HORA_ERR_BACKEND
// with NCCL's or CUDA's words, HORA_ERR_TIMEOUT after HORA_TIMEOUT_S (the communicator is then
// aborted, and so is every later call on it).
class DeviceExecutor {
 public:
  virtual ~DeviceExecutor() = default;
  // `contributors`: ranks with data (the set's size minus joined ranks), AVERAGE's divisor.
  virtual void allreduce(const std::vector<Request *> &requests, const Response &response,
                         int contributors) = 0;
  virtual void broadcast(Request &request, const Response &response) = 0;
  virtual void allgather(Request &request, const Response &response) = 0;
  virtual void alltoall(Request &request, const Response &response) = 0;
  virtual void reducescatter(Request &request, const Response &response, int contributors) = 0;
};

}  // namespace hora

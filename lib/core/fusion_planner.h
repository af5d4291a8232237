// SPDX-License-Identifier: Apache-2.0
// Which responses run together in one backend call. Pure: no I/O, no state.
#pragma once

#include <cstdint>
#include <vector>

#include "core/message.h"

namespace hora {

struct FusionGroup {
  std::vector<size_t> members;  // indices into the response list, in list order
  int64_t bytes = 0;            // payload bytes of all members
};

// Groups the responses that every rank executes this cycle. Successful allreduces with the same
// dtype, reduce op, scale factors and device fuse, in list order, while the group stays within
// `threshold` bytes; so do allgathers (same dtype and device; bytes = the gathered output) and
// reducescatters (as allreduce), each op with its own kind and the same set of joined ranks. A
// response over the threshold runs alone, as does every other op and every failed response; a
// grouped allreduce is never split. Groups come out ordered by their first member, so every rank, given the same
// list, runs the same groups in the same order.
std::vector<FusionGroup> planFusion(const std::vector<const Response *> &responses, int64_t threshold);
std::vector<FusionGroup> planFusion(const std::vector<Response> &responses, int64_t threshold);

// Payload bytes of a response (all tensors in its dtype; allgather: the gathered output).
int64_t responseBytes(const Response &response);

}  // namespace hora

// SPDX-License-Identifier: Apache-2.0
// Control messages: what a rank tells the coordinator about a ready tensor (RequestMsg), what the
// coordinator tells every rank to execute (Response), and their wire encoding.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <hora/hora.h>

#include "base/dtype.h"
#include "core/kernels.h"
#include "core/types.h"

namespace hora {

using Shape = std::vector<int64_t>;
std::string shapeString(const Shape &shape);  // "[1024,16]"
int64_t numElements(const Shape &shape);

// One rank's description of one request. It is also the response cache's signature: a cached
// response is reused only while this rank's RequestMsg for the name is unchanged.
struct RequestMsg {
  std::string name;
  OpType op = OpType::kAllreduce;
  ReduceOp reduceOp = ReduceOp::kSum;
  DType dtype = DType::kFloat32;
  Device device;
  int32_t root = 0;
  double prescale = 1.0;
  double postscale = 1.0;
  std::vector<Shape> shapes;  // one per tensor; grouped ops carry several
  // alltoall: rows sent to each rank of the set; process set create: the ranks; destroy: the id.
  std::vector<int64_t> splits;
  // hora_set_join_mode's mode on this rank (HORA_JOIN_ZERO_FILL, HORA_JOIN_ALLREDUCE_ONLY): the
  // coordinator reads it when a rank of the set has joined.
  uint8_t joinMode = 0;
  // Not empty: a tombstone. This rank refused the op before submitting it (a bad argument, found
  // by the C API or a binding), and this is why; it takes the op's place in negotiation so that
  // the other ranks' requests of the name fail (HORA_ERR_MISMATCH) instead of waiting for it.
  // It never reaches a backend and is never cached.
  std::string rejected;

  bool isTombstone() const { return !rejected.empty(); }

  bool operator==(const RequestMsg &o) const;
  bool operator!=(const RequestMsg &o) const { return !(*this == o); }
};

// What every rank executes, in the same order everywhere.
struct Response {
  RequestMsg agreed;                   // the parameters all ranks agreed on (shapes: rank 0's)
  hora_status_t status = HORA_SUCCESS;  // != success: the op failed on every rank
  std::string error;                   // message for a failed op
  // allgather: [tensor * size + rank] rows of each rank; alltoall: [sender * size + receiver]
  // rows; join: the last rank to join; process set create: the new set's id.
  std::vector<int64_t> firstDims;
  // Ranks that have joined (hora_join): they take part with zeros and no data of their own.
  std::vector<int32_t> joined;

  bool ok() const { return status == HORA_SUCCESS; }
};

// Wire encoding. Decoding checks every length against the buffer and throws
// Error(HORA_ERR_INTERNAL) naming what was malformed, never reading out of bounds.
std::string encodeRequests(const std::vector<RequestMsg> &requests);
std::vector<RequestMsg> decodeRequests(const std::string &bytes);
std::string encodeResponses(const std::vector<Response> &responses);
std::vector<Response> decodeResponses(const std::string &bytes);

}  // namespace hora

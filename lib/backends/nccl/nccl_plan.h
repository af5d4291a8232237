// SPDX-License-Identifier: Apache-2.0
// What the NCCL backend will ask of NCCL and of its kernels, decided on the host without CUDA or
// NCCL headers, so that the decisions build and are tested on machines without a GPU.
#pragma once

#include <cstdint>
#include <vector>

#include "base/dtype.h"
#include "core/kernels.h"

namespace hora::nccl_plan {

// NCCL's ncclDataType_t and ncclRedOp_t values (nccl.h, stable since NCCL 2.10); the backend
// static_asserts that they match.
enum class NcclType : int { kInt8 = 0, kUint8 = 1, kInt32 = 2, kInt64 = 4, kFloat16 = 6,
                            kFloat32 = 7, kFloat64 = 8, kBfloat16 = 9 };
enum class NcclOp : int { kSum = 0, kProd = 1, kMax = 2, kMin = 3, kAvg = 4 };

// bool is uint8; int16 has no NCCL type (throws Error(HORA_ERR_UNSUPPORTED)): it moves only
// through the byte-wise calls.
NcclType ncclType(DType t);

// Why NCCL cannot reduce `t`, as the end of the message that refuses such a call before it is
// submitted ("int16 on cuda:0 cannot be reduced: ..."), or nullptr where it can: int16, which
// has no NCCL type. The other dtypes' rules (average and scale factors on integers, bool) are
// the same on every device and are not the backend's.
const char *whyNotReduced(DType t);

// How one allreduce (of a fused buffer or a single tensor) runs, given the op the engine agreed
// on (kAverage kept as such), its scale factors, and how many ranks contribute data (joined
// ranks do not: the average's divisor is theirs).
//   - op: NCCL's own reduction. Average is ncclAvg only when every rank contributes and nothing
//     else scales; otherwise a sum, with the divisor folded into postscale.
//   - premulSum: prescale on the sum through ncclRedOpCreatePreMulSum (floating types): NCCL
//     multiplies each input as it reduces it, so no pass over the data is spent on it.
//   - kernelPrescale / kernelPostscale: factors a scaling kernel applies before / after (1.0 =
//     no pass). Min, max and product take a prescale pass only; every op takes a postscale pass.
struct AllreducePlan {
  NcclOp op = NcclOp::kSum;
  bool premulSum = false;
  double premulFactor = 1.0;
  double kernelPrescale = 1.0;
  double kernelPostscale = 1.0;
};
// Throws Error(HORA_ERR_UNSUPPORTED) for a scale other than 1 on an integer dtype, as the CPU
// path does, and for int16 (NCCL has no 16-bit integer type). bool reduces as uint8: sum and
// max are ncclMax (OR), min and product ncclMin (AND); the bytes are 0 or 1 as torch.bool keeps
// them (a larger nonzero byte still counts as true but may come out as itself: the GPU path does
// not normalize).
AllreducePlan planAllreduce(DType dtype, ReduceOp op, double prescale, double postscale,
                            int contributors, int setSize);

// Where each tensor of a fused response lies in the device fusion buffer: offsets aligned to
// kAlign bytes, so that every packed tensor starts on a 16-byte vector boundary for the copy
// kernel and on a cache line for NCCL.
constexpr int64_t kAlign = 256;
struct Layout {
  std::vector<int64_t> offsets;  // bytes from the buffer's start, one per tensor
  int64_t bytes = 0;             // the buffer needed (the last tensor's end)
  int64_t elements = 0;          // what the collective runs over: bytes / element size
};
// Aligning inserts padding between tensors; the padding is reduced like data (its content never
// reaches an output), so elements covers it. bytesPerTensor must be multiples of the element size.
Layout packLayout(const std::vector<int64_t> &bytesPerTensor, size_t elementSize);

// Allgather with each rank's block size: ncclAllGather when they are all equal, otherwise one
// ncclBroadcast per rank inside a group, root r writing its block at offsets[r].
struct GatherPlan {
  bool uniform = false;          // one ncclAllGather of blockBytes[0] per rank
  std::vector<int64_t> offsets;  // where rank r's block lands in the output
  int64_t totalBytes = 0;
};
GatherPlan planAllgather(const std::vector<int64_t> &blockBytes);

// Reducescatter with each rank's block (elements): ncclReduceScatter when all are equal,
// otherwise one ncclReduce per rank inside a group, root r receiving block r.
struct ScatterPlan {
  bool uniform = false;
  std::vector<int64_t> offsets;  // elements: where rank r's block starts in the input
};
ScatterPlan planReducescatter(const std::vector<int64_t> &counts);

// Alltoall as grouped ncclSend/ncclRecv: one pair per peer with bytes to move; this rank's own
// block is a device copy, not a send to itself.
struct Transfer {
  int peer;
  int64_t sendOffset, sendBytes;  // in the input
  int64_t recvOffset, recvBytes;  // in the output
};
struct AlltoallPlan {
  std::vector<Transfer> transfers;  // peers other than `rank` with anything to send or receive
  int64_t selfSendOffset = 0, selfRecvOffset = 0, selfBytes = 0;
};
AlltoallPlan planAlltoall(int rank, const std::vector<int64_t> &sendBytes,
                          const std::vector<int64_t> &recvBytes);

}  // namespace hora::nccl_plan

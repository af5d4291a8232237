// SPDX-License-Identifier: Apache-2.0
// The NCCL backend's host-side decisions; no CUDA or NCCL headers here.
#include "backends/nccl/nccl_plan.h"

#include <algorithm>

#include "base/error.h"

namespace hora::nccl_plan {

NcclType ncclType(DType t) {
  switch (t) {
    case DType::kUInt8: return NcclType::kUint8;
    case DType::kInt8: return NcclType::kInt8;
    case DType::kInt32: return NcclType::kInt32;
    case DType::kInt64: return NcclType::kInt64;
    case DType::kFloat16: return NcclType::kFloat16;
    case DType::kBFloat16: return NcclType::kBfloat16;
    case DType::kFloat32: return NcclType::kFloat32;
    case DType::kFloat64: return NcclType::kFloat64;
    case DType::kBool: return NcclType::kUint8;  // reduced by max (OR) and min (AND)
    case DType::kInt16: break;
  }
  // int16 moves as bytes (broadcast, allgather, alltoall are byte-wise); a reduction of it is
  // refused before it is submitted (whyNotReduced, asked through the registry).
  HORA_THROW(HORA_ERR_UNSUPPORTED, "no NCCL type for ", dtypeName(t),
             " (NCCL has no 16-bit integer type)");
}

const char *whyNotReduced(DType t) {
  return t == DType::kInt16
             ? "NCCL has no 16-bit integer type (reduce it as int32, or on the CPU)"
             : nullptr;
}

AllreducePlan planAllreduce(DType dtype, ReduceOp op, double prescale, double postscale,
                            int contributors, int setSize) {
  const bool average = op == ReduceOp::kAverage;
  if (dtype == DType::kInt16) {
    HORA_THROW(HORA_ERR_UNSUPPORTED, reduceOpName(op), " of int16 on a GPU: NCCL has no 16-bit "
               "integer type; reduce it as int32 or on the CPU");
  }
  if (!isFloating(dtype) && (average || prescale != 1.0 || postscale != 1.0)) {
    HORA_THROW(HORA_ERR_UNSUPPORTED, "allreduce of ", dtypeName(dtype), " with ",
               average ? "average" : "a scale factor", ": integer dtypes take sum, min, max or "
               "product without scaling");
  }
  AllreducePlan plan;
  if (dtype == DType::kBool) {  // uint8 holding 0 or 1 (torch.bool's bytes): OR is max, AND min
    plan.op = op == ReduceOp::kSum || op == ReduceOp::kMax ? NcclOp::kMax : NcclOp::kMin;
    return plan;
  }
  if (average && contributors == setSize && prescale == 1.0 && postscale == 1.0) {
    plan.op = NcclOp::kAvg;  // NCCL divides by the communicator's size itself
    return plan;
  }
  const double post = average ? postscale / std::max(1, contributors) : postscale;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      // A sum is linear: both factors go into NCCL's premultiplied sum, and no pass is spent.
      plan.op = NcclOp::kSum;
      if (prescale * post != 1.0) {
        plan.premulSum = true;
        plan.premulFactor = prescale * post;
      }
      return plan;
    case ReduceOp::kMin: plan.op = NcclOp::kMin; break;
    case ReduceOp::kMax: plan.op = NcclOp::kMax; break;
    case ReduceOp::kProduct: plan.op = NcclOp::kProd; break;
  }
  plan.kernelPrescale = prescale;
  plan.kernelPostscale = post;
  return plan;
}

Layout packLayout(const std::vector<int64_t> &bytesPerTensor, size_t elementSize) {
  Layout layout;
  int64_t at = 0;
  for (int64_t bytes : bytesPerTensor) {
    HORA_ENFORCE(bytes >= 0 && bytes % static_cast<int64_t>(elementSize) == 0, "tensor of ",
                 bytes, " bytes in a layout of ", elementSize, "-byte elements");
    at = (at + kAlign - 1) / kAlign * kAlign;
    layout.offsets.push_back(at);
    at += bytes;
  }
  layout.bytes = at;
  layout.elements = at / static_cast<int64_t>(elementSize);
  return layout;
}

GatherPlan planAllgather(const std::vector<int64_t> &blockBytes) {
  GatherPlan plan;
  plan.uniform = !blockBytes.empty() &&
                 std::all_of(blockBytes.begin(), blockBytes.end(),
                             [&](int64_t b) { return b == blockBytes.front(); });
  for (int64_t b : blockBytes) {
    plan.offsets.push_back(plan.totalBytes);
    plan.totalBytes += b;
  }
  return plan;
}

ScatterPlan planReducescatter(const std::vector<int64_t> &counts) {
  ScatterPlan plan;
  plan.uniform = !counts.empty() && std::all_of(counts.begin(), counts.end(), [&](int64_t c) {
    return c == counts.front();
  });
  int64_t at = 0;
  for (int64_t c : counts) {
    plan.offsets.push_back(at);
    at += c;
  }
  return plan;
}

AlltoallPlan planAlltoall(int rank, const std::vector<int64_t> &sendBytes,
                          const std::vector<int64_t> &recvBytes) {
  HORA_ENFORCE(sendBytes.size() == recvBytes.size() && rank >= 0 &&
                   rank < static_cast<int>(sendBytes.size()),
               "alltoall plan for rank ", rank, " with ", sendBytes.size(), " send and ",
               recvBytes.size(), " receive sizes");
  AlltoallPlan plan;
  int64_t sendAt = 0, recvAt = 0;
  for (size_t p = 0; p < sendBytes.size(); ++p) {
    if (static_cast<int>(p) == rank) {
      HORA_ENFORCE(sendBytes[p] == recvBytes[p], "rank ", rank, " sends itself ", sendBytes[p],
                   " bytes but expects ", recvBytes[p]);
      plan.selfSendOffset = sendAt;
      plan.selfRecvOffset = recvAt;
      plan.selfBytes = sendBytes[p];
    } else if (sendBytes[p] > 0 || recvBytes[p] > 0) {
      plan.transfers.push_back({static_cast<int>(p), sendAt, sendBytes[p], recvAt, recvBytes[p]});
    }
    sendAt += sendBytes[p];
    recvAt += recvBytes[p];
  }
  return plan;
}

}  // namespace hora::nccl_plan

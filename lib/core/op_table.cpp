// SPDX-License-Identifier: Apache-2.0
// The operations, one row each. Kept in OpType's order (checked below).
#include "core/op_table.h"

#include "base/error.h"
#include "core/device_executor.h"
#include "core/executor.h"
#include "core/set_engine.h"

namespace hora {
namespace {

using FD = OpSpec::FirstDims;
using Fu = OpSpec::Fusion;

void cpuAllreduce(const OpRun &r) { r.cpu->allreduce(r.requests, *r.members.front()); }
void cpuBroadcast(const OpRun &r) { r.cpu->broadcast(*r.requests.front(), *r.members.front()); }
void cpuAllgather(const OpRun &r) { r.cpu->allgather(r.requests, r.members); }
void cpuAlltoall(const OpRun &r) { r.cpu->alltoall(*r.requests.front(), *r.members.front()); }
void cpuReducescatter(const OpRun &r) { r.cpu->reducescatter(r.requests, r.members); }
void cpuNothing(const OpRun &) {}  // barrier: negotiation itself waited for every rank
void cpuJoin(const OpRun &r) { r.requests.front()->result = r.members.front()->firstDims.at(0); }
void cpuSetOp(const OpRun &r) {
  const Response &first = *r.members.front();
  HORA_ENFORCE(r.handler != nullptr, opTypeName(first.agreed.op), " outside the world set");
  r.handler->runSetOp(r.requests.front(), first, r.device);
}

void gpuAllreduce(const OpRun &r) {
  r.device->allreduce(r.requests, *r.members.front(), r.contributors);
}
void gpuBroadcast(const OpRun &r) { r.device->broadcast(*r.requests.front(), *r.members.front()); }
void gpuAlltoall(const OpRun &r) { r.device->alltoall(*r.requests.front(), *r.members.front()); }
void gpuAllgather(const OpRun &r) { r.device->allgather(r.requests, r.members); }
void gpuReducescatter(const OpRun &r) {
  r.device->reducescatter(r.requests, r.members, r.contributors);
}

// Fields left out are false / null / kNone / kNever / none.
constexpr OpSpec kOps[] = {
    {.op = OpType::kAllreduce, .name = "allreduce", .timelineName = "ALLREDUCE",
     .reduces = true, .carriesTensors = true, .cacheable = true, .fusion = Fu::kAlways,
     .runCpu = cpuAllreduce, .runDevice = gpuAllreduce, .backendCall = OpType::kAllreduce},
    {.op = OpType::kBroadcast, .name = "broadcast", .timelineName = "BROADCAST",
     .rooted = true, .refusedWhileJoined = true, .carriesTensors = true, .cacheable = true,
     .runCpu = cpuBroadcast, .runDevice = gpuBroadcast, .backendCall = OpType::kBroadcast},
    {.op = OpType::kAllgather, .name = "allgather", .timelineName = "ALLGATHER",
     .firstDimFree = true, .refusedWhileJoined = true, .firstDims = FD::kRows,
     .carriesTensors = true, .cacheable = true, .fusion = Fu::kSingleTensor,
     .runCpu = cpuAllgather, .runDevice = gpuAllgather, .backendCall = OpType::kAllgather},
    {.op = OpType::kAlltoall, .name = "alltoall", .timelineName = "ALLTOALL",
     .firstDimFree = true, .refusedWhileJoined = true, .firstDims = FD::kSendSplits,
     .carriesTensors = true, .cacheable = true,
     .runCpu = cpuAlltoall, .runDevice = gpuAlltoall, .backendCall = OpType::kAlltoall},
    {.op = OpType::kReducescatter, .name = "reducescatter", .timelineName = "REDUCESCATTER",
     .reduces = true, .refusedWhileJoined = true, .carriesTensors = true, .cacheable = true,
     .fusion = Fu::kSingleTensor, .runCpu = cpuReducescatter, .runDevice = gpuReducescatter,
     .backendCall = OpType::kReducescatter},
    {.op = OpType::kBarrier, .name = "barrier", .timelineName = "BARRIER",
     .runCpu = cpuNothing},
    {.op = OpType::kJoin, .name = "join", .timelineName = "JOIN",
     .firstDims = FD::kJoinCount, .runCpu = cpuJoin},
    {.op = OpType::kProcessSetCreate, .name = "process_set_create",
     .timelineName = "PROCESS_SET_CREATE", .agreedSplits = "ranks", .runCpu = cpuSetOp},
    {.op = OpType::kProcessSetDestroy, .name = "process_set_destroy",
     .timelineName = "PROCESS_SET_DESTROY", .agreedSplits = "process set", .runCpu = cpuSetOp},
};
static_assert(sizeof kOps / sizeof kOps[0] == kNumOpTypes, "one entry per OpType");

constexpr bool inOpTypeOrder() {
  for (int i = 0; i < kNumOpTypes; ++i) {
    if (static_cast<int>(kOps[i].op) != i) return false;
  }
  return true;
}
static_assert(inOpTypeOrder(), "kOps is indexed by OpType");

}  // namespace

const OpSpec &opSpec(OpType op) {
  const auto i = static_cast<unsigned>(op);
  HORA_ENFORCE(i < static_cast<unsigned>(kNumOpTypes), "unknown op type ", i);
  return kOps[i];
}

const char *opTypeName(OpType op) {
  const auto i = static_cast<unsigned>(op);
  return i < static_cast<unsigned>(kNumOpTypes) ? kOps[i].name : "unknown-op";
}

}  // namespace hora

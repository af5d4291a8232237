// SPDX-License-Identifier: Apache-2.0
// One description per operation: every rule the engine applies to an op (its names, what ranks
// must agree on, what a response carries, whether it is cached and fused, how it runs on the CPU
// and on a device) comes from its entry in op_table.cpp. Adding a collective is adding an entry
// (and an OpType value, a C entry point, and its backend implementations).
#pragma once

#include <optional>
#include <vector>

#include "core/types.h"

namespace hora {

class DeviceExecutor;
class Executor;
class Request;
class SetOpHandler;
struct Response;

// One agreed operation (a fused group: requests[i] belongs to members[i]) as an entry runs it.
struct OpRun {
  const std::vector<Request *> &requests;  // stand-ins where this rank joined
  const std::vector<const Response *> &members;
  Executor *cpu;            // CPU tensors' executor
  DeviceExecutor *device;   // CUDA tensors' executor; for CPU tensors null, for the set ops the
                            // world's (null before its first CUDA op)
  SetOpHandler *handler;    // the world set's runtime (null in a process set)
  int contributors;         // ranks with data: the set's size minus joined ranks
};

struct OpSpec {
  // What the response carries per rank besides the agreed request.
  enum class FirstDims : uint8_t {
    kNone,
    kRows,        // every rank's first dimension, per tensor (allgather)
    kSendSplits,  // every rank's splits, rank-major (alltoall)
    kJoinCount,   // the number of joined ranks' last join (join; filled by negotiation)
  };
  enum class Fusion : uint8_t { kNever, kAlways, kSingleTensor };

  OpType op;
  const char *name = nullptr;          // "allreduce": errors, automatic names, flight recorder
  const char *timelineName = nullptr;  // "ALLREDUCE"

  // Negotiation: every rank must agree on op, dtype, device type and number of tensors, and on:
  bool reduces = false;  // the reduce op and the pre/post scale factors
  bool rooted = false;   // the root rank (which must not have joined)
  const char *agreedSplits = nullptr;  // the splits, named so in a mismatch (null: not agreed)
  bool firstDimFree = false;  // shapes may differ in the first dimension only (a joined rank
                              // has no rows)
  // Under HORA_JOIN_ALLREDUCE_ONLY (hora_set_join_mode, Horovod's join): fails while a rank of
  // the set has joined, instead of running with that rank's zeros or empty rows.
  bool refusedWhileJoined = false;
  FirstDims firstDims = FirstDims::kNone;
  bool carriesTensors = false;  // has tensors (a joined rank's stand-in gets zeroed scratch ones)
  bool cacheable = false;       // a response the response cache may replay by bit
  Fusion fusion = Fusion::kNever;  // with which others of its kind it may share a backend call

  // Execution in the set's cycle; runDevice is null for an op that has no device form.
  void (*runCpu)(const OpRun &run) = nullptr;
  void (*runDevice)(const OpRun &run) = nullptr;
  // The backend call that moves its data, which the set's backend must list in its caps
  // (BackendCaps::runs): its own for the five collectives; an op carried by another's call (a
  // reduce to a root run as an allreduce) names that one. None for the ops that move no tensor.
  std::optional<OpType> backendCall = std::nullopt;
};

// The entry for `op` (a valid OpType).
const OpSpec &opSpec(OpType op);

}  // namespace hora

// SPDX-License-Identifier: Apache-2.0
// Small value types the engine, the wire format and the backends share.
#pragma once

#include <cstdint>
#include <string>

namespace hora {

enum class OpType : uint8_t {
  kAllreduce = 0,
  kBroadcast = 1,
  kAllgather = 2,
  kAlltoall = 3,
  kReducescatter = 4,
  kBarrier = 5,
  kJoin = 6,
  kProcessSetCreate = 7,   // negotiated in the world set
  kProcessSetDestroy = 8,  // negotiated in the world set
};
constexpr int kNumOpTypes = 9;
const char *opTypeName(OpType op);

// Where a tensor lives: DLPack's device type (kDLCPU = 1, kDLCUDA = 2) and ordinal.
struct Device {
  int32_t type = 1;
  int32_t id = 0;

  bool isCpu() const { return type == 1; }
  bool operator==(const Device &o) const { return type == o.type && id == o.id; }
  bool operator!=(const Device &o) const { return !(*this == o); }
  std::string str() const;  // "cpu", "cuda:1"
};

}  // namespace hora

// SPDX-License-Identifier: Apache-2.0
// The op table: one row per OpType, and rows that say what each op is.
#include <gtest/gtest.h>

#include <cctype>
#include <set>
#include <string>

#include "base/error.h"
#include "core/backend.h"
#include "core/op_table.h"

namespace hora {
namespace {

std::string upper(std::string s) {
  for (char &c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

TEST(OpTable, OneRowPerOpTypeUnderItsOwnName) {
  // The names the C API's messages and automatic names have always used.
  const char *expected[kNumOpTypes] = {"allreduce", "broadcast",     "allgather",
                                       "alltoall",  "reducescatter", "barrier",
                                       "join",      "process_set_create", "process_set_destroy"};
  std::set<std::string> seen;
  for (int i = 0; i < kNumOpTypes; ++i) {
    const OpType op = static_cast<OpType>(i);
    const OpSpec &spec = opSpec(op);
    EXPECT_EQ(spec.op, op);
    EXPECT_STREQ(spec.name, expected[i]);
    EXPECT_STREQ(opTypeName(op), expected[i]);
    EXPECT_EQ(std::string(spec.timelineName), upper(expected[i]));
    EXPECT_NE(spec.runCpu, nullptr) << spec.name;
    EXPECT_TRUE(seen.insert(spec.name).second) << spec.name;
  }
  EXPECT_STREQ(opTypeName(static_cast<OpType>(kNumOpTypes)), "unknown-op");
  EXPECT_THROW(opSpec(static_cast<OpType>(kNumOpTypes)), Error);
}

TEST(OpTable, TheOpsWithTensorsRunOnTheBackendsCallsAndOnTheDevice) {
  uint32_t calls = 0;
  for (int i = 0; i < kNumOpTypes; ++i) {
    const OpSpec &spec = opSpec(static_cast<OpType>(i));
    const bool onBackend = spec.backendCall.has_value();
    // Exactly the ops with tensors move data, can be cached, and have a device form.
    EXPECT_EQ(onBackend, spec.carriesTensors) << spec.name;
    EXPECT_EQ(onBackend, spec.cacheable) << spec.name;
    EXPECT_EQ(onBackend, spec.runDevice != nullptr) << spec.name;
    if (onBackend) {
      // A call every plane offers (BackendCaps::plain), so no plane refuses the op.
      const uint32_t bit = 1u << static_cast<unsigned>(*spec.backendCall);
      EXPECT_NE(bit & kAllDataCollectives, 0u) << spec.name;
      calls |= bit;
    }
  }
  // The five collectives each run on their own call: every call is some op's.
  for (OpType op : {OpType::kAllreduce, OpType::kBroadcast, OpType::kAllgather, OpType::kAlltoall,
                    OpType::kReducescatter}) {
    EXPECT_EQ(opSpec(op).backendCall, op) << opTypeName(op);
  }
  EXPECT_EQ(calls, kAllDataCollectives);
}

TEST(OpTable, RowsSayWhatRanksMustAgreeOn) {
  // Reductions agree on op and scales; broadcast on its root; the set ops on their arguments.
  for (OpType op : {OpType::kAllreduce, OpType::kReducescatter}) EXPECT_TRUE(opSpec(op).reduces);
  for (OpType op : {OpType::kBroadcast, OpType::kAllgather, OpType::kAlltoall, OpType::kBarrier}) {
    EXPECT_FALSE(opSpec(op).reduces) << opTypeName(op);
  }
  EXPECT_TRUE(opSpec(OpType::kBroadcast).rooted);
  EXPECT_FALSE(opSpec(OpType::kAllreduce).rooted);
  EXPECT_STREQ(opSpec(OpType::kProcessSetCreate).agreedSplits, "ranks");
  EXPECT_STREQ(opSpec(OpType::kProcessSetDestroy).agreedSplits, "process set");
  // alltoall's splits are each rank's own: not agreed, but gathered into the response.
  EXPECT_EQ(opSpec(OpType::kAlltoall).agreedSplits, nullptr);
  EXPECT_EQ(opSpec(OpType::kAlltoall).firstDims, OpSpec::FirstDims::kSendSplits);
  // Only gather-like ops let ranks differ in the first dimension.
  EXPECT_TRUE(opSpec(OpType::kAllgather).firstDimFree);
  EXPECT_TRUE(opSpec(OpType::kAlltoall).firstDimFree);
  EXPECT_FALSE(opSpec(OpType::kAllreduce).firstDimFree);
  EXPECT_FALSE(opSpec(OpType::kReducescatter).firstDimFree);
  // Fusion: any allreduce; single-tensor allgather and reducescatter; nothing else.
  EXPECT_EQ(opSpec(OpType::kAllreduce).fusion, OpSpec::Fusion::kAlways);
  EXPECT_EQ(opSpec(OpType::kAllgather).fusion, OpSpec::Fusion::kSingleTensor);
  EXPECT_EQ(opSpec(OpType::kReducescatter).fusion, OpSpec::Fusion::kSingleTensor);
  EXPECT_EQ(opSpec(OpType::kBroadcast).fusion, OpSpec::Fusion::kNever);
  EXPECT_EQ(opSpec(OpType::kAlltoall).fusion, OpSpec::Fusion::kNever);
}

TEST(BackendCaps, PlainOffersEveryCollectiveAndEveryDtypeButTheHalfTypes) {
  const BackendCaps c = BackendCaps::plain(/*usesSockets=*/true, BackendCaps::Scope::kAnyHost);
  for (OpType op : {OpType::kAllreduce, OpType::kBroadcast, OpType::kAllgather, OpType::kAlltoall,
                    OpType::kReducescatter}) {
    EXPECT_TRUE(c.runs(op)) << opTypeName(op);
  }
  EXPECT_FALSE(c.runs(OpType::kBarrier));
  for (DType t : {DType::kUInt8, DType::kInt8, DType::kInt32, DType::kInt64, DType::kFloat32,
                  DType::kFloat64}) {
    EXPECT_TRUE(c.reduces(t)) << dtypeName(t);
  }
  EXPECT_FALSE(c.reduces(DType::kFloat16));
  EXPECT_FALSE(c.reduces(DType::kBFloat16));
  EXPECT_FALSE(c.reducesSpansInPlace);
  EXPECT_EQ(c.negotiationWords, 0u);
  EXPECT_TRUE(c.usesSockets);
}

}  // namespace
}  // namespace hora

// SPDX-License-Identifier: Apache-2.0
// The NCCL backend's host-side decisions, which build and run without a GPU: NCCL ops and
// scaling for every reduction, the fusion buffer's layout, and the plans for uneven allgather,
// reducescatter and alltoall.
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <tuple>

#include "backends/nccl/nccl_plan.h"
#include "base/error.h"

namespace hora::nccl_plan {
namespace {

TEST(NcclPlan, DtypesMapToNcclsValues) {
  // nccl.h: ncclInt8 0, ncclUint8 1, ncclInt32 2, ncclInt64 4, ncclFloat16 6, ncclFloat32 7,
  // ncclFloat64 8, ncclBfloat16 9.
  EXPECT_EQ(static_cast<int>(ncclType(DType::kInt8)), 0);
  EXPECT_EQ(static_cast<int>(ncclType(DType::kUInt8)), 1);
  EXPECT_EQ(static_cast<int>(ncclType(DType::kInt32)), 2);
  EXPECT_EQ(static_cast<int>(ncclType(DType::kInt64)), 4);
  EXPECT_EQ(static_cast<int>(ncclType(DType::kFloat16)), 6);
  EXPECT_EQ(static_cast<int>(ncclType(DType::kFloat32)), 7);
  EXPECT_EQ(static_cast<int>(ncclType(DType::kFloat64)), 8);
  EXPECT_EQ(static_cast<int>(ncclType(DType::kBFloat16)), 9);
  // bool is torch.bool's bytes, reduced as ncclUint8; NCCL has no 16-bit integer.
  EXPECT_EQ(static_cast<int>(ncclType(DType::kBool)), 1);
  try {
    ncclType(DType::kInt16);
    FAIL() << "int16 got an NCCL type";
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_UNSUPPORTED);
    EXPECT_NE(e.message().find("int16"), std::string::npos) << e.message();
  }
}

// bool as 0/1 bytes: OR is the maximum, AND the minimum; no scaling pass, no premultiplied sum.
TEST(NcclPlan, BoolReducesAsMaxOrMinOfBytes) {
  const std::pair<ReduceOp, NcclOp> cases[] = {{ReduceOp::kSum, NcclOp::kMax},
                                               {ReduceOp::kMax, NcclOp::kMax},
                                               {ReduceOp::kMin, NcclOp::kMin},
                                               {ReduceOp::kProduct, NcclOp::kMin}};
  for (auto [op, nccl] : cases) {
    for (int contributors : {4, 3}) {  // a joined rank changes nothing for bool
      AllreducePlan p = planAllreduce(DType::kBool, op, 1.0, 1.0, contributors, 4);
      EXPECT_EQ(p.op, nccl) << reduceOpName(op);
      EXPECT_FALSE(p.premulSum) << reduceOpName(op);
      EXPECT_EQ(p.kernelPrescale, 1.0);
      EXPECT_EQ(p.kernelPostscale, 1.0);
    }
  }
  for (auto [op, pre, post] : {std::tuple{ReduceOp::kAverage, 1.0, 1.0},
                               std::tuple{ReduceOp::kSum, 2.0, 1.0},
                               std::tuple{ReduceOp::kMax, 1.0, 0.5}}) {
    try {
      planAllreduce(DType::kBool, op, pre, post, 2, 2);
      FAIL() << "bool accepted " << reduceOpName(op) << " x" << pre << " x" << post;
    } catch (const Error &e) {
      EXPECT_EQ(e.status(), HORA_ERR_UNSUPPORTED);
      EXPECT_NE(e.message().find("bool"), std::string::npos) << e.message();
    }
  }
}

// NCCL has no 16-bit integer type: every int16 reduction is refused (refused at submission
// already, through whyNotReduced; this is the backend's own guard).
TEST(NcclPlan, Int16ReductionsAreRefused) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct,
                      ReduceOp::kAverage}) {
    try {
      planAllreduce(DType::kInt16, op, 1.0, 1.0, 2, 2);
      FAIL() << "int16 " << reduceOpName(op) << " planned";
    } catch (const Error &e) {
      EXPECT_EQ(e.status(), HORA_ERR_UNSUPPORTED);
      EXPECT_NE(e.message().find("int16"), std::string::npos) << e.message();
      EXPECT_NE(e.message().find("NCCL"), std::string::npos) << e.message();
    }
  }
}

// The rule asked before submission agrees with the plan: int16 alone is refused, with the words
// the caller's message ends with.
TEST(NcclPlan, WhyNotReducedNamesInt16Only) {
  for (DType t : {DType::kUInt8, DType::kInt8, DType::kInt32, DType::kInt64, DType::kFloat16,
                  DType::kBFloat16, DType::kFloat32, DType::kFloat64, DType::kBool}) {
    EXPECT_EQ(whyNotReduced(t), nullptr) << dtypeName(t);
  }
  ASSERT_NE(whyNotReduced(DType::kInt16), nullptr);
  EXPECT_STREQ(whyNotReduced(DType::kInt16),
               "NCCL has no 16-bit integer type (reduce it as int32, or on the CPU)");
}

TEST(NcclPlan, PlainReductionsAreNcclsOwnWithNoPass) {
  const std::pair<ReduceOp, NcclOp> cases[] = {{ReduceOp::kSum, NcclOp::kSum},
                                               {ReduceOp::kMin, NcclOp::kMin},
                                               {ReduceOp::kMax, NcclOp::kMax},
                                               {ReduceOp::kProduct, NcclOp::kProd}};
  for (auto [op, nccl] : cases) {
    for (DType t : {DType::kInt32, DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
      AllreducePlan p = planAllreduce(t, op, 1.0, 1.0, 4, 4);
      EXPECT_EQ(p.op, nccl) << reduceOpName(op);
      EXPECT_FALSE(p.premulSum);
      EXPECT_EQ(p.kernelPrescale, 1.0);
      EXPECT_EQ(p.kernelPostscale, 1.0);
    }
  }
}

TEST(NcclPlan, AverageIsNcclAvgOnlyWhenEveryRankContributesUnscaled) {
  EXPECT_EQ(planAllreduce(DType::kFloat32, ReduceOp::kAverage, 1.0, 1.0, 4, 4).op, NcclOp::kAvg);
  // One rank joined: NCCL would divide by 4; the divisor is the 3 that contributed.
  AllreducePlan joined = planAllreduce(DType::kFloat32, ReduceOp::kAverage, 1.0, 1.0, 3, 4);
  EXPECT_EQ(joined.op, NcclOp::kSum);
  EXPECT_TRUE(joined.premulSum);
  EXPECT_DOUBLE_EQ(joined.premulFactor, 1.0 / 3);
  EXPECT_EQ(joined.kernelPostscale, 1.0);
  // Scaled average: everything in one premultiplied sum.
  AllreducePlan scaled = planAllreduce(DType::kFloat16, ReduceOp::kAverage, 2.0, 0.5, 4, 4);
  EXPECT_EQ(scaled.op, NcclOp::kSum);
  EXPECT_DOUBLE_EQ(scaled.premulFactor, 2.0 * 0.5 / 4);
  EXPECT_EQ(scaled.kernelPrescale, 1.0);
  EXPECT_EQ(scaled.kernelPostscale, 1.0);
}

TEST(NcclPlan, SumFoldsBothScalesIntoThePremultipliedSum) {
  AllreducePlan p = planAllreduce(DType::kBFloat16, ReduceOp::kSum, 3.0, 0.25, 2, 2);
  EXPECT_EQ(p.op, NcclOp::kSum);
  EXPECT_TRUE(p.premulSum);
  EXPECT_DOUBLE_EQ(p.premulFactor, 0.75);
  // Factors that cancel need nothing at all.
  EXPECT_FALSE(planAllreduce(DType::kFloat32, ReduceOp::kSum, 4.0, 0.25, 2, 2).premulSum);
}

TEST(NcclPlan, MinMaxProductScaleWithKernelPasses) {
  AllreducePlan p = planAllreduce(DType::kFloat32, ReduceOp::kMax, 2.0, 0.5, 2, 2);
  EXPECT_EQ(p.op, NcclOp::kMax);
  EXPECT_FALSE(p.premulSum);
  EXPECT_EQ(p.kernelPrescale, 2.0);
  EXPECT_EQ(p.kernelPostscale, 0.5);
  AllreducePlan q = planAllreduce(DType::kFloat64, ReduceOp::kProduct, 1.0, 3.0, 2, 2);
  EXPECT_EQ(q.op, NcclOp::kProd);
  EXPECT_EQ(q.kernelPrescale, 1.0);
  EXPECT_EQ(q.kernelPostscale, 3.0);
}

TEST(NcclPlan, IntegersRefuseScalingAndAverage) {
  for (auto [op, pre] : {std::pair{ReduceOp::kAverage, 1.0}, std::pair{ReduceOp::kSum, 2.0}}) {
    try {
      planAllreduce(DType::kInt64, op, pre, 1.0, 2, 2);
      FAIL() << "accepted " << reduceOpName(op) << " with prescale " << pre;
    } catch (const Error &e) {
      EXPECT_EQ(e.status(), HORA_ERR_UNSUPPORTED);
      EXPECT_NE(e.message().find("int64"), std::string::npos) << e.message();
    }
  }
}

TEST(NcclPlan, LayoutAlignsEveryTensorAndCoversThePadding) {
  Layout l = packLayout({6, 512, 0, 2, 300}, 2);
  EXPECT_EQ(l.offsets, (std::vector<int64_t>{0, 256, 768, 768, 1024}));
  EXPECT_EQ(l.bytes, 1324);
  EXPECT_EQ(l.elements, 662);
  for (size_t i = 1; i < l.offsets.size(); ++i) EXPECT_EQ(l.offsets[i] % kAlign, 0);
  EXPECT_EQ(packLayout({}, 4).bytes, 0);
  EXPECT_THROW(packLayout({6}, 4), Error);  // not a whole number of elements
}

TEST(NcclPlan, AllgatherIsOneCollectiveOnlyForEqualBlocks) {
  GatherPlan even = planAllgather({64, 64, 64});
  EXPECT_TRUE(even.uniform);
  EXPECT_EQ(even.offsets, (std::vector<int64_t>{0, 64, 128}));
  EXPECT_EQ(even.totalBytes, 192);
  GatherPlan uneven = planAllgather({64, 0, 32});
  EXPECT_FALSE(uneven.uniform);
  EXPECT_EQ(uneven.offsets, (std::vector<int64_t>{0, 64, 64}));
  EXPECT_EQ(uneven.totalBytes, 96);
}

TEST(NcclPlan, ReducescatterBlocksStartWhereThePreviousEnd) {
  ScatterPlan even = planReducescatter({5, 5});
  EXPECT_TRUE(even.uniform);
  ScatterPlan uneven = planReducescatter({3, 3, 2});  // 8 rows over 3 ranks
  EXPECT_FALSE(uneven.uniform);
  EXPECT_EQ(uneven.offsets, (std::vector<int64_t>{0, 3, 6}));
}

TEST(NcclPlan, AlltoallSendsToPeersAndCopiesItsOwnBlock) {
  // Rank 1 of 3: sends 10 bytes to 0, 20 to itself, 0 to 2; receives 5, 20, 7.
  AlltoallPlan p = planAlltoall(1, {10, 20, 0}, {5, 20, 7});
  EXPECT_EQ(p.selfSendOffset, 10);
  EXPECT_EQ(p.selfRecvOffset, 5);
  EXPECT_EQ(p.selfBytes, 20);
  ASSERT_EQ(p.transfers.size(), 2u);
  EXPECT_EQ(p.transfers[0].peer, 0);
  EXPECT_EQ(p.transfers[0].sendOffset, 0);
  EXPECT_EQ(p.transfers[0].sendBytes, 10);
  EXPECT_EQ(p.transfers[0].recvOffset, 0);
  EXPECT_EQ(p.transfers[0].recvBytes, 5);
  EXPECT_EQ(p.transfers[1].peer, 2);  // nothing to send, but 7 bytes to receive
  EXPECT_EQ(p.transfers[1].sendBytes, 0);
  EXPECT_EQ(p.transfers[1].recvOffset, 25);
  EXPECT_EQ(p.transfers[1].recvBytes, 7);
  // A peer with nothing either way is left out.
  EXPECT_TRUE(planAlltoall(0, {4, 0}, {4, 0}).transfers.empty());
  EXPECT_THROW(planAlltoall(0, {4, 1}, {3, 1}), Error);  // its own block must match
}

}  // namespace
}  // namespace hora::nccl_plan

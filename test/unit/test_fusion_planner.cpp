// SPDX-License-Identifier: Apache-2.0
// The fusion planner: exact groups for given response lists.
#include <gtest/gtest.h>

#include "core/fusion_planner.h"

namespace hora {
namespace {

Response allreduce(const std::string &name, int64_t n, DType dtype = DType::kFloat32,
                   ReduceOp op = ReduceOp::kSum, double pre = 1.0) {
  Response r;
  r.agreed.name = name;
  r.agreed.op = OpType::kAllreduce;
  r.agreed.dtype = dtype;
  r.agreed.reduceOp = op;
  r.agreed.prescale = pre;
  r.agreed.shapes = {{n}};
  return r;
}

std::vector<std::vector<size_t>> members(const std::vector<FusionGroup> &groups) {
  std::vector<std::vector<size_t>> out;
  for (const auto &g : groups) out.push_back(g.members);
  return out;
}

using Groups = std::vector<std::vector<size_t>>;

TEST(FusionPlanner, CompatibleAllreducesFuseUpToTheThreshold) {
  // 4-byte floats: 10 elements = 40 bytes each.
  std::vector<Response> rs = {allreduce("a", 10), allreduce("b", 10), allreduce("c", 10)};
  EXPECT_EQ(members(planFusion(rs, 1000)), (Groups{{0, 1, 2}}));
  EXPECT_EQ(members(planFusion(rs, 80)), (Groups{{0, 1}, {2}}));
  auto groups = planFusion(rs, 80);
  EXPECT_EQ(groups[0].bytes, 80);
  EXPECT_EQ(groups[1].bytes, 40);
}

TEST(FusionPlanner, IncompatibleResponsesDoNotFuse) {
  std::vector<Response> rs = {
      allreduce("a", 10), allreduce("b", 10, DType::kFloat64), allreduce("c", 10),
      allreduce("d", 10, DType::kFloat32, ReduceOp::kMax), allreduce("e", 10, DType::kFloat32, ReduceOp::kSum, 0.5),
      allreduce("f", 10, DType::kFloat64)};
  EXPECT_EQ(members(planFusion(rs, 1 << 20)), (Groups{{0, 2}, {1, 5}, {3}, {4}}));
}

TEST(FusionPlanner, LargeTensorsErrorsAndOtherOpsRunAlone) {
  std::vector<Response> rs = {allreduce("small", 2), allreduce("big", 1000), allreduce("small2", 2)};
  rs.push_back(allreduce("bad", 2));
  rs.back().status = HORA_ERR_MISMATCH;
  rs.push_back(allreduce("bc", 2));
  rs.back().agreed.op = OpType::kBroadcast;
  // Threshold 400 bytes: "big" (4000 bytes) is over it and runs alone.
  EXPECT_EQ(members(planFusion(rs, 400)), (Groups{{0, 2}, {1}, {3}, {4}}));
}

TEST(FusionPlanner, FirstFitKeepsListOrderWithinGroups) {
  std::vector<Response> rs;
  for (int i = 0; i < 6; ++i) rs.push_back(allreduce("t" + std::to_string(i), i % 2 ? 30 : 10));
  // bytes: 40,120,40,120,40,120 with threshold 200: first fit.
  EXPECT_EQ(members(planFusion(rs, 200)), (Groups{{0, 1, 2}, {3, 4}, {5}}));
}

TEST(FusionPlanner, EmptyListAndZeroSizedTensors) {
  EXPECT_TRUE(planFusion(std::vector<Response>{}, 100).empty());
  std::vector<Response> rs = {allreduce("z", 0), allreduce("y", 0)};
  EXPECT_EQ(members(planFusion(rs, 100)), (Groups{{0, 1}}));
}

Response gather(const std::string &name, std::vector<int64_t> firstDims, int64_t cols,
                DType dtype = DType::kFloat32) {
  Response r;
  r.agreed.name = name;
  r.agreed.op = OpType::kAllgather;
  r.agreed.dtype = dtype;
  r.agreed.shapes = {{firstDims.at(0), cols}};
  r.firstDims = std::move(firstDims);
  return r;
}

TEST(FusionPlanner, AllgathersFuseByGatheredBytesAndNeverWithAllreduces) {
  // 4-byte floats, 2 columns: {1,2,0} rows gather to 3 rows = 24 bytes; {0,0,5} = 40 bytes.
  std::vector<Response> rs = {gather("g0", {1, 2, 0}, 2), allreduce("a", 6), gather("g1", {0, 0, 5}, 2),
                              gather("g2", {1, 1, 1}, 2, DType::kInt32)};
  EXPECT_EQ(responseBytes(rs[0]), 24);
  EXPECT_EQ(responseBytes(rs[2]), 40);
  EXPECT_EQ(members(planFusion(rs, 1000)), (Groups{{0, 2}, {1}, {3}}));
  EXPECT_EQ(members(planFusion(rs, 50)), (Groups{{0}, {1}, {2}, {3}}));
}

TEST(FusionPlanner, ReducescattersFuseLikeAllreducesButSeparately) {
  std::vector<Response> rs = {allreduce("a", 4), allreduce("b", 4), allreduce("c", 4)};
  rs[1].agreed.op = OpType::kReducescatter;
  rs[2].agreed.op = OpType::kReducescatter;
  rs.push_back(allreduce("d", 4, DType::kFloat32, ReduceOp::kMax));
  rs.back().agreed.op = OpType::kReducescatter;
  EXPECT_EQ(members(planFusion(rs, 1000)), (Groups{{0}, {1, 2}, {3}}));
}

TEST(FusionPlanner, ResponsesWithDifferentJoinedRanksDoNotFuse) {
  std::vector<Response> rs = {allreduce("a", 4), allreduce("b", 4), allreduce("c", 4)};
  rs[1].joined = {2};
  rs[2].joined = {2};
  EXPECT_EQ(members(planFusion(rs, 1000)), (Groups{{0}, {1, 2}}));
}

TEST(FusionPlanner, GroupedAllreduceStaysWholeAndMayJoinOthers) {
  Response grouped = allreduce("grp", 10);
  grouped.agreed.shapes.push_back({10});  // 80 bytes in two tensors
  std::vector<Response> rs = {allreduce("a", 10), grouped};
  EXPECT_EQ(members(planFusion(rs, 120)), (Groups{{0, 1}}));
  EXPECT_EQ(members(planFusion(rs, 100)), (Groups{{0}, {1}}));
  EXPECT_EQ(members(planFusion({grouped}, 10)), (Groups{{0}}));
}

TEST(FusionPlanner, ResponseBytesCountsEveryTensor) {
  Response r = allreduce("g", 3, DType::kFloat16);
  r.agreed.shapes.push_back({2, 5});
  EXPECT_EQ(responseBytes(r), (3 + 10) * 2);
}

}  // namespace
}  // namespace hora

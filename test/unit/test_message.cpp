// SPDX-License-Identifier: Apache-2.0
// Wire encoding: round trips, and malformed or truncated input rejected with an error.
#include <gtest/gtest.h>

#include <random>

#include "base/error.h"
#include "core/message.h"

namespace hora {
namespace {

RequestMsg sample(int i) {
  RequestMsg m;
  m.name = "layer" + std::to_string(i) + ".weight";
  m.op = static_cast<OpType>(i % kNumOpTypes);
  m.reduceOp = static_cast<ReduceOp>(i % kNumReduceOps);
  m.dtype = static_cast<DType>(i % kNumDTypes);
  m.device = Device{i % 2 ? 2 : 1, i % 3};
  m.root = i % 5;
  m.prescale = 0.5 * i;
  m.postscale = 1.0 / (i + 1);
  m.shapes = {{i, 3, 7}, {}};
  m.splits = {i, 0, 2 * i};
  m.joinMode = static_cast<uint8_t>(i % 2);
  if (i % 3 == 2) m.rejected = "input: dtype (code 5, bits 64) is not supported #" + std::to_string(i);
  return m;
}

TEST(Message, RequestsRoundTrip) {
  std::vector<RequestMsg> in;
  for (int i = 0; i < 20; ++i) in.push_back(sample(i));
  std::vector<RequestMsg> out = decodeRequests(encodeRequests(in));
  ASSERT_EQ(out.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) EXPECT_TRUE(out[i] == in[i]) << i;
}

TEST(Message, EmptyListsRoundTrip) {
  EXPECT_TRUE(decodeRequests(encodeRequests({})).empty());
  EXPECT_TRUE(decodeResponses(encodeResponses({})).empty());
}

TEST(Message, ResponsesRoundTrip) {
  std::vector<Response> in(3);
  in[0].agreed = sample(1);
  in[1].agreed = sample(2);
  in[1].status = HORA_ERR_MISMATCH;
  in[1].error = "allreduce 'x': ranks disagree on shape";
  in[2].agreed = sample(3);
  in[2].firstDims = {1, 2, 0, 5};
  in[2].joined = {0, 3};
  std::vector<Response> out = decodeResponses(encodeResponses(in));
  ASSERT_EQ(out.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(out[i].agreed == in[i].agreed);
    EXPECT_EQ(out[i].status, in[i].status);
    EXPECT_EQ(out[i].error, in[i].error);
    EXPECT_EQ(out[i].firstDims, in[i].firstDims);
    EXPECT_EQ(out[i].joined, in[i].joined);
  }
}

TEST(Message, EveryTruncationIsRejected) {
  std::vector<RequestMsg> in = {sample(4), sample(5)};
  const std::string bytes = encodeRequests(in);
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_THROW(decodeRequests(bytes.substr(0, n)), Error) << "prefix of " << n << " bytes";
  }
  std::vector<Response> resp(1);
  resp[0].agreed = sample(6);
  resp[0].firstDims = {3, 4};
  const std::string rbytes = encodeResponses(resp);
  for (size_t n = 0; n < rbytes.size(); ++n) {
    EXPECT_THROW(decodeResponses(rbytes.substr(0, n)), Error) << "prefix of " << n << " bytes";
  }
}

TEST(Message, WrongKindTrailingBytesAndBadEnumsAreRejected) {
  const std::string req = encodeRequests({sample(1)});
  EXPECT_THROW(decodeResponses(req), Error);
  EXPECT_THROW(decodeRequests(req + "x"), Error);
  std::string badVersion = req;
  badVersion[1] = 99;
  EXPECT_THROW(decodeRequests(badVersion), Error);
  // The op byte follows the header (2), the count (8), the name length (8) and the name.
  std::string badOp = req;
  const size_t opAt = 2 + 8 + 8 + sample(1).name.size();
  badOp[opAt] = static_cast<char>(200);
  try {
    decodeRequests(badOp);
    ADD_FAILURE() << "bad op accepted";
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_INTERNAL);
    EXPECT_NE(e.message().find("malformed"), std::string::npos);
  }
}

// A tombstone and the join mode travel, and take part in a request's identity (the response
// cache's signature): a tombstone never equals the real request of its name.
TEST(Message, TombstoneAndJoinModeRoundTripAndCount) {
  RequestMsg real = sample(1);
  real.rejected.clear();
  real.joinMode = HORA_JOIN_ZERO_FILL;
  RequestMsg tomb = real;
  tomb.rejected = "root 7 is outside the process set's ranks [0, 2)";
  EXPECT_FALSE(real.isTombstone());
  EXPECT_TRUE(tomb.isTombstone());
  EXPECT_FALSE(tomb == real);
  RequestMsg strict = real;
  strict.joinMode = HORA_JOIN_ALLREDUCE_ONLY;
  EXPECT_FALSE(strict == real);
  std::vector<RequestMsg> out = decodeRequests(encodeRequests({real, tomb, strict}));
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].rejected, "");
  EXPECT_EQ(out[1].rejected, tomb.rejected);
  EXPECT_EQ(out[2].joinMode, HORA_JOIN_ALLREDUCE_ONLY);
  EXPECT_TRUE(out[1] == tomb);
  // An unknown join mode is refused. It is the byte after the splits, which end the message
  // before the rejection's (empty) length.
  std::string bytes = encodeRequests({real});
  const size_t modeAt = bytes.size() - 8 - 1;
  ASSERT_EQ(bytes[modeAt], 0);
  bytes[modeAt] = 2;
  EXPECT_THROW(decodeRequests(bytes), Error);
}

TEST(Message, HugeCountsDoNotAllocate) {
  std::string bytes = encodeRequests({});
  // Overwrite the count with 2^60: decoding must fail fast, not try to reserve it.
  const uint64_t huge = uint64_t{1} << 60;
  std::memcpy(&bytes[2], &huge, 8);
  EXPECT_THROW(decodeRequests(bytes), Error);
}

// Found by the fuzzer (test/fuzz): a count under the hard limit (2^24 shapes) but far beyond
// what the message could hold made decoding allocate hundreds of MB before noticing.
TEST(Message, CountsBeyondTheMessageAreRefusedBeforeAllocating) {
  RequestMsg one = sample(1);
  one.shapes.clear();
  std::string bytes = encodeRequests({one});
  // The shape-list count sits 8 + 3 + 12 + 16 bytes into the request, after its name.
  const size_t at = 2 + 8 + 8 + one.name.size() + 3 + 12 + 16;
  const uint64_t many = uint64_t{1} << 23;  // under kMaxItems
  std::memcpy(&bytes[at], &many, 8);
  try {
    decodeRequests(bytes);
    ADD_FAILURE() << "a count of 2^23 shapes in a " << bytes.size() << "-byte message was accepted";
  } catch (const Error &e) {
    EXPECT_NE(e.message().find("count larger than the rest of the message"), std::string::npos)
        << e.message();
  }
}

TEST(Message, RandomBytesNeverCrash) {
  std::mt19937 rng(7);
  const std::string good = encodeRequests({sample(1), sample(2)});
  for (int iter = 0; iter < 2000; ++iter) {
    std::string b = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) b[rng() % b.size()] = static_cast<char>(rng());
    try {
      decodeRequests(b);
    } catch (const Error &e) {
      EXPECT_EQ(e.status(), HORA_ERR_INTERNAL);
    }
  }
}

TEST(Message, ShapeHelpers) {
  EXPECT_EQ(shapeString({1024, 16}), "[1024,16]");
  EXPECT_EQ(shapeString({}), "[]");
  EXPECT_EQ(numElements({}), 1);
  EXPECT_EQ(numElements({3, 0, 5}), 0);
  EXPECT_EQ(numElements({3, 4, 5}), 60);
}

}  // namespace
}  // namespace hora

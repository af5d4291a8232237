// SPDX-License-Identifier: Apache-2.0
// The whole engine in a world of one: init handshake, queue, negotiation, fusion, execution.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <set>
#include <string>

#include "api/runtime.h"
#include "backends/registry.h"
#include "core/refusals.h"

namespace hora {
namespace {

Knobs singleKnobs() {
  Knobs k;
  k.bootstrap = "single";
  return k;
}

RequestPtr allreduce(const std::string &name, std::vector<float> &in, std::vector<float> &out,
                     ReduceOp op = ReduceOp::kSum, double pre = 1.0, double post = 1.0) {
  RequestMsg m;
  m.name = name;
  m.op = OpType::kAllreduce;
  m.dtype = DType::kFloat32;
  m.reduceOp = op;
  m.prescale = pre;
  m.postscale = post;
  m.shapes = {{static_cast<int64_t>(in.size())}};
  return std::make_shared<Request>(m, 0, std::vector<TensorArg>{{in.data(), out.data(), static_cast<int64_t>(in.size())}});
}

TEST(EngineSingle, StartsAsAWorldOfOne) {
  auto engine = startRuntime(singleKnobs());
  EXPECT_TRUE(engine->running());
  EXPECT_EQ(engine->topology().rank, 0);
  EXPECT_EQ(engine->topology().size, 1);
  EXPECT_STREQ(engine->launcher(), "single");
  EXPECT_STREQ(engine->backendName(), "self");
  engine->shutdown();
  EXPECT_FALSE(engine->running());
}

// HORA_CPU_BACKEND's parser takes any plain name; the registry refuses one that is not a plane
// of this build at start, even in a world of one (which "self" would otherwise serve), naming the
// planes there are.
TEST(EngineSingle, UnknownCpuPlaneFailsStart) {
  std::string built;
  for (const PlaneInfo &p : cpuPlanes()) {
    if (p.byName && p.built) built += (built.empty() ? "" : ", ") + p.name;
  }
  Knobs k = singleKnobs();
  k.cpuBackend = "tcp";
  try {
    startRuntime(k);
    FAIL() << "started";
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_INVALID_ARGUMENT);
    EXPECT_NE(e.message().find("HORA_CPU_BACKEND=tcp: not a CPU plane of this build; it has: " +
                               (built.empty() ? std::string("none") : built)),
              std::string::npos)
        << e.message();
  }
}

// The registry's one list of planes: every name once, plain, "self" not selectable by name.
TEST(EngineSingle, CpuPlanesAreOneList) {
  std::set<std::string> names;
  for (const PlaneInfo &p : cpuPlanes()) {
    EXPECT_TRUE(names.insert(p.name).second) << p.name << " twice";
    EXPECT_EQ(p.name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_"), std::string::npos);
    EXPECT_EQ(p.byName, p.name != "self") << p.name;
  }
  for (const char *n : {"mpi", "gloo", "ucx", "self"}) EXPECT_TRUE(names.count(n)) << n;
  EXPECT_EQ(names.count("auto"), 0u);
}

TEST(EngineSingle, InitFailureReturnsTheThreadsRealStatus) {
  // env:// asked for, but none of its variables set: init fails on the engine thread, and
  // start() must return that thread's status, not hang or report success.
  for (const char *v : {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "SLURM_PROCID"}) {
    ASSERT_EQ(std::getenv(v), nullptr) << v << " is set in this test's environment";
  }
  Knobs k;
  k.bootstrap = "env";
  try {
    startRuntime(k);
    FAIL() << "started";
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_INVALID_ARGUMENT);
    EXPECT_NE(e.message().find("MASTER_ADDR is not set"), std::string::npos) << e.message();
  }
}

TEST(EngineSingle, AllreduceWithScalingFusedAndAlone) {
  auto engine = startRuntime(singleKnobs());
  std::vector<std::vector<float>> ins, outs;
  for (int t = 0; t < 50; ++t) {
    ins.emplace_back(static_cast<size_t>(t + 1));
    outs.emplace_back(static_cast<size_t>(t + 1), -1.0f);
    for (size_t i = 0; i < ins.back().size(); ++i) ins.back()[i] = static_cast<float>(t * 100 + i);
  }
  std::vector<RequestPtr> reqs;
  for (int t = 0; t < 50; ++t) {
    reqs.push_back(allreduce("t" + std::to_string(t), ins[static_cast<size_t>(t)],
                             outs[static_cast<size_t>(t)], ReduceOp::kAverage, 0.5, 4.0));
    engine->submit(reqs.back());
  }
  engine->drive(*reqs.front());
  for (int t = 0; t < 50; ++t) {
    Status s = reqs[static_cast<size_t>(t)]->wait();
    ASSERT_TRUE(s.ok()) << s.message;
    for (size_t i = 0; i < ins[static_cast<size_t>(t)].size(); ++i) {
      // average over one rank of 0.5*x, times 4
      EXPECT_EQ(outs[static_cast<size_t>(t)][i], 2.0f * ins[static_cast<size_t>(t)][i]);
    }
  }
  engine->shutdown();
}

TEST(EngineSingle, Float16IsWidenedAndNarrowed) {
  auto engine = startRuntime(singleKnobs());
  std::vector<uint16_t> a = {floatToHalf(1.5f), floatToHalf(-2.0f), floatToHalf(1000.0f)};
  std::vector<uint16_t> b(3, 0);
  RequestMsg m;
  m.name = "h";
  m.dtype = DType::kFloat16;
  m.postscale = 3.0;
  m.shapes = {{3}};
  auto r = std::make_shared<Request>(m, 0, std::vector<TensorArg>{{a.data(), b.data(), 3}});
  engine->submit(r);
  ASSERT_TRUE(r->wait().ok());
  EXPECT_EQ(halfToFloat(b[0]), 4.5f);
  EXPECT_EQ(halfToFloat(b[1]), -6.0f);
  EXPECT_EQ(halfToFloat(b[2]), 3000.0f);
  engine->shutdown();
}

TEST(EngineSingle, AllgatherOwnsItsOutput) {
  auto engine = startRuntime(singleKnobs());
  std::vector<int64_t> in = {1, 2, 3, 4, 5, 6};
  RequestMsg m;
  m.name = "g";
  m.op = OpType::kAllgather;
  m.dtype = DType::kInt64;
  m.shapes = {{2, 3}};
  auto r = std::make_shared<Request>(m, 0, std::vector<TensorArg>{{in.data(), nullptr, 6}});
  engine->submit(r);
  ASSERT_TRUE(r->wait().ok());
  const DLTensor *out = r->output();
  ASSERT_NE(out, nullptr);
  ASSERT_EQ(out->ndim, 2);
  EXPECT_EQ(out->shape[0], 2);
  EXPECT_EQ(out->shape[1], 3);
  EXPECT_EQ(out->dtype.code, kDLInt);
  EXPECT_EQ(out->dtype.bits, 64);
  const auto *data = static_cast<const int64_t *>(out->data);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(data[i], in[static_cast<size_t>(i)]);
  engine->shutdown();
}

TEST(EngineSingle, DuplicateNamesAndSubmitAfterShutdown) {
  auto engine = startRuntime(singleKnobs());
  std::vector<float> in(4, 1.0f), out(4);
  auto first = allreduce("dup", in, out);
  engine->submit(first);
  bool sawDuplicate = false;
  try {
    engine->submit(allreduce("dup", in, out));
  } catch (const Error &e) {
    // The first may already have completed and released the name.
    sawDuplicate = e.status() == HORA_ERR_DUPLICATE_NAME;
  }
  (void)sawDuplicate;
  ASSERT_TRUE(first->wait().ok());
  engine->submit(allreduce("dup2", in, out));
  engine->shutdown();
  try {
    engine->submit(allreduce("late", in, out));
    FAIL() << "submit after shutdown accepted";
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_SHUT_DOWN);
  }
}

// The refusal protocol (core/refusals.h) as any front-end uses it: a refused unnamed call uses
// up the automatic name it would have taken (its tombstone carries it), so the next unnamed call
// takes the one after; requests carry the engine's join mode.
TEST(EngineSingle, RefusalsUseUpTheNameAndRequestsCarryTheJoinMode) {
  auto engine = startRuntime(singleKnobs());
  engine->setJoinMode(HORA_JOIN_ALLREDUCE_ONLY);

  OpCall refused = makeCall(*engine, OpType::kAllreduce, nullptr, 0);
  EXPECT_EQ(refused.where(), "allreduce (unnamed)");
  try {
    tellingRefusals(*engine, refused, [] { HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "bad input"); });
    FAIL() << "the refusal was swallowed";
  } catch (const Error &e) {
    EXPECT_EQ(e.status(), HORA_ERR_INVALID_ARGUMENT);
  }
  EXPECT_TRUE(refused.nameTaken);
  EXPECT_EQ(refused.name, "allreduce.noname.0");

  std::vector<float> in(4, 1.0f), out(4);
  OpCall call = makeCall(*engine, OpType::kAllreduce, nullptr, 0);
  RequestMsg m;
  m.dtype = DType::kFloat32;
  m.shapes = {{4}};
  RequestPtr r = makeRequest(*engine, call, m, {{in.data(), out.data(), 4}});
  EXPECT_EQ(r->name(), "allreduce.noname.1");
  EXPECT_EQ(r->msg().joinMode, HORA_JOIN_ALLREDUCE_ONLY);
  submitCall(*engine, call, r);
  EXPECT_TRUE(r->wait().ok()) << r->wait().message;

  try {
    makeCall(*engine, OpType::kAllreduce, "", 0);
    FAIL() << "an empty name was taken";
  } catch (const Error &e) {
    EXPECT_EQ(e.message(), "allreduce: tensor name is empty (pass NULL to have hora name it)");
  }
  try {
    makeCall(*engine, OpType::kBroadcast, "x", 7);
    FAIL() << "an unknown set was taken";
  } catch (const Error &e) {
    EXPECT_EQ(e.message(), "broadcast 'x': unknown process set 7");
  }
  engine->shutdown();
}

TEST(EngineSingle, ShutdownCompletesEverythingQueued) {
  auto engine = startRuntime(singleKnobs());
  std::vector<float> in(1000, 2.0f);
  std::vector<std::vector<float>> outs(200, std::vector<float>(1000));
  std::vector<RequestPtr> reqs;
  for (int i = 0; i < 200; ++i) {
    reqs.push_back(allreduce("q" + std::to_string(i), in, outs[static_cast<size_t>(i)]));
    engine->submit(reqs.back());
  }
  engine->shutdown();
  for (auto &r : reqs) {
    ASSERT_TRUE(r->done());
    const Status s = r->status();
    EXPECT_TRUE(s.ok() || s.code == HORA_ERR_SHUT_DOWN) << s.message;
    if (s.code == HORA_ERR_SHUT_DOWN) {
      EXPECT_NE(s.message.find(r->name()), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace hora

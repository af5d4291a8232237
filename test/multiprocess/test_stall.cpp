// SPDX-License-Identifier: Apache-2.0
// Stalls: a name that rank 1 never submits, while every rank keeps working on others. The
// coordinator reports it (one log line and one JSON line naming who submitted it and who did
// not), again on SIGUSR1, and with HORA_STALL_SHUTDOWN_S fails it with HORA_ERR_TIMEOUT on the
// ranks that submitted it; the runtime stays usable. Both the uncached path and a name that was
// cached (a cache hit never reaches the coordinator on its own) are covered. Needs 2+ ranks.
#include <hora/hora.h>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "mp_harness.h"
#include "time_scale.h"

namespace {

using mp::makeTensor;
using mp::Request;

const mp::DType &f32() { return mp::dtypeNamed("float32"); }

// hora logs to stderr: this rank's stderr goes to a file while `fn` runs, and comes back.
template <typename Fn>
std::string captureStderr(Fn &&fn) {
  char path[] = "/tmp/hora-stall-XXXXXX";
  const int fd = mkstemp(path);
  fflush(stderr);
  const int saved = dup(2);
  dup2(fd, 2);
  fn();
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(fd);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  unlink(path);
  return text.str();
}

void allreduceEverywhere(const std::string &name) {
  auto t = makeTensor(f32(), {4});
  t->fill([](int64_t) { return 1.0; });
  hora_request_t req = nullptr;
  MP_ASSERT_OK(hora_allreduce_async(name.c_str(), t->dl(), t->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &req));
  Request guard(req);
  MP_ASSERT_OK(hora_wait(req)) << name;
  EXPECT_EQ(t->get(0), static_cast<double>(mp::size())) << name;
}

// Restarts the runtime with these stall settings.
void restartWith(const char *warningS, const char *shutdownS) {
  if (hora_is_initialized()) {
    MP_ASSERT_OK(hora_shutdown());
  }
  setenv("HORA_STALL_WARNING_S", warningS, 1);
  setenv("HORA_STALL_SHUTDOWN_S", shutdownS, 1);
  MP_ASSERT_OK(hora_init());
}

// Every rank but 1 submits `name`; all keep doing other allreduces until it has failed on
// them (a flag allreduced each round says so), so every engine keeps negotiating. Returns
// rank 0's stderr.
std::string stallOn(const std::string &name, hora_status_t expected, double atMostS) {
  const int r = mp::rank();
  auto stuck = makeTensor(f32(), {16, 3});
  hora_request_t req = nullptr;
  if (r != 1) {
    MP_EXPECT_OK(hora_allreduce_async(name.c_str(), stuck->dl(), stuck->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &req));
  }
  Request guard(req);
  const auto start = std::chrono::steady_clock::now();
  auto body = [&] {
    for (int round = 0;; ++round) {
      int done = 1;
      if (req != nullptr) {
        MP_EXPECT_OK(hora_poll(req, &done));
      }
      auto flag = makeTensor(f32(), {1});
      flag->fill([&](int64_t) { return done ? 0.0 : 1.0; });
      hora_request_t f = nullptr;
      const std::string fname = name + ".round" + std::to_string(round);
      MP_ASSERT_OK(hora_allreduce_async(fname.c_str(), flag->dl(), flag->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &f));
      Request fguard(f);
      MP_ASSERT_OK(hora_wait(f));
      if (flag->get(0) == 0.0) break;  // every rank's request of `name` has failed (or none had one)
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      ASSERT_LT(waited, atMostS * hora_test::timeScale()) << name << " never failed";
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  };
  std::string log = r == 0 ? captureStderr(body) : (body(), std::string());
  if (req != nullptr) {
    MP_EXPECT_STATUS(expected, hora_wait(req)) << name;
    const std::string why = mp::lastError();
    EXPECT_NE(why.find("'" + name + "'"), std::string::npos) << why;
    EXPECT_NE(why.find("never by rank 1"), std::string::npos) << why;
    EXPECT_NE(why.find("HORA_STALL_SHUTDOWN_S"), std::string::npos) << why;
  }
  return log;
}

void expectReport(const std::string &log, const std::string &name) {
  const int n = mp::size();
  const std::string submitted = n == 2 ? "submitted by rank 0," : n == 3 ? "submitted by ranks 0,2," : "";
  EXPECT_NE(log.find("stall: allreduce '" + name + "' (float32 [16,3], process set 0) has waited"),
            std::string::npos) << log;
  if (!submitted.empty()) {
    EXPECT_NE(log.find(submitted), std::string::npos) << log;
  }
  EXPECT_NE(log.find("not by rank 1"), std::string::npos) << log;
  EXPECT_NE(log.find(R"({"hora_stall":{"process_set":0,"name":")" + name + R"(","op":"allreduce")"),
            std::string::npos) << log;
  EXPECT_NE(log.find(R"("missing":[1])"), std::string::npos) << log;
}

TEST(Stall, ANameOneRankNeverSubmitsIsReportedThenFailed) {
  if (mp::size() < 2) GTEST_SKIP() << "a stall needs two ranks";
  restartWith("1", "3");
  const std::string log = stallOn("stall.never", HORA_ERR_TIMEOUT, 30);
  if (mp::rank() == 0) expectReport(log, "stall.never");
  allreduceEverywhere("stall.after");  // the runtime is still usable
}

TEST(Stall, ACachedNameIsSeenByTheCoordinatorToo) {
  if (mp::size() < 2) GTEST_SKIP() << "a stall needs two ranks";
  restartWith("1", "3");
  // Twice everywhere: the name's response is cached, so its third submission is a cache hit.
  auto t = makeTensor(f32(), {16, 3});
  for (int i = 0; i < 2; ++i) {
    hora_request_t req = nullptr;
    MP_ASSERT_OK(hora_allreduce_async("stall.cached", t->dl(), t->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &req));
    Request guard(req);
    MP_ASSERT_OK(hora_wait(req));
  }
  const std::string log = stallOn("stall.cached", HORA_ERR_TIMEOUT, 30);
  if (mp::rank() == 0) expectReport(log, "stall.cached");
  allreduceEverywhere("stall.cached.after");
}

TEST(Stall, SigusrOneReportsAtOnce) {
  if (mp::size() < 2) GTEST_SKIP() << "a stall needs two ranks";
  restartWith("1000", "4");  // no timed report before the shutdown fails it
  const int r = mp::rank();
  auto stuck = makeTensor(f32(), {16, 3});
  hora_request_t req = nullptr;
  if (r != 1) {
    MP_ASSERT_OK(hora_allreduce_async("stall.signal", stuck->dl(), stuck->dl(), HORA_OP_SUM, 1.0, 1.0, 0, &req));
  }
  Request guard(req);
  std::string log;
  auto body = [&] {
    for (int round = 0; round < 20; ++round) {
      if (round == 5 && r == 0) raise(SIGUSR1);
      allreduceEverywhere("stall.signal.tick" + std::to_string(round));
    }
  };
  log = r == 0 ? captureStderr(body) : (body(), std::string());
  if (r == 0) expectReport(log, "stall.signal");
  // Then HORA_STALL_SHUTDOWN_S ends it; keep every engine negotiating until it has.
  stallOn("stall.signal.end", HORA_ERR_TIMEOUT, 30);
  if (req != nullptr) {
    MP_EXPECT_STATUS(HORA_ERR_TIMEOUT, hora_wait(req));
  }
  MP_ASSERT_OK(hora_shutdown());
  unsetenv("HORA_STALL_WARNING_S");
  unsetenv("HORA_STALL_SHUTDOWN_S");
}

}  // namespace

// SPDX-License-Identifier: Apache-2.0
// main() of every multi-process test binary: hora init/shutdown, rank-aware output, watchdog.
#include <hora/hora.h>

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "mp_harness.h"
#include "time_scale.h"

namespace {

// Before hora_init (and after hora_shutdown) the runtime cannot tell us who we are, but output
// must still be gated: read the launcher's own variables for that one purpose.
int launcherRank() {
  for (const char *var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "RANK", "SLURM_PROCID"}) {
    const char *s = std::getenv(var);
    if (s && *s) return std::atoi(s);
  }
  return 0;
}

int launcherSize() {
  for (const char *var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "WORLD_SIZE", "SLURM_NTASKS"}) {
    const char *s = std::getenv(var);
    if (s && *s) return std::atoi(s);
  }
  return 1;
}

// Rank as last refreshed from the main thread between tests. Listeners that run inside a test
// (part results) read only this cache: a hora call there could replace the thread-local
// hora_last_error() the test is about to read.
std::atomic<int> gRank{-1};
std::atomic<int> gSize{1};

void refreshRank() {
  if (hora_is_initialized()) {
    gRank = hora_rank();
    gSize = hora_size();
  } else {
    gRank = launcherRank();
    gSize = launcherSize();
  }
}

int currentRank() { return gRank.load(); }

// A hung collective never returns, so a test would otherwise only end at meson's timeout with no
// hint of where it stopped. The watchdog names the test and exits with 124 (timeout's code);
// the clock restarts at every test so one slow binary does not need a larger limit.
class Watchdog {
 public:
  explicit Watchdog(double limitSeconds) : limit_(limitSeconds) {
    if (limit_ > 0) thread_ = std::thread([this] { run(); });
  }
  ~Watchdog() { stop(); }

  // Called from the main thread (gtest events); rank is passed in so the watchdog thread never
  // calls into a runtime that may be the very thing that hangs.
  void enter(const std::string &where, int rank) {
    std::lock_guard<std::mutex> lock(mutex_);
    where_ = where;
    rank_ = rank;
    since_ = std::chrono::steady_clock::now();
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
      wake_.wait_for(lock, std::chrono::milliseconds(200));
      if (stopping_) break;
      const double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - since_).count();
      if (elapsed > limit_) {
        std::fprintf(stderr, "watchdog: rank %d still inside test %s after %.0f s\n", rank_,
                     where_.c_str(), elapsed);
        std::fflush(stderr);
        std::_Exit(124);  // no destructors: other threads may be stuck holding locks
      }
    }
  }

  // This mutex protects: where_, rank_, since_, stopping_.
  std::mutex mutex_;
  std::condition_variable wake_;
  std::string where_ = "startup";
  int rank_ = launcherRank();
  std::chrono::steady_clock::time_point since_ = std::chrono::steady_clock::now();
  bool stopping_ = false;
  const double limit_;
  std::thread thread_;
};

class WatchdogTracker : public ::testing::EmptyTestEventListener {
 public:
  explicit WatchdogTracker(Watchdog &dog) : dog_(dog) {}
  void OnTestProgramStart(const ::testing::UnitTest &) override { refreshRank(); }
  void OnEnvironmentsSetUpStart(const ::testing::UnitTest &) override {
    dog_.enter("<environment set-up: hora_init>", currentRank());
  }
  void OnEnvironmentsSetUpEnd(const ::testing::UnitTest &) override { refreshRank(); }
  void OnTestStart(const ::testing::TestInfo &info) override {
    refreshRank();
    dog_.enter(std::string(info.test_suite_name()) + "." + info.name(), currentRank());
  }
  void OnTestEnd(const ::testing::TestInfo &info) override {
    dog_.enter(std::string("<after ") + info.test_suite_name() + "." + info.name() + ">",
               currentRank());
  }
  void OnEnvironmentsTearDownStart(const ::testing::UnitTest &) override {
    refreshRank();
    dog_.enter("<environment tear-down: hora_shutdown>", currentRank());
  }

 private:
  Watchdog &dog_;
};

// gtest's printer on rank 0 only: N ranks printing the same progress would bury the one line
// that matters.
class RankZeroPrinter : public ::testing::TestEventListener {
 public:
  explicit RankZeroPrinter(::testing::TestEventListener *inner) : inner_(inner) {}
  void OnTestProgramStart(const ::testing::UnitTest &u) override {
    if (on()) inner_->OnTestProgramStart(u);
  }
  void OnTestIterationStart(const ::testing::UnitTest &u, int i) override {
    if (on()) inner_->OnTestIterationStart(u, i);
  }
  void OnEnvironmentsSetUpStart(const ::testing::UnitTest &u) override {
    if (on()) inner_->OnEnvironmentsSetUpStart(u);
  }
  void OnEnvironmentsSetUpEnd(const ::testing::UnitTest &u) override {
    if (on()) inner_->OnEnvironmentsSetUpEnd(u);
  }
  void OnTestSuiteStart(const ::testing::TestSuite &s) override {
    if (on()) inner_->OnTestSuiteStart(s);
  }
#ifndef GTEST_REMOVE_LEGACY_TEST_CASEAPI_
  void OnTestCaseStart(const ::testing::TestCase &s) override {
    if (on()) inner_->OnTestCaseStart(s);
  }
  void OnTestCaseEnd(const ::testing::TestCase &s) override {
    if (on()) inner_->OnTestCaseEnd(s);
  }
#endif
  void OnTestStart(const ::testing::TestInfo &t) override {
    if (on()) inner_->OnTestStart(t);
  }
  void OnTestDisabled(const ::testing::TestInfo &t) override {
    if (on()) inner_->OnTestDisabled(t);
  }
  void OnTestPartResult(const ::testing::TestPartResult &r) override {
    if (on()) inner_->OnTestPartResult(r);
  }
  void OnTestEnd(const ::testing::TestInfo &t) override {
    if (on()) inner_->OnTestEnd(t);
  }
  void OnTestSuiteEnd(const ::testing::TestSuite &s) override {
    if (on()) inner_->OnTestSuiteEnd(s);
  }
  void OnEnvironmentsTearDownStart(const ::testing::UnitTest &u) override {
    if (on()) inner_->OnEnvironmentsTearDownStart(u);
  }
  void OnEnvironmentsTearDownEnd(const ::testing::UnitTest &u) override {
    if (on()) inner_->OnEnvironmentsTearDownEnd(u);
  }
  void OnTestIterationEnd(const ::testing::UnitTest &u, int i) override {
    if (on()) inner_->OnTestIterationEnd(u, i);
  }
  void OnTestProgramEnd(const ::testing::UnitTest &u) override {
    if (on()) inner_->OnTestProgramEnd(u);
  }

 private:
  static bool on() { return currentRank() == 0; }
  std::unique_ptr<::testing::TestEventListener> inner_;
};

// Failures of every rank, prefixed by the rank, on stderr: a failure seen only on rank 2 must
// not be lost because only rank 0 prints progress.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  void OnTestPartResult(const ::testing::TestPartResult &r) override {
    if (!r.failed() || quiet()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", currentRank(),
                 r.file_name() ? r.file_name() : "unknown", r.line_number(), r.message());
    std::fflush(stderr);
  }
  void OnTestEnd(const ::testing::TestInfo &info) override {
    if (!info.result()->Failed() || quiet()) return;
    std::fprintf(stderr, "[rank %d] [  FAILED  ] %s.%s\n", currentRank(), info.test_suite_name(),
                 info.name());
  }
  void OnTestProgramEnd(const ::testing::UnitTest &u) override {
    if (u.Passed() || quiet()) return;
    std::fprintf(stderr, "[rank %d] %d of %d tests failed\n", currentRank(),
                 u.failed_test_count(), u.test_to_run_count());
    std::fflush(stderr);
  }

 private:
  // Rank 0 of a world of one: gtest's own printer already said it all.
  static bool quiet() { return currentRank() == 0 && gSize.load() <= 1 && launcherSize() <= 1; }
};

class HoraEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { MP_ASSERT_OK(hora_init()); }
  // A test (the shutdown one) may have left the runtime down on purpose.
  void TearDown() override {
    if (hora_is_initialized()) {
      MP_EXPECT_OK(hora_shutdown());
    }
  }
};

// HORA_TEST_WATCHDOG_S (a quiet machine's limit) stretched by HORA_TEST_TIME_SCALE.
double watchdogSeconds() {
  const char *s = std::getenv("HORA_TEST_WATCHDOG_S");
  double v = 120.0;
  if (s && *s) {
    char *end = nullptr;
    const double parsed = std::strtod(s, &end);
    if (end && *end == '\0') v = parsed;  // <= 0 disables the watchdog
  }
  return v * hora_test::timeScale();
}

}  // namespace

int main(int argc, char **argv) {
  ::testing::InitGoogleTest(&argc, argv);
  Watchdog dog(watchdogSeconds());

  ::testing::TestEventListeners &listeners = ::testing::UnitTest::GetInstance()->listeners();
  ::testing::TestEventListener *printer = listeners.Release(listeners.default_result_printer());
  listeners.Append(new WatchdogTracker(dog));
  listeners.Append(new RankZeroPrinter(printer));
  listeners.Append(new RankFailurePrinter);
  ::testing::AddGlobalTestEnvironment(new HoraEnvironment);

  // Each rank exits with its own result; mpiexec then fails if any rank failed.
  const int rc = RUN_ALL_TESTS();
  dog.stop();
  return rc;
}

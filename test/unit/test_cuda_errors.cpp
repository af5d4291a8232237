// SPDX-License-Identifier: Apache-2.0
// cuda_errors.h's rules for CUDA's per-thread error slot, against a fake that behaves like it.
#include "backends/nccl/cuda_errors.h"

#include <gtest/gtest.h>

namespace hora {
namespace {

using cuda_errors::checkedLaunch;
using cuda_errors::queryDone;

// cudaError_t values the fake uses (driver_types.h).
constexpr int kInvalidValue = 1;          // non-sticky
constexpr int kNotReady = 600;            // what cudaEventQuery says of unfinished work
constexpr int kIllegalAddress = 700;      // sticky: the context is lost
constexpr int kNoKernelImage = 209;       // a launch's own failure

// CUDA's error slot: a failing call writes it, a successful one leaves it, lastError() returns
// it and resets it unless the error is sticky; once sticky, every call fails with it.
struct FakeCuda {
  int slot = 0;
  int sticky = 0;

  int call(int err) {
    if (sticky != 0) err = sticky;
    if (err != 0) slot = err;
    return err;
  }
  int lastError() {
    const int err = slot;
    slot = sticky;
    return err;
  }
  // Kernel launches return nothing: their failure is only in the slot.
  int kernel(int err) {
    call(err);
    return 0;
  }

  auto query(int answer) {
    return [this, answer] { return call(answer); };
  }
  auto clear() {
    return [this] { return lastError(); };
  }
  auto kernelLaunch(int err) {
    return [this, err] { return kernel(err); };
  }
  auto apiLaunch(int err) {
    return [this, err] { return call(err); };
  }
};

TEST(CudaErrors, FakeShowsTheBugThatQueryDoneFixes) {
  FakeCuda cuda;
  // The old way: NotReady taken as "not yet", left in the slot; the next launch is checked with
  // cudaGetLastError and fails for it.
  EXPECT_EQ(cuda.call(kNotReady), kNotReady);
  cuda.kernel(0);
  EXPECT_EQ(cuda.lastError(), kNotReady);
}

TEST(CudaErrors, NotReadyFromAQueryDoesNotFailTheNextLaunch) {
  FakeCuda cuda;
  int error = -1;
  EXPECT_FALSE(queryDone(cuda.query(kNotReady), cuda.clear(), kNotReady, &error));
  EXPECT_EQ(error, 0);
  EXPECT_EQ(cuda.slot, 0);
  // Even a launch that checks only the slot afterwards (no discard first) succeeds.
  cuda.kernel(0);
  EXPECT_EQ(cuda.lastError(), 0);
  EXPECT_FALSE(queryDone(cuda.query(kNotReady), cuda.clear(), kNotReady, &error));
  EXPECT_EQ(checkedLaunch(cuda.kernelLaunch(0), cuda.clear()), 0);
  EXPECT_EQ(checkedLaunch(cuda.apiLaunch(0), cuda.clear()), 0);
}

TEST(CudaErrors, QueryDoneWhenDone) {
  FakeCuda cuda;
  int error = -1;
  EXPECT_TRUE(queryDone(cuda.query(0), cuda.clear(), kNotReady, &error));
  EXPECT_EQ(error, 0);
}

TEST(CudaErrors, QueryReportsAnErrorOnceAndLeavesNoneBehind) {
  FakeCuda cuda;
  int error = 0;
  EXPECT_FALSE(queryDone(cuda.query(kInvalidValue), cuda.clear(), kNotReady, &error));
  EXPECT_EQ(error, kInvalidValue);
  EXPECT_EQ(cuda.slot, 0);
  EXPECT_EQ(checkedLaunch(cuda.kernelLaunch(0), cuda.clear()), 0);
}

TEST(CudaErrors, LaunchReportsItsOwnError) {
  FakeCuda cuda;
  EXPECT_EQ(checkedLaunch(cuda.kernelLaunch(kNoKernelImage), cuda.clear()), kNoKernelImage);
  // Reported once: the launch after it is not blamed.
  EXPECT_EQ(cuda.slot, 0);
  EXPECT_EQ(checkedLaunch(cuda.kernelLaunch(0), cuda.clear()), 0);
  // An asynchronous call that returns its error.
  EXPECT_EQ(checkedLaunch(cuda.apiLaunch(kInvalidValue), cuda.clear()), kInvalidValue);
  EXPECT_EQ(cuda.slot, 0);
}

TEST(CudaErrors, AStaleErrorIsNotBlamedOnTheLaunch) {
  FakeCuda cuda;
  cuda.call(kInvalidValue);  // some earlier call failed and nobody took it out of the slot
  EXPECT_EQ(checkedLaunch(cuda.kernelLaunch(0), cuda.clear()), 0);
  cuda.call(kNotReady);
  EXPECT_EQ(checkedLaunch(cuda.apiLaunch(0), cuda.clear()), 0);
  // A stale error followed by the launch's own: the launch's is the one reported.
  cuda.call(kInvalidValue);
  EXPECT_EQ(checkedLaunch(cuda.kernelLaunch(kNoKernelImage), cuda.clear()), kNoKernelImage);
}

TEST(CudaErrors, AStickyErrorFailsEveryLaunch) {
  FakeCuda cuda;
  cuda.sticky = kIllegalAddress;
  EXPECT_EQ(checkedLaunch(cuda.kernelLaunch(0), cuda.clear()), kIllegalAddress);
  EXPECT_EQ(checkedLaunch(cuda.apiLaunch(0), cuda.clear()), kIllegalAddress);
  int error = 0;
  EXPECT_FALSE(queryDone(cuda.query(0), cuda.clear(), kNotReady, &error));
  EXPECT_EQ(error, kIllegalAddress);
}

}  // namespace
}  // namespace hora

// SPDX-License-Identifier: Apache-2.0
// How hora keeps CUDA's per-thread error slot honest, over integer error codes and callables (no
// CUDA headers), so that the rules are unit-tested on machines without a GPU.
#pragma once

namespace hora::cuda_errors {

// CUDA's runtime keeps one "last error" per thread: every call that fails writes its error there,
// successful calls leave it alone, and cudaGetLastError() returns it and resets it to success
// (except a sticky error, which stays: the context is lost). A kernel launch reports its own
// failure only through that slot. So an error hora has already seen, and dealt with, must not be
// left in the slot, or the next launch's check reports it as the launch's own failure.
//
// `lastError()` is cudaGetLastError: it returns the slot and clears it (as far as CUDA can).

// A non-blocking query (cudaEventQuery, cudaStreamQuery): true when the work is done. `notReady`
// (cudaErrorNotReady) is not an error: false with *error = 0. Any other failure: false with
// *error set, for the caller to report. Either way the query's own answer is taken out of the
// slot: "not ready yet" is no launch's failure, and a reported error is reported once.
template <class Query, class LastError>
bool queryDone(Query query, LastError lastError, int notReady, int *error) {
  const int err = query();
  *error = 0;
  if (err == 0) return true;
  lastError();
  if (err != notReady) *error = err;
  return false;
}

// A launch (a kernel, or an asynchronous call such as cudaMemcpyAsync), returning its own error
// only: whatever an earlier call left in the slot is discarded first, and the launch's error is
// taken out of the slot as it is returned. `launch()` returns the call's cudaError_t (0 for a
// kernel launch, which says nothing itself); a sticky error is still reported, since CUDA keeps
// returning it and the stream cannot run anything any more.
template <class Launch, class LastError>
int checkedLaunch(Launch launch, LastError lastError) {
  lastError();
  const int err = launch();
  const int slot = lastError();
  return err != 0 ? err : slot;
}

}  // namespace hora::cuda_errors

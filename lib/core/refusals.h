// SPDX-License-Identifier: Apache-2.0
// Refusals the other ranks are told of: a call refused on this rank before it was submitted
// still reaches the set's other ranks under the call's name, as a tombstone. For every front-end.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "base/error.h"
#include "core/engine.h"
#include "core/request.h"

namespace hora {

constexpr size_t kMaxNameBytes = 4096;     // a tensor name, in bytes
constexpr size_t kMaxReasonBytes = 8192;   // a refusal's reason, as the other ranks read it

// What every op needs to know about the call for its messages, and its name for the other ranks.
struct OpCall {
  OpType op;
  std::string name;
  int32_t processSet;
  bool autoNamed = false;  // NULL name: named at enqueue time
  bool nameTaken = false;  // autoNamed, and `name` holds the automatic name it took
  std::string where() const;
};

// A collective call of `op` named `name` (NULL: named by call order) in `processSet`: checks the
// name's length and that this rank is a member of the set (Error(HORA_ERR_INVALID_ARGUMENT)).
// An empty name is refused as such, and told to the other ranks as an unnamed call (what the
// caller most likely meant, and what hora_reject takes "" for).
OpCall makeCall(Engine &engine, OpType op, const char *name, int32_t processSet);

// Tells the other ranks of the call's set that this rank refused the call before submitting it:
// a tombstone (RequestMsg::rejected) under the call's name, or for an unnamed call the automatic
// name it would have taken (taken now, so that this rank's later unnamed calls keep pairing with
// the other ranks'). It negotiates like a request, and the coordinator fails the other ranks'
// requests of the name with HORA_ERR_MISMATCH quoting `reason` (docs/faults-misuse.md). Throws
// what the set's queue throws: DUPLICATE_NAME (a real request of the name is in flight here),
// or the status the set stopped with.
void enqueueTombstone(Engine &engine, OpCall &call, std::string reason);

// The same for an op call's own error, which reaches its caller whatever happens here: a
// tombstone that cannot be enqueued (the set stopped, or this rank's request of the name is in
// flight, which is what the other ranks pair with) is dropped.
void tellRefusal(Engine &engine, OpCall &call, std::string reason) noexcept;

// Runs `body`, the part of an op call after its set and name are known (makeCall). An error it
// throws goes to the caller as usual, and first to the set's other ranks (tellRefusal), whose
// requests of the name would otherwise wait for this rank forever. Not a duplicate name: this
// rank's request of that name, in flight, is the one the others pair with.
template <typename F>
void tellingRefusals(Engine &engine, OpCall &call, F &&body) {
  try {
    body();
  } catch (const Error &e) {
    if (e.status() != HORA_ERR_DUPLICATE_NAME) tellRefusal(engine, call, e.message());
    throw;
  } catch (const std::bad_alloc &) {
    tellRefusal(engine, call, "out of memory");
    throw;
  } catch (const std::exception &e) {
    tellRefusal(engine, call, std::string("internal error: ") + e.what());
    throw;
  }
}

// The request for the call, ready to submit: `msg` with the call's name (moved out of `call`;
// an unnamed call takes its set's next automatic name now), op and the engine's join mode.
RequestPtr makeRequest(Engine &engine, OpCall &call, RequestMsg msg,
                       std::vector<TensorArg> tensors);

// Engine::submit. A failure to enqueue leaves the name the request took in `call`, for the
// tombstone that tells the other ranks (tellingRefusals), and throws on.
void submitCall(Engine &engine, OpCall &call, const RequestPtr &request);

}  // namespace hora

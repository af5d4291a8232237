// SPDX-License-Identifier: Apache-2.0
// One in-flight collective as the engine sees it: parameters, tensors, owned outputs, completion.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include <dlpack/dlpack.h>

#include "base/error.h"
#include "core/message.h"

namespace hora {

class DeviceEnd;  // core/device_executor.h

// One tensor of a request: where its input is and where its result goes (in == out: in place).
struct TensorArg {
  const void *in = nullptr;
  void *out = nullptr;
  int64_t numel = 0;
};

class Request {
 public:
  Request(RequestMsg msg, int32_t processSet, std::vector<TensorArg> tensors);

  const RequestMsg &msg() const { return msg_; }
  const std::string &name() const { return msg_.name; }
  int32_t processSet() const { return processSet_; }
  const std::vector<TensorArg> &tensors() const { return tensors_; }
  int64_t bytes() const;  // all tensors, in the request's dtype
  std::chrono::steady_clock::time_point submitted() const { return submitted_; }

  // A request for a rank that has joined (hora_join) and so has no data of its own: it takes
  // part in `response` with zeros (allreduce, reducescatter), no rows (allgather, alltoall), or a
  // scratch buffer (broadcast). Owns its buffers.
  static std::shared_ptr<Request> standIn(const Response &response, int32_t processSet);

  // Output owned by the request (allgather, alltoall, reducescatter): storage sized for `shape`
  // and a DLTensor over it.
  void *allocateOutput(const Shape &shape);
  // The same for storage made elsewhere (device memory): the request keeps `storage` alive and
  // describes `data` as its output, on the request's device.
  void adoptOutput(std::shared_ptr<void> storage, void *data, const Shape &shape);
  bool isStandIn() const { return standIn_; }

  // CUDA tensors: an event recorded on the submitting thread's stream at submission, which the
  // device work waits for (owned; nullptr for CPU tensors).
  std::shared_ptr<void> readyEvent;
  const DLTensor *output() const { return hasOutput_ ? &output_ : nullptr; }

  // Set by the set's cycle before completion: alltoall's rows received from each rank; the
  // scalar result of join (last rank to join) and process set creation (the id).
  std::vector<int64_t> receivedSplits;
  int64_t result = -1;

  // Completion: first call wins; wakes every waiter.
  void complete(Status status);
  // complete() in two steps, for a batch: settle every request, then wake each. A waiter woken
  // by the first finds the rest settled and does not sleep again, instead of being woken once
  // per request while the engine is still completing them. settle() is false if already done.
  bool settle(Status status);
  void wake() const;
  bool done() const;
  Status wait() const;  // blocks until complete
  Status status() const;

  // CUDA requests, engine: the op's device work is queued and ends at `end` (held until the
  // request completes). Wakes the stream-ordered waiters.
  void launched(std::shared_ptr<DeviceEnd> end);
  // A stream-ordered wait: blocks until the request has completed or its device work is queued,
  // and in the second case makes `stream` wait for that work's end. The status of a completed
  // request; success for one launched. Throws what DeviceEnd::streamWait throws.
  Status waitOnStream(void *stream) const;
  bool isLaunched() const;  // its device work is queued (and it has not completed)

  // The set's cycles only: whether this rank's RequestMsg went to the coordinator already, and
  // (while a timeline records) when the engine took it from the queue.
  bool sentToCoordinator = false;
  std::chrono::steady_clock::time_point dequeued;
  uint64_t flightId = 0;  // its flight recorder record (0: none)

 private:
  void *describeOutput(void *data, const Shape &shape);  // output_ over `data`

  RequestMsg msg_;
  int32_t processSet_;
  std::vector<TensorArg> tensors_;
  std::chrono::steady_clock::time_point submitted_;

  std::vector<std::vector<uint8_t>> scratch_;  // stand-ins' own zeroed inputs
  bool standIn_ = false;
  std::unique_ptr<uint8_t[]> outputStorage_;
  std::shared_ptr<void> adoptedStorage_;
  Shape outputShape_;
  DLTensor output_{};
  bool hasOutput_ = false;

  // This mutex protects: done_, status_, end_.
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;  // with mutex_: waiters wait for done_ (or end_)
  bool done_ = false;
  Status status_;
  std::shared_ptr<DeviceEnd> end_;  // launched and not complete
};

using RequestPtr = std::shared_ptr<Request>;

// The C API's handles: a checkable token per live request, so that a freed, doubly freed or
// made-up hora_request_t is refused instead of dereferenced. A token is never a pointer: the top
// bit is set (no user-space address has it), then a generation, then 1 + a slot index. Freeing
// a request bumps its slot's generation, so a stale token stays refused after the slot is
// reused. Each call is one uncontended lock and a vector index: tens of ns beside a few-us op.
// Tokens stay live until removed, across hora_shutdown and a later hora_init (the design has
// pending requests complete with HORA_ERR_SHUT_DOWN, so they must stay waitable).
class RequestHandles {
 public:
  // Any thread. A token for `request` (never 0).
  uintptr_t add(RequestPtr request);
  // Any thread. The live request of `token`, or nullptr (0, freed, or never returned by add).
  RequestPtr find(uintptr_t token) const;
  // Any thread. Removes and returns the request (nullptr, and nothing changes, if not live).
  RequestPtr remove(uintptr_t token);
  size_t live() const;

 private:
  struct Slot {
    uintptr_t generation = 1;
    RequestPtr request;  // null: free
  };
  bool decode(uintptr_t token, size_t *index) const;  // mutex_ held

  // This mutex protects: slots_, free_, live_.
  mutable std::mutex mutex_;
  std::vector<Slot> slots_;
  std::vector<size_t> free_;  // indices of free slots, reused last-freed first
  size_t live_ = 0;
};

}  // namespace hora

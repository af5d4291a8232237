// SPDX-License-Identifier: Apache-2.0
// The executor for tensors on a GPU: what the engine asks of the NCCL backend. Created on a
// process set's first response on a device; like every response, that is collective over the set.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/request.h"

namespace hora {

// A communicator made ahead for a process set: split from the world's when the set was created
// (DeviceExecutor::split), sharing its resources. The set's executor takes it, where every member
// has one on the GPU it uses, instead of making one from scratch.
class DeviceSeed {
 public:
  virtual ~DeviceSeed() = default;
  virtual int device() const = 0;
};

// What the engine gives its device executor (made by the set's DeviceLane, core/device_lane.h):
// how to wake the engine when device work finishes, and how to learn that a peer is gone (so
// that a device op waiting for it fails at once rather than at HORA_TIMEOUT_S).
struct DeviceHooks {
  std::function<void()> wake;              // any thread (a CUDA driver thread included); cheap
  std::function<std::string()> lostPeer;   // engine thread: "" or which rank is gone and why
  std::function<void(uint64_t)> finished;  // any thread: the work of tickets up to this one is done
  std::shared_ptr<DeviceSeed> seed;        // the set's communicator made ahead, or null
};

// The end of one op's device work, as a stream-ordered wait sees it (an event of the
// executor's, held while this lives).
class DeviceEnd {
 public:
  virtual ~DeviceEnd() = default;
  // Work queued on `stream` (a cudaStream_t; nullptr: the legacy default stream) after this call
  // runs after the op. Throws Error(HORA_ERR_BACKEND) with CUDA's words.
  virtual void streamWait(void *stream) = 0;
};

// Engine thread only. Each op is queued on the device after every request's readiness event
// (the caller's stream at submission) and returns without waiting for the device: the engine
// negotiates the next ops while the GPU works, and completes a request once poll() says its
// ticket is done (the results are then in place, visible to any stream). Throws Error on failure:
// HORA_ERR_BACKEND with NCCL's or CUDA's words, HORA_ERR_TIMEOUT after HORA_TIMEOUT_S,
// HORA_ERR_PEER_LOST for a peer that is gone; the communicator is then aborted (nothing queued
// writes a caller's tensor after that), and every later call fails.
class DeviceExecutor {
 public:
  virtual ~DeviceExecutor() = default;
  virtual int device() const = 0;  // the CUDA ordinal this rank's communicator runs on
  // `contributors`: ranks with data (the set's size minus joined ranks), AVERAGE's divisor.
  virtual void allreduce(const std::vector<Request *> &requests, const Response &response,
                         int contributors) = 0;
  virtual void broadcast(Request &request, const Response &response) = 0;
  // A fused group: every request's collective in one NCCL group (one launch).
  virtual void allgather(const std::vector<Request *> &requests,
                         const std::vector<const Response *> &responses) = 0;
  virtual void alltoall(Request &request, const Response &response) = 0;
  virtual void reducescatter(const std::vector<Request *> &requests,
                             const std::vector<const Response *> &responses, int contributors) = 0;

  // The ops called between these two (one cycle's, agreed alike on every rank) go to NCCL as one
  // group, one launch: each op's copies in are queued as it is called, its NCCL calls and copies
  // out at endCycle(). An op called outside them is launched at once. Each op still has a ticket
  // and an end of its own, known once it is called; a stream-ordered wait on it may start only
  // after endCycle() (its event is recorded then).
  virtual void beginCycle() = 0;
  virtual void endCycle() = 0;

  // The ticket of the last op queued (1, 2, ...; 0 before the first), and its end.
  virtual uint64_t queued() const = 0;
  virtual std::shared_ptr<DeviceEnd> lastEnd() const = 0;
  // Every op with a ticket up to the returned one has finished. Never blocks; throws as above
  // (an NCCL error, the oldest unfinished op older than HORA_TIMEOUT_S, a lost peer).
  virtual uint64_t poll() = 0;
  // Waits (without spinning) until everything queued has finished or `seconds` pass, polling;
  // throws as poll() does, HORA_ERR_TIMEOUT at the end of the wait.
  virtual void drain(double seconds) = 0;
  // Aborts the communicator (nothing queued writes a caller's tensor afterwards); idempotent.
  virtual void abort(const std::string &why) = 0;

  // Collective over this executor's communicator (every rank of it calls it at the same response:
  // a process set's creation): a communicator for the ranks that pass `member`, ranked by `key`,
  // split from this one and sharing its resources (ncclCommSplit, splitShare = 1), for the set's
  // executor (DeviceHooks::seed). nullptr for a non-member, or where the split failed without
  // harming this communicator (the set then makes its own). Throws as poll() does where it did.
  virtual std::shared_ptr<DeviceSeed> split(bool member, int key) = 0;
};

}  // namespace hora

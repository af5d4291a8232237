// SPDX-License-Identifier: Apache-2.0
// ProcessGroupHora: torch.distributed's c10d::ProcessGroup (torch 1.13) over hora's C API.
#pragma once

#include <hora/hora.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

namespace hora {
namespace dist {

// A failure hora reported (or that this backend classes like one): the Python side turns it into
// hora's exception of that status (hora.MismatchError, ...), all of them RuntimeErrors.
class StatusError : public std::runtime_error {
 public:
  StatusError(hora_status_t status, const std::string &message)
      : std::runtime_error(message), status_(status) {}
  hora_status_t status() const { return status_; }

 private:
  hora_status_t status_;
};

// The Work of one collective: completed by its group's watcher thread, with the result tensors
// as its future's value (DDP's reducer reads them from there).
class WorkHora : public c10d::Work {
 public:
  // `what`: the torch op, a string literal (also the profiler's title).
  WorkHora(int rank, c10d::OpType type, const char *what, const std::vector<at::Tensor> &inputs);

  // As Work::wait, but a timeout raises hora's timeout error naming the op (which stays in
  // flight: wait again, or let hora's own timeout fail it).
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override;

  // Called once, by the watcher thread: wakes wait() first, then runs the future's callbacks.
  void complete(std::vector<at::Tensor> value, std::exception_ptr error);

 private:
  const char *what_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::vector<at::Tensor> result_;  // guarded by Work::mutex_
};

class ProcessGroupHora : public c10d::ProcessGroup {
 public:
  // hora must be running and `processSet` must be a set this rank belongs to, of rank `rank`
  // and size `size` (checked). `groupName` is torch's name of the group, the same on every
  // member: it prefixes the names of this group's ops so that hora matches them across ranks.
  ProcessGroupHora(int rank, int size, int32_t processSet, std::string groupName);
  // Waits for the ops still in flight (hora's own timeouts bound that), then stops the watcher.
  ~ProcessGroupHora() override;

  const std::string getBackendName() const override { return "hora"; }
  int32_t processSet() const { return processSet_; }
  const std::string &groupName() const { return groupName_; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor> &tensors,
                                           const c10d::BroadcastOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor> &tensors,
                                           const c10d::AllreduceOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor> &tensors, const c10d::AllreduceCoalescedOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor> &tensors,
                                        const c10d::ReduceOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>> &outputs,
                                           std::vector<at::Tensor> &inputs,
                                           const c10d::AllgatherOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor &output, at::Tensor &input,
                                                 const c10d::AllgatherOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>> &outputLists, std::vector<at::Tensor> &inputs,
      const c10d::AllgatherOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>> &outputs,
                                        std::vector<at::Tensor> &inputs,
                                        const c10d::GatherOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor> &outputs,
                                         std::vector<std::vector<at::Tensor>> &inputs,
                                         const c10d::ScatterOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor> &outputs,
                                                std::vector<std::vector<at::Tensor>> &inputs,
                                                const c10d::ReduceScatterOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor &output, at::Tensor &input, const c10d::ReduceScatterOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor &output, at::Tensor &input,
                                               std::vector<int64_t> &outputSplits,
                                               std::vector<int64_t> &inputSplits,
                                               const c10d::AllToAllOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor> &outputs,
                                          std::vector<at::Tensor> &inputs,
                                          const c10d::AllToAllOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions &opts) override;

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor> &tensors, int dstRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor> &tensors, int srcRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor> &tensors,
                                               int tag) override;

  // The number of ops this group has been given; the same on every member while they agree.
  uint64_t getSequenceNumberForGroup() override;

 private:
  // Hands the op to hora under `name`. The closure owns the tensors hora reads and writes, and
  // lives until the op has completed.
  using Submit = std::function<hora_status_t(const char *name, hora_request_t *request)>;
  // Runs on the watcher thread after a successful wait: copies hora's output where torch wants
  // it and returns the future's value.
  using Finish = std::function<std::vector<at::Tensor>(hora_request_t request)>;

  struct Op {
    std::string name;  // hora's name of the op
    const char *what = nullptr;  // the torch op, for messages
    c10::intrusive_ptr<WorkHora> work;
    Submit submit;
    Finish finish;
    hora_request_t request = nullptr;  // null until submitted
    std::exception_ptr error;          // its submission by the watcher failed
  };

  // Names the op, submits it (or leaves that to the watcher: see kSlots) and queues it for the
  // watcher. `signature`: what every member agrees on about the op's tensors (dtypes, shapes).
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, const char *what,
                                         const std::vector<at::Tensor> &inputs,
                                         const std::string &signature, Submit submit,
                                         Finish finish);
  // An allreduce of `tensors` (one dtype), its result written to them when `write`; BAND, BOR
  // and BXOR go through an allgather.
  c10::intrusive_ptr<c10d::Work> reduceTensors(c10d::OpType type, const char *what,
                                               std::vector<at::Tensor> tensors,
                                               const c10d::ReduceOp &op, bool write);
  // Reduce-scatter of `rows` [size, n] into `output` (n elements); `fresh`: rows is a copy that
  // may be scaled in place.
  c10::intrusive_ptr<c10d::Work> reduceScatterRows(c10d::OpType type, const char *what,
                                                   at::Tensor output, at::Tensor rows, bool fresh,
                                                   const std::vector<at::Tensor> &inputs,
                                                   const c10d::ReduceOp &op);
  void watch();

  // Op names repeat from step to step, so that hora's response cache answers them: the k-th op
  // of a signature (torch op, dtypes, shapes) is "c10d.<group>.<op>.<signature>.<k % kSlots>"
  // on every rank. Up to kSlots ops of a signature are in hora at once; a later one whose name
  // is still in flight on this rank waits in the queue, and the watcher submits it once that
  // name is free, so that no call ever blocks (a future's callback may submit ops on the watcher
  // thread itself). Ranks that disagree (another shape or op at the same point) submit
  // different names, which hora reports as a stall. With TORCH_DISTRIBUTED_DEBUG=INFO or
  // DETAIL the n-th op is "c10d.<group>.<n>" instead: a disagreement fails at once with hora's
  // MismatchError naming both sides, and every op takes hora's uncached path.
  static constexpr uint64_t kSlots = 8;

  const bool sequenceNames_;  // TORCH_DISTRIBUTED_DEBUG: see kSlots
  const int32_t processSet_;
  const std::string groupName_;

  // This mutex protects: seq_, uses_, ops_ and stop_. Held for submissions, never while waiting
  // for hora or running a future's callbacks.
  std::mutex mutex_;
  std::condition_variable queued_;
  uint64_t seq_ = 0;
  // Ops submitted by signature, k above. A counter serves every signature of its hash bucket:
  // the count stays a function of the sequence of ops, the same on every rank, and memory
  // stays bounded however many shapes a program uses.
  std::array<uint64_t, 1024> uses_{};
  // In submission order: the watcher completes them in that order, as torch expects of a group.
  // The front is the op it waits for; other threads only push to the back.
  std::deque<Op> ops_;
  bool stop_ = false;
  std::thread watcher_;
};

}  // namespace dist
}  // namespace hora

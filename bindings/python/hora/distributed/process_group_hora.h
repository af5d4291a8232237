// SPDX-License-Identifier: Apache-2.0
// ProcessGroupHora: torch.distributed's c10d::ProcessGroup (torch 1.13; c10d::Backend on torch 2)
// over hora's C API.
#pragma once

#include <hora/hora.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <torch/csrc/api/include/torch/version.h>
// torch 2 takes a backend plugin as a c10d::Backend, which a c10d::ProcessGroup of torch's own
// wraps for each device; torch 1.13 takes the ProcessGroup itself. The collectives' virtual
// signatures are the same in both. meson builds this for any torch >= 1.13; only 1.13 is
// installed here, so the torch 2 branch is type-checked only (TORCH_VERSION_MAJOR forced to 2
// over 1.13's headers, which have a Backend.hpp), never built against torch 2 or run.
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

namespace hora {
namespace dist {

#if TORCH_VERSION_MAJOR >= 2
using ProcessGroupBase = c10d::Backend;  // torch 2: type-checked only here (see above)
#else
using ProcessGroupBase = c10d::ProcessGroup;
#endif

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
// as its future's value (DDP's reducer reads them from there), or failed by the group's timer
// when the group's timeout runs out first.
class WorkHora : public c10d::Work {
 public:
  // `what`: the torch op, a string literal (also the profiler's title). `device`: its tensors'.
  // `streamOrdered`: a CUDA op whose results hora writes where torch wants them, with nothing
  // left for the watcher to copy, so that wait() may return before the device has them.
  WorkHora(int rank, c10d::OpType type, const char *what, const std::vector<at::Tensor> &inputs,
           c10::Device device, bool streamOrdered);

  // As Work::wait, but a timeout raises hora's timeout error naming the op (which stays in
  // flight: wait again, or let the group's timeout fail it). A stream-ordered CUDA op without a
  // timeout waits as torch's NCCL backend does: until hora has launched it, having made torch's
  // current stream of the device wait for its end (hora_cuda_wait). Every other op, and any
  // wait with a timeout, waits on the host until the op is complete.
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override;

  // Completes the work (wakes wait() first, then runs the future's callbacks) unless it was
  // completed already: the watcher and the timer may both try; the first one wins. Returns
  // whether this call completed it.
  bool complete(std::vector<at::Tensor> value, std::exception_ptr error);
  // Whether complete() has been called (the value may still be on its way).
  bool claimed() const { return claimed_.load(); }

  // The op's hora request once it is submitted, for a stream-ordered wait(); taken back
  // (waiting for a wait() that is using it) before the watcher frees it.
  void submitted(hora_request_t request);
  void releaseRequest();

 private:
  const char *what_;
  [[maybe_unused]] const c10::Device device_;  // read only with HORA_TORCH_CUDA
  const bool streamOrdered_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  // Work::mutex_ guards these; Work::cv_ is notified when they change.
  std::vector<at::Tensor> result_;
  hora_request_t request_ = nullptr;  // between submitted() and releaseRequest()
  int requestUsers_ = 0;              // wait() calls in hora_cuda_wait on request_
  std::atomic<bool> claimed_{false};
};

class ProcessGroupHora : public ProcessGroupBase {
 public:
  // hora must be running and `processSet` must be a set this rank belongs to, of rank `rank`
  // and size `size` (checked). `groupName` is torch's name of the group, the same on every
  // member: it prefixes the names of this group's ops so that hora matches them across ranks.
  // `timeout`: torch's timeout of the group (init_process_group/new_group timeout=); an op not
  // complete that long after it was called fails, and so does the group (see Shared). Zero: none.
  ProcessGroupHora(int rank, int size, int32_t processSet, std::string groupName,
                   std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
  // Waits for the ops still in flight, at most until the group's timeout fails them (which
  // aborts them in hora: see enforceTimeout), then joins the group's threads: none outlives it.
  ~ProcessGroupHora() override;

  // Every live group's threads are stopped and joined, after hora_shutdown (if hora runs) has
  // completed whatever they still wait for: hora.distributed calls it at interpreter exit, before
  // Python starts to finalize, so that no thread of a group left undestroyed runs a future's
  // callback or drops a tensor afterwards. Call without the GIL.
  static void stopAll();

  const std::string getBackendName() const override { return "hora"; }
  int32_t processSet() const { return processSet_; }
  const std::string &groupName() const { return groupName_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

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

  using Clock = std::chrono::steady_clock;

  // Op names must be the same on every member for the same call, whatever its tensors, so that
  // hora compares the tensors and fails a disagreement (shape, dtype) on every rank with its
  // MismatchError naming both sides; and they should repeat from step to step with the same
  // tensors, so that hora's response cache answers them. The k-th op of a kind (torch op) is
  // "c10d.<group>.<op>.<k mod m>": m is a multiple of the period (up to kMaxPeriod) of that
  // kind's ops seen so far, and at least kLag. Only what hora has checked every rank agrees on
  // counts: for each completed op, its tensors as hora got them (dtype, shape) and its reduce op
  // or root, or that it failed; and only ops at least kLag back, so that op k's name waits, at
  // most, for op k - kLag to complete: up to kLag ops of a kind are in hora at once, and a
  // later one waits in the queue until the watcher can name and submit it. A later op whose
  // name is still in flight on this rank waits the same way. No call ever blocks (a future's
  // callback may submit ops on the watcher thread itself). With TORCH_DISTRIBUTED_DEBUG=INFO or
  // DETAIL the n-th op is "c10d.<group>.<n>" instead: members that call different ops at one
  // point then fail at once with MismatchError too (otherwise they submit different names,
  // which the group's timeout fails), and every op takes hora's uncached path.
  static constexpr uint64_t kLag = 32;
  static constexpr uint64_t kMaxPeriod = 64;
  static constexpr uint64_t kWindow = 256;  // > kLag + 2 * kMaxPeriod: the keys a period needs

  // The naming state of one kind of op: see kLag. Every member computes the same from the
  // same agreed keys.
  struct Kind {
    uint64_t count = 0;    // ops of this kind called so far: k of the next one
    uint64_t known = 0;    // ops of this kind completed so far; their keys are in `keys`
    uint64_t tracked = 0;  // how many keys `period` has looked at
    uint64_t period = 0;   // of keys [0, tracked); 0 while none is found
    std::array<uint64_t, kWindow> keys{};  // op i's key at i % kWindow

    // Whether op k can be named: the keys its name depends on are known.
    bool nameable(uint64_t k) const { return known >= needed(k); }
    // The m of op k's name (nameable(k) holds); ops are named in order of k.
    uint64_t modulus(uint64_t k);
    void record(uint64_t k, uint64_t key);

   private:
    static uint64_t needed(uint64_t k) { return k >= kLag ? k - kLag + 1 : 0; }
    void track(uint64_t i);
  };

  struct Op {
    std::string name;           // hora's name of the op; empty until named (see kLag)
    const char *what = nullptr;  // the torch op (its kind), for names and messages
    uint64_t k = 0;             // its number among the group's ops of its kind
    uint64_t key = 0;           // what every member agrees on about it, for names (see kLag)
    std::string signature;      // its tensors ("Float[2,3]"), for messages
    Clock::time_point deadline;  // when the group's timeout fails it
    c10::intrusive_ptr<WorkHora> work;
    Submit submit;
    Finish finish;
    c10::Device device{c10::kCPU};     // of its tensors (all on one device)
    void *stream = nullptr;            // a CUDA op's: torch's current stream at the call
    hora_request_t request = nullptr;  // null until submitted
    std::exception_ptr error;          // its submission failed, or the group failed first
    bool failedByTimer = false;        // the timer completes its work (with the timeout's words)
  };

  // What the group's threads share with it (they hold it too), and the threads themselves,
  // which the group's destructor or stopAll() joins, whichever comes first.
  struct Shared {
    Shared(std::string group, int32_t set, bool sequence)
        : groupName(std::move(group)), processSet(set), sequenceNames(sequence) {}
    const std::string groupName;
    const int32_t processSet;
    const bool sequenceNames;  // TORCH_DISTRIBUTED_DEBUG: see kLag

    // Asks both threads to stop once every queued op has completed, waits for that, and joins
    // them. Idempotent; call without the GIL (the watcher may need it for a callback).
    void stopAndJoin();
    std::mutex threadsMutex;  // guards watcher and timer (joined once)
    std::thread watcher;
    std::thread timer;  // only with a timeout

    // This mutex protects everything below. Held for submissions and hora_poll, never while
    // waiting for hora or running a future's callbacks.
    std::mutex mutex;
    std::condition_variable queued;   // the watcher's: an op was queued, or stop
    std::condition_variable changed;  // the timer's and the destructor's: see each flag
    uint64_t seq = 0;
    std::unordered_map<std::string, Kind> kinds;  // by the torch op (`what`)
    // In submission order: the watcher completes them in that order, as torch expects of a
    // group. The front is the op it waits for (always submitted, or failed); other threads only
    // push to the back, and the timer reads the front.
    std::deque<Op> ops;
    bool stop = false;         // the group is going
    bool watcherDone = false;  // the watcher has returned (notifies changed)
    bool timerIdle = false;    // the timer waits for an op to be queued (notify changed then)
    bool stuck = false;        // the timer failed the group: an op outlived the timeout
    // Not OK once the group has failed (an op outlived the group's timeout, or hora timed it
    // out): every later op fails at once with this, since the members' sequences of ops no
    // longer line up and hora may still hold the late op. Destroy the group, or restart.
    hora_status_t brokenStatus = HORA_SUCCESS;
    std::string broken;

    // Names `op` if it can be (see kLag) and submits it if its name is free: whether it was
    // submitted. Throws what hora's submission raised, with the op left unnamed.
    bool trySubmit(Op &op, bool nameInFlight);
    // After the front op went: names and submits the queued ops that can go now, or fails
    // them when the group has failed.
    void submitReady();
  };

  // Names the op, submits it (or leaves that to the watcher: see kLag) and queues it for the
  // watcher. `device`: where its tensors are; `signature`: the op's tensors, for messages;
  // `key`: what every member agrees on about it once hora has checked it (see kLag);
  // `copies`: `finish` moves data on the device (see WorkHora's streamOrdered).
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, const char *what, c10::Device device,
                                         const std::vector<at::Tensor> &inputs,
                                         const std::string &signature, uint64_t key,
                                         Submit submit, Finish finish, bool copies = true);
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
  // The op's finish; for a CUDA op, on a side stream, synchronized.
  static std::vector<at::Tensor> finishOp(const Op &op);
  // The watcher: waits for each op in turn and completes its work.
  static void watch(const std::shared_ptr<Shared> &shared);
  // The timer: fails the group when its oldest op outlives the timeout.
  static void enforceTimeout(const std::shared_ptr<Shared> &shared,
                             std::chrono::milliseconds timeout);

  // Every group's Shared, for stopAll(); guarded by liveGroupsMutex(). Never destroyed.
  static std::mutex &liveGroupsMutex();
  static std::vector<std::weak_ptr<Shared>> &liveGroups();

  const int32_t processSet_;
  const std::string groupName_;
  const std::chrono::milliseconds timeout_;
  const std::shared_ptr<Shared> shared_;
};

}  // namespace dist
}  // namespace hora

// SPDX-License-Identifier: Apache-2.0
// A fake gpu::DeviceApi for CPU unit tests: ranks are threads of one process, "device memory" is
// host memory (so data really moves), streams are worker threads; every call is logged and
// errors can be injected. Semantics and call-log formats are documented in fake_device.cpp.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "backends/nccl/device_api.h"

namespace hora::test {

namespace fake_detail {
struct CommGroup;
struct Stream;
struct Event;
struct Comm;
struct Op;
struct Call;
struct NcclItem;
struct PendingCall;
}  // namespace fake_detail

// Misuse of the fake that is a bug in the code under test (an unknown or destroyed handle, a
// double release): thrown by calls that may throw; noexcept calls print it and abort instead.
class FakeMisuse : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// What the ranks of one test share: unique ids and the communicators made from them. Outlives
// its FakeDevices.
class FakeCluster {
 public:
  FakeCluster() = default;
  FakeCluster(const FakeCluster &) = delete;
  FakeCluster &operator=(const FakeCluster &) = delete;

  // A fresh id, 128 bytes like NCCL's ("fake-nccl-id-<n>" padded with NULs).
  std::string newUniqueId();
  // Communicators any rank joined so far (one per unique id).
  int communicators() const;

 private:
  friend class FakeDevice;
  // The communicator of `id`, made by its first rank; nullptr (and *result) when `size`
  // disagrees with the first rank's or `rank` already joined.
  std::shared_ptr<fake_detail::CommGroup> join(const std::string &id, int size, int rank, int *result);

  mutable std::mutex mutex_;  // guards nextId_, groups_
  uint64_t nextId_ = 0;
  std::map<std::string, std::shared_ptr<fake_detail::CommGroup>> groups_;
};

// One rank's GPU(s). Every DeviceApi call appends an entry to the call log; work queued on a
// stream runs, in order, on that stream's worker thread.
class FakeDevice final : public gpu::DeviceApi {
 public:
  explicit FakeDevice(FakeCluster &cluster, int rank = 0, int deviceCount = 1,
                      int multiprocessors = 108);
  // Releases hold(), aborts the communicators not destroyed, joins the stream workers (after
  // their queued work) and frees what is still allocated.
  ~FakeDevice() override;
  FakeDevice(const FakeDevice &) = delete;
  FakeDevice &operator=(const FakeDevice &) = delete;

  int rank() const { return rank_; }

  // ---- Test controls.
  // Streams' workers pause before their next op while held (slow GPU work); false resumes them.
  void hold(bool on);
  // Waits until every stream has run all its queued work (60 s bound, then aborts the process).
  void drain();
  // The next call named `call` (an NCCL one: "commInit", "allReduce", "groupEnd",
  // "commAsyncError", ...) returns `ncclResult` at once and does nothing else. Queued per name.
  void failNext(const std::string &call, int ncclResult);
  // The next call named `call` (a CUDA one that may throw: "allocate", "batchedCopy",
  // "createStream", "setDevice", "uniqueId", ...) throws Error(HORA_ERR_BACKEND) as CUDA would.
  void throwNext(const std::string &call);
  // Every live communicator of this device gets asynchronous error `ncclResult` (a network
  // error): an op of it in progress ends without writing, later ones are skipped; peers waiting
  // for this rank wait (as on a GPU) until it aborts. With none live, the next commInit's
  // communicator starts with that error.
  void failAsync(int ncclResult);
  // true: this rank's next NCCL op (when a worker reaches it) never completes on its own (a
  // stuck rank): it posts nothing and waits until its communicator is aborted. false: disarms,
  // and lets an op stalled now go on normally.
  void stall(bool on);
  // One NCCL op at a time on this device, held while it waits for its peers: a GPU on which one
  // communicator's kernel leaves no room for another's. Two communicators whose ops reach two
  // such devices in opposite orders then deadlock (until the fake's bound aborts the process).
  void exclusive(bool on) { exclusive_ = on; }
  // true (the default): NCCL calls and groups on a communicator of two or more ranks return
  // kNcclInProgress, as NCCL's non-blocking communicators do there, and reach their stream once
  // commAsyncError has been asked again (fake_device.cpp). false: they are queued at once.
  void launchInProgress(bool on) { launchInProgress_ = on; }
  // What deviceCount(), whyNoDevice() and kernelsRunOn() say.
  void setDeviceCount(int count);
  void setWhyNoDevice(std::string why);
  void setKernelsReason(std::string why);  // "" = hora's kernels run

  // ---- What happened.
  std::vector<std::string> calls() const;
  int count(const std::string &prefix) const;  // entries starting with prefix
  std::vector<std::string> callsFrom(std::thread::id thread) const;
  void clearCalls();
  // The calling thread's device (setDevice on this FakeDevice), -1 if it never set one.
  int currentDevice() const;
  // The maxCTAs and the calling thread's allowed CPUs (sched_getaffinity) at each commInit.
  struct InitRecord {
    int maxCTAs;
    std::vector<int> cpus;
    int device;
    std::thread::id thread;
  };
  std::vector<InitRecord> inits() const;
  int lastInitMaxCTAs() const;             // -1 before any commInit
  std::vector<int> lastInitAffinity() const;  // empty before any commInit
  // Memory: allocate()/release() calls, and what is allocated now.
  int allocations() const;
  int releases() const;
  size_t liveBytes() const;
  int liveAllocations() const;
  int liveStreams() const;
  int liveEvents() const;
  int liveComms() const;  // made by commInit, not yet destroyed or aborted
  int liveCancelFlags() const;
  // memAlloc'ed and not freed; registrations (commRegister) not deregistered.
  int liveNcclMemory() const;
  int liveRegistrations() const;
  // NCCL ops this device's workers are inside now (past a stall, waiting for peers or moving
  // data): a test waits for 1 to know that an op is blocked in its rendezvous.
  int ncclOpsInProgress() const { return ncclInProgress_.load(); }

  // ---- gpu::DeviceApi.
  int deviceCount() noexcept override;
  std::string whyNoDevice() noexcept override;
  void setDevice(int device) override;
  std::shared_ptr<void> keepContext() noexcept override;
  int multiprocessors(int device) override;
  std::string kernelsRunOn(int device) noexcept override;

  gpu::StreamHandle createStream() override;
  void destroyStream(gpu::StreamHandle stream) noexcept override;
  gpu::EventHandle createEvent() override;
  void destroyEvent(gpu::EventHandle event) noexcept override;
  void recordEvent(gpu::EventHandle event, gpu::StreamHandle stream) override;
  bool eventDone(gpu::EventHandle event) override;
  void synchronizeEvent(gpu::EventHandle event) override;
  void waitEvent(gpu::StreamHandle stream, gpu::EventHandle event) override;
  void hostCallback(gpu::StreamHandle stream, void (*fn)(void *), void *arg) override;

  void *allocate(size_t bytes, gpu::StreamHandle stream) override;
  void release(void *data, gpu::StreamHandle stream) noexcept override;
  void copy(void *dst, const void *src, size_t bytes, gpu::StreamHandle stream) override;
  void zero(void *data, size_t bytes, gpu::StreamHandle stream) override;
  void batchedCopy(const std::vector<nccl_kernels::CopyItem> &items, const int *cancel,
                   gpu::StreamHandle stream) override;
  void scale(void *data, int64_t count, DType dtype, double factor, const int *cancel,
             gpu::StreamHandle stream) override;
  CancelFlag createCancelFlag() override;
  void destroyCancelFlag(CancelFlag flag) noexcept override;

  std::string ncclVersion() noexcept override;
  std::string ncclErrorString(int result) noexcept override;
  std::string uniqueId() override;
  int commInit(gpu::CommHandle *comm, const std::string &uniqueId, int size, int rank,
               int maxCTAs) noexcept override;
  // Every rank of the parent posts its (color, key) and waits (at most 20 s) for the others';
  // members then join the child, which settles like commInit's.
  int commSplit(gpu::CommHandle parent, int color, int key, gpu::CommHandle *comm, int maxCTAs) noexcept override;
  int commAsyncError(gpu::CommHandle comm, int *state) noexcept override;
  std::string commLastError(gpu::CommHandle comm) noexcept override;
  int commFinalize(gpu::CommHandle comm) noexcept override;
  int commDestroy(gpu::CommHandle comm) noexcept override;
  int commAbort(gpu::CommHandle comm) noexcept override;
  int memAlloc(void **data, size_t bytes) noexcept override;
  int memFree(void *data) noexcept override;
  int commRegister(gpu::CommHandle comm, void *data, size_t bytes, void **handle) noexcept override;
  int commDeregister(gpu::CommHandle comm, void *handle) noexcept override;
  int createPreMulSum(gpu::RedOp *op, DType dtype, double factor, gpu::CommHandle comm) noexcept override;
  int destroyRedOp(gpu::RedOp op, gpu::CommHandle comm) noexcept override;
  int groupStart() noexcept override;
  int groupEnd() noexcept override;
  int allReduce(const void *in, void *out, size_t count, DType dtype, gpu::RedOp op,
                gpu::CommHandle comm, gpu::StreamHandle stream) noexcept override;
  int broadcast(const void *in, void *out, size_t bytes, int root, gpu::CommHandle comm,
                gpu::StreamHandle stream) noexcept override;
  int allGather(const void *in, void *out, size_t bytesPerRank, gpu::CommHandle comm,
                gpu::StreamHandle stream) noexcept override;
  int reduceScatter(const void *in, void *out, size_t countPerRank, DType dtype, gpu::RedOp op,
                    gpu::CommHandle comm, gpu::StreamHandle stream) noexcept override;
  int reduce(const void *in, void *out, size_t count, DType dtype, gpu::RedOp op, int root,
             gpu::CommHandle comm, gpu::StreamHandle stream) noexcept override;
  int send(const void *in, size_t bytes, int peer, gpu::CommHandle comm,
           gpu::StreamHandle stream) noexcept override;
  int recv(void *out, size_t bytes, int peer, gpu::CommHandle comm,
           gpu::StreamHandle stream) noexcept override;

 private:
  struct Entry {
    std::string text;
    std::thread::id thread;
  };
  void log(std::string text) const;
  bool injectedFailure(const std::string &call, int *result);
  void maybeThrow(const char *call);
  void requireDevice(const char *call) const;
  fake_detail::Stream *stream(gpu::StreamHandle handle, const char *call);
  fake_detail::Event *event(gpu::EventHandle handle, const char *call);
  fake_detail::Comm *comm(gpu::CommHandle handle, const char *call) noexcept;
  // Runs `op` on the worker of `s` in order, or at once when s is the default (null) stream.
  // launch: the NCCL work of a settled launch (the only work a stream with a pending launch takes).
  void enqueue(fake_detail::Stream *s, std::unique_ptr<fake_detail::Op> op, bool launch = false);
  // Queues a flushed call or group, or keeps it as its communicator's pending launch (see
  // launchInProgress): kNcclSuccess or kNcclInProgress.
  int launch(std::vector<fake_detail::PendingCall> calls);
  // The communicator's pending launch, refused calls' message: "" if none.
  std::string launchPending(fake_detail::Comm *c);
  void worker(fake_detail::Stream *s);
  int queueNccl(gpu::CommHandle comm, gpu::StreamHandle stream, fake_detail::Call call) noexcept;
  void flushGroup(std::vector<fake_detail::PendingCall> calls);
  void runNccl(const fake_detail::NcclItem &item);
  void stopStream(fake_detail::Stream *s);
  // Marks c's rank aborted (destroyed: false) or destroyed, waits until no worker of this rank
  // is inside an op of it, and frees the handle.
  void endComm(fake_detail::Comm *c, bool destroyed);

  FakeCluster &cluster_;
  const int rank_;
  const int multiprocessors_;
  const uint64_t serial_;  // keys this device's thread-local state (current device, open group)

  // Guards everything below up to logMutex_; workers wait on cv_ (queues, hold, events).
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  int deviceCount_;
  std::string whyNoDevice_ = "no CUDA-capable device is detected";
  std::string kernelsReason_;
  bool held_ = false;
  std::map<std::string, std::vector<int>> failNext_;
  std::map<std::string, int> throwNext_;
  int pendingAsync_ = 0;
  std::map<void *, size_t> memory_;
  int allocations_ = 0, releases_ = 0;
  size_t liveBytes_ = 0;
  std::map<fake_detail::Stream *, std::unique_ptr<fake_detail::Stream>> streams_;
  std::map<fake_detail::Event *, std::shared_ptr<fake_detail::Event>> events_;
  std::set<fake_detail::Comm *> comms_;
  std::set<int *> cancelFlags_;
  std::map<void *, size_t> ncclMemory_;  // memAlloc'ed
  struct Registration {
    fake_detail::Comm *comm;
    void *data;
    size_t bytes;
  };
  std::map<void *, Registration> registrations_;  // by handle
  std::vector<int *> deadCancelFlags_;  // freed with the device: queued kernels may still read them
  std::vector<InitRecord> inits_;

  // stall(): armed_ is taken by the next NCCL op a worker reaches; stallGen_ moves on stall(false).
  std::atomic<bool> stallArmed_{false};
  std::atomic<bool> exclusive_{false};
  std::atomic<bool> launchInProgress_{true};
  std::mutex exclusiveMutex_;
  std::atomic<uint64_t> stallGen_{0};
  std::atomic<int> ncclInProgress_{0};

  mutable std::mutex logMutex_;  // guards log_
  mutable std::vector<Entry> log_;
};

}  // namespace hora::test

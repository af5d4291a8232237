// SPDX-License-Identifier: Apache-2.0
// hora-gpu-probe: one GPU, one process, no hora runtime: the costs the GPU path is built from,
// each measured alone, so that a change to hora aims at the one that matters.

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backends/nccl/nccl_kernels.h"

// Where ResNet-50's gradient shapes are: the source tree's bench/data, else where meson
// installed them (as hora-grads finds them).
#ifndef HORA_GRADS_DATA_DIR
#define HORA_GRADS_DATA_DIR "bench/data"
#endif
#ifndef HORA_GRADS_INSTALLED_DIR
#define HORA_GRADS_INSTALLED_DIR "/usr/local/share/hora"
#endif

namespace {

constexpr const char *kProgram = "hora-gpu-probe";
constexpr int kExitNoDevice = 77;  // what a test harness reads as "skipped"

// Repetitions: every part ends in a few seconds on an H100; the NCCL communicators' setup is
// most of the run.
constexpr int kCompletionReps = 200;  // per size and way of learning of completion
constexpr int kNcclIters = 1000;      // per measurement and communicator
constexpr int kPackReps = 200;        // per way of packing
constexpr int kWarmup = 20;

constexpr size_t kKiB = 1024, kMiB = 1024 * 1024;

[[noreturn]] void fail(const std::string &message) {
  std::fflush(stdout);
  std::fprintf(stderr, "%s: %s\n", kProgram, message.c_str());
  std::exit(1);
}

void check(cudaError_t e, const char *what) {
  if (e != cudaSuccess) fail(std::string(what) + ": CUDA error " + cudaGetErrorString(e));
}

void check(ncclResult_t r, const char *what) {
  if (r != ncclSuccess && r != ncclInProgress)
    fail(std::string(what) + ": NCCL error " + ncclGetErrorString(r));
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

double mean(const std::vector<double> &v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0 : sum / static_cast<double>(v.size());
}

std::string fixed(double v, int decimals) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", decimals, v);
  return b;
}

std::string sizeText(size_t bytes) {
  if (bytes >= kMiB) return std::to_string(bytes / kMiB) + " MiB";
  return std::to_string(bytes / kKiB) + " KiB";
}

// A markdown table: as readable in a log as pasted into docs/gpu.md.
class MdTable {
 public:
  explicit MdTable(std::vector<std::string> header) : header_(std::move(header)) {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void print(const std::string &title) const {
    std::vector<size_t> width(header_.size(), 3);
    for (size_t c = 0; c < header_.size(); ++c) width[c] = std::max(width[c], header_[c].size());
    for (const auto &row : rows_)
      for (size_t c = 0; c < row.size() && c < width.size(); ++c)
        width[c] = std::max(width[c], row[c].size());
    auto line = [&](const std::vector<std::string> &cells) {
      std::string out = "|";
      for (size_t c = 0; c < width.size(); ++c) {
        const std::string cell = c < cells.size() ? cells[c] : "";
        out += " " + cell + std::string(width[c] - cell.size(), ' ') + " |";
      }
      std::printf("%s\n", out.c_str());
    };
    std::printf("\n%s\n\n", title.c_str());
    line(header_);
    std::vector<std::string> rule;
    for (size_t w : width) rule.push_back(std::string(w, '-'));
    line(rule);
    for (const auto &row : rows_) line(row);
    std::fflush(stdout);
  }

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

// ---- a. completion: how the host learns that a copy finished -----------------------------------

// The ways the host can learn that the stream passed a point. Each timed from before the copy
// is queued until the host knows; the copy's own device time, timed by events, apart.
enum Way { kCopy, kHostFuncSpin, kHostFuncWake, kBlockingEvent, kEventQuery, kStreamSync, kWays };
const char *const kWayNames[kWays] = {
    "copy alone (device time, cudaEvent timing)",
    "cudaLaunchHostFunc sets a flag; a host thread spins on it",
    "cudaLaunchHostFunc notifies a condition variable a thread sleeps on",
    "event (BlockingSync | DisableTiming), cudaEventSynchronize on a helper thread, then a flag",
    "event (DisableTiming), cudaEventQuery spin",
    "cudaStreamSynchronize (reference)"};

struct Wake {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;  // guarded by mutex
};

void CUDART_CB setFlag(void *flag) { static_cast<std::atomic<int> *>(flag)->store(1, std::memory_order_release); }

void CUDART_CB wakeWaiter(void *wake) {
  Wake *w = static_cast<Wake *>(wake);
  {
    std::lock_guard<std::mutex> lock(w->mutex);
    w->done = true;
  }
  w->cv.notify_one();
}

// A thread that, asked for round k, waits for the blocking-sync event with cudaEventSynchronize
// (sleeping until the driver wakes it) and then answers k. It spins for the next question, so
// that the hand-off costs the measurement next to nothing: what is left is the event's wake-up.
class EventWaiter {
 public:
  EventWaiter(int device, cudaEvent_t event) : thread_([this, device, event] {
    cudaSetDevice(device);
    uint64_t seen = 0;
    while (true) {
      uint64_t k;
      while ((k = asked_.load(std::memory_order_acquire)) == seen)
        if (stop_.load(std::memory_order_relaxed)) return;
      error_ = cudaEventSynchronize(event);
      seen = k;
      answered_.store(k, std::memory_order_release);
    }
  }) {}
  ~EventWaiter() {
    stop_.store(true);
    thread_.join();
  }
  // After the event was recorded: returns once the helper thread saw it complete.
  void await() {
    const uint64_t k = asked_.load(std::memory_order_relaxed) + 1;
    asked_.store(k, std::memory_order_release);
    while (answered_.load(std::memory_order_acquire) != k) {
    }
    check(error_, "cudaEventSynchronize (helper thread)");
  }

 private:
  std::atomic<uint64_t> asked_{0}, answered_{0};
  std::atomic<bool> stop_{false};
  cudaError_t error_ = cudaSuccess;  // written before answered_, read after it
  std::thread thread_;
};

void completion(int device) {
  const size_t sizes[] = {4 * kKiB, kMiB, 64 * kMiB, 256 * kMiB};
  const size_t most = 256 * kMiB;
  void *src = nullptr, *dst = nullptr;
  check(cudaMalloc(&src, most), "cudaMalloc");
  check(cudaMalloc(&dst, most), "cudaMalloc");
  check(cudaMemset(src, 1, most), "cudaMemset");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  cudaEvent_t start, stop, blocking, polled;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  check(cudaEventCreateWithFlags(&blocking, cudaEventBlockingSync | cudaEventDisableTiming),
        "cudaEventCreateWithFlags");
  check(cudaEventCreateWithFlags(&polled, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  auto waiter = std::make_unique<EventWaiter>(device, blocking);
  std::atomic<int> flag{0};
  Wake wake;

  MdTable table({"size", "how the host learns of completion", "median (us)", "mean (us)",
                 "extra: median (us)", "extra: mean (us)"});
  for (size_t bytes : sizes) {
    auto copy = [&] { check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync"); };
    // One measurement of way w, in us.
    auto once = [&](int w) -> double {
      if (w == kCopy) {
        check(cudaEventRecord(start, s), "cudaEventRecord");
        copy();
        check(cudaEventRecord(stop, s), "cudaEventRecord");
        check(cudaEventSynchronize(stop), "cudaEventSynchronize");
        float ms = 0;
        check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
        return ms * 1e3;
      }
      const double t0 = now();
      copy();
      switch (w) {
        case kHostFuncSpin:
          flag.store(0, std::memory_order_relaxed);
          check(cudaLaunchHostFunc(s, setFlag, &flag), "cudaLaunchHostFunc");
          while (!flag.load(std::memory_order_acquire)) {
          }
          break;
        case kHostFuncWake: {
          std::unique_lock<std::mutex> lock(wake.mutex);
          wake.done = false;
          check(cudaLaunchHostFunc(s, wakeWaiter, &wake), "cudaLaunchHostFunc");
          wake.cv.wait(lock, [&] { return wake.done; });
          break;
        }
        case kBlockingEvent:
          check(cudaEventRecord(blocking, s), "cudaEventRecord");
          waiter->await();
          break;
        case kEventQuery: {
          check(cudaEventRecord(polled, s), "cudaEventRecord");
          cudaError_t e;
          while ((e = cudaEventQuery(polled)) == cudaErrorNotReady) {
          }
          check(e, "cudaEventQuery");
          break;
        }
        case kStreamSync: check(cudaStreamSynchronize(s), "cudaStreamSynchronize"); break;
      }
      const double us = (now() - t0) * 1e6;
      // A host function's thread may still be returning: the next round starts on an idle stream.
      check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
      return us;
    };
    std::vector<double> us[kWays];
    for (int i = 0; i < kWarmup; ++i)
      for (int w = 0; w < kWays; ++w) once(w);
    // The ways take turns, so that a slow spell of the machine falls on all of them alike.
    for (int i = 0; i < kCompletionReps; ++i)
      for (int w = 0; w < kWays; ++w) us[w].push_back(once(w));
    const double copyMedian = median(us[kCopy]), copyMean = mean(us[kCopy]);
    for (int w = 0; w < kWays; ++w) {
      const double med = median(us[w]), avg = mean(us[w]);
      table.add({sizeText(bytes), kWayNames[w], fixed(med, 1), fixed(avg, 1),
                 w == kCopy ? "" : fixed(med - copyMedian, 1),
                 w == kCopy ? "" : fixed(avg - copyMean, 1)});
    }
  }
  table.print("## a. completion after a device-to-device cudaMemcpyAsync on a non-blocking stream ("
              + std::to_string(kCompletionReps) + " rounds; time from before the copy is queued "
              "until the host knows; extra = that minus the copy's own device time)");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaEventDestroy(polled);
  waiter.reset();  // before its event
  cudaEventDestroy(blocking);
  cudaStreamDestroy(s);
  cudaFree(src);
  cudaFree(dst);
}

// ---- b. NCCL's cost per call: blocking and non-blocking communicator ---------------------------

// A non-blocking communicator's call may return ncclInProgress: it is settled (NCCL's rule
// before the next call) by polling ncclCommGetAsyncError, yielding the core between looks.
// Returns whether it was in progress.
bool settle(ncclComm_t comm, ncclResult_t r, const char *what) {
  check(r, what);
  if (r != ncclInProgress) return false;
  do {
    sched_yield();
    check(ncclCommGetAsyncError(comm, &r), "ncclCommGetAsyncError");
  } while (r == ncclInProgress);
  check(r, what);
  return true;
}

void ncclCalls() {
  constexpr int kGroup = 8;
  void *send = nullptr, *recv = nullptr;
  check(cudaMalloc(&send, kMiB * kGroup), "cudaMalloc");
  check(cudaMalloc(&recv, kMiB * kGroup), "cudaMalloc");
  check(cudaMemset(send, 0, kMiB * kGroup), "cudaMemset");
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  auto sync = [&] { check(cudaStreamSynchronize(s), "cudaStreamSynchronize"); };

  MdTable table({"communicator", "what", "median (us)", "mean (us)", "ncclInProgress returns"});
  std::string inits;
  for (int blocking : {1, 0}) {
    const char *kind = blocking ? "blocking" : "non-blocking";
    ncclUniqueId id;
    check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = blocking;
    ncclComm_t comm = nullptr;
    const double t0 = now();
    const ncclResult_t init = ncclCommInitRankConfig(&comm, 1, id, 0, &config);
    settle(comm, init, "ncclCommInitRankConfig");
    inits += std::string(inits.empty() ? "" : ", ") + kind + " " + fixed(now() - t0, 2) + " s";

    auto allreduce = [&](size_t bytes, int slot) {
      return ncclAllReduce(static_cast<char *>(send) + slot * kMiB,
                           static_cast<char *>(recv) + slot * kMiB, bytes / 4, ncclFloat32,
                           ncclSum, comm, s);
    };
    // One measurement: `iters` rounds of `round` (which returns whether NCCL was in progress),
    // each timed; `syncEvery` rounds, the stream is synchronised untimed, so that a long queue
    // does not make the launches wait.
    auto measure = [&](const std::string &what, int syncEvery, const std::function<bool()> &round) {
      for (int i = 0; i < kWarmup; ++i) round();
      sync();
      std::vector<double> us;
      int inProgress = 0;
      for (int i = 0; i < kNcclIters; ++i) {
        const double start = now();
        inProgress += round();
        us.push_back((now() - start) * 1e6);
        if (syncEvery > 0 && (i + 1) % syncEvery == 0) sync();
      }
      sync();
      table.add({kind, what, fixed(median(us), 2), fixed(mean(us), 2),
                 std::to_string(inProgress) + " / " + std::to_string(kNcclIters)});
    };
    measure("ncclAllReduce 1 KiB, the call alone (host time)", 64,
            [&] { return settle(comm, allreduce(kKiB, 0), "ncclAllReduce"); });
    measure("ncclAllReduce 1 KiB, then cudaStreamSynchronize", 0, [&] {
      const bool p = settle(comm, allreduce(kKiB, 0), "ncclAllReduce");
      sync();
      return p;
    });
    measure("ncclAllReduce 1 MiB, then cudaStreamSynchronize", 0, [&] {
      const bool p = settle(comm, allreduce(kMiB, 0), "ncclAllReduce");
      sync();
      return p;
    });
    auto group = [&] {
      check(ncclGroupStart(), "ncclGroupStart");
      bool p = false;
      for (int k = 0; k < kGroup; ++k) p |= settle(comm, allreduce(kKiB, k), "ncclAllReduce");
      return settle(comm, ncclGroupEnd(), "ncclGroupEnd") || p;
    };
    measure("ncclGroupStart, 8 x ncclAllReduce 1 KiB, ncclGroupEnd (host time)", 16, group);
    measure("the same group, then cudaStreamSynchronize", 0, [&] {
      const bool p = group();
      sync();
      return p;
    });
    check(ncclCommDestroy(comm), "ncclCommDestroy");
  }
  table.print("## b. NCCL per call, one rank (" + std::to_string(kNcclIters) +
              " calls each, out of place, float32 sum; non-blocking calls settled by polling "
              "ncclCommGetAsyncError with sched_yield; communicator setup: " + inits + ")");
  cudaStreamDestroy(s);
  cudaFree(send);
  cudaFree(recv);
}

// ---- c. packing ResNet-50's gradients into one buffer ------------------------------------------

// The tensors' sizes in bytes (float32) from a hora-grads model file: '#' comment lines, then
// one 'name dims' line per tensor, dims joined by 'x'.
std::vector<int64_t> readTensorBytes(const std::string &path) {
  std::ifstream in(path);
  if (!in) fail("cannot read " + path + ": " + std::strerror(errno) + " (pass --grads FILE)");
  std::vector<int64_t> bytes;
  std::string line;
  int lineNo = 0;
  while (std::getline(in, line)) {
    ++lineNo;
    std::istringstream fields(line);
    std::string name, dims;
    if (!(fields >> name) || name[0] == '#') continue;
    if (!(fields >> dims)) fail(path + ":" + std::to_string(lineNo) + ": expected 'name dims'");
    int64_t numel = 1;
    std::istringstream parts(dims);
    std::string d;
    while (std::getline(parts, d, 'x')) {
      char *end = nullptr;
      const long long v = std::strtoll(d.c_str(), &end, 10);
      if (d.empty() || *end != '\0' || v < 1 || v > (1LL << 32))
        fail(path + ":" + std::to_string(lineNo) + ": bad dimension '" + d + "'");
      numel *= v;
    }
    bytes.push_back(numel * 4);
  }
  if (bytes.empty()) fail(path + ": no tensors");
  return bytes;
}

void packing(int device, const std::string &gradsFile) {
  const std::vector<int64_t> sizes = readTensorBytes(gradsFile);
  const size_t count = sizes.size();
  // The tensors where a framework's allocator leaves them (torch's rounds blocks up to 512
  // bytes), packed back to back, as into hora's fusion buffer.
  std::vector<size_t> srcAt(count), dstAt(count);
  size_t srcBytes = 0, total = 0;
  for (size_t i = 0; i < count; ++i) {
    srcAt[i] = srcBytes;
    dstAt[i] = total;
    srcBytes += (static_cast<size_t>(sizes[i]) + 511) / 512 * 512;
    total += static_cast<size_t>(sizes[i]);
  }
  char *src = nullptr, *dst = nullptr, *flat = nullptr;
  check(cudaMalloc(&src, srcBytes), "cudaMalloc");
  check(cudaMalloc(&dst, total), "cudaMalloc");
  check(cudaMalloc(&flat, total), "cudaMalloc");
  // Byte j of tensor i: (31 i + 7 j) mod 256, so that a tensor in the wrong place shows.
  std::vector<unsigned char> host(srcBytes, 0), back(total);
  for (size_t i = 0; i < count; ++i)
    for (int64_t j = 0; j < sizes[i]; ++j)
      host[srcAt[i] + static_cast<size_t>(j)] = static_cast<unsigned char>(31 * i + 7 * j);
  check(cudaMemcpy(src, host.data(), srcBytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");

  std::vector<hora::nccl_kernels::CopyItem> items;
  std::vector<void *> dsts;
  std::vector<const void *> srcs;
  std::vector<size_t> bytes;
  for (size_t i = 0; i < count; ++i) {
    items.push_back({src + srcAt[i], dst + dstAt[i], sizes[i]});
    dsts.push_back(dst + dstAt[i]);
    srcs.push_back(src + srcAt[i]);
    bytes.push_back(static_cast<size_t>(sizes[i]));
  }

  // Each way queues the whole pack on s and returns CUDA's error (cudaSuccess once queued).
  struct PackWay {
    std::string name;
    std::function<cudaError_t()> queue;
    std::string unavailable;  // why it cannot run here; "" when it can
  };
  std::vector<PackWay> ways;
  ways.push_back({"one cudaMemcpyAsync per tensor (" + std::to_string(count) + " calls)", [&] {
                    for (size_t i = 0; i < count; ++i) {
                      const cudaError_t e = cudaMemcpyAsync(dsts[i], srcs[i], bytes[i],
                                                            cudaMemcpyDeviceToDevice, s);
                      if (e != cudaSuccess) return e;
                    }
                    return cudaSuccess;
                  }, ""});
  ways.push_back({"hora's batched copy kernel (nccl_kernels::batchedCopy)", [&] {
                    return static_cast<cudaError_t>(hora::nccl_kernels::batchedCopy(items, nullptr, s));
                  }, hora::nccl_kernels::kernelsRunOn(device)});
#if CUDART_VERSION >= 13000
  ways.push_back({"cudaMemcpyBatchAsync (one call)", [&] {
                    cudaMemcpyAttributes attrs{};
                    attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
                    size_t attrsIdx = 0;
                    return cudaMemcpyBatchAsync(dsts.data(), srcs.data(), bytes.data(), count,
                                                &attrs, &attrsIdx, 1, s);
                  }, ""});
#else
  ways.push_back({"cudaMemcpyBatchAsync (one call)", nullptr,
                  "built against CUDA " + std::to_string(CUDART_VERSION) +
                      ", whose cudaMemcpyBatchAsync differs: build against CUDA 13"});
#endif
  ways.push_back({"bound: one cudaMemcpyAsync of the same total, contiguous", [&] {
                    return cudaMemcpyAsync(dst, flat, total, cudaMemcpyDeviceToDevice, s);
                  }, ""});

  MdTable table({"way", "device: median (us)", "device: mean (us)", "enqueue: median (us)",
                 "GB/s (read + write)", "vs bound", "wrong tensors"});
  std::vector<double> deviceMedian(ways.size(), 0);
  std::vector<std::vector<std::string>> rows;
  for (size_t w = 0; w < ways.size(); ++w) {
    PackWay &way = ways[w];
    if (!way.unavailable.empty()) {
      rows.push_back({way.name, "n/a: " + way.unavailable});
      continue;
    }
    auto queue = [&] {
      const cudaError_t e = way.queue();
      if (e != cudaSuccess) {
        cudaGetLastError();
        way.unavailable = cudaGetErrorString(e);
      }
      return e == cudaSuccess;
    };
    // Checked first, on a zeroed destination (the bound copies other bytes: not checked).
    const bool bound = w + 1 == ways.size();
    check(cudaMemsetAsync(dst, 0, total, s), "cudaMemsetAsync");
    if (!queue()) {
      rows.push_back({way.name, "n/a: " + way.unavailable});
      check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
      continue;
    }
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    int wrong = 0;
    if (!bound) {
      check(cudaMemcpy(back.data(), dst, total, cudaMemcpyDeviceToHost), "cudaMemcpy");
      for (size_t i = 0; i < count; ++i)
        wrong += std::memcmp(back.data() + dstAt[i], host.data() + srcAt[i], bytes[i]) != 0;
    }
    std::vector<double> deviceUs, enqueueUs;
    for (int r = 0; r < kWarmup + kPackReps; ++r) {
      check(cudaEventRecord(start, s), "cudaEventRecord");
      const double t0 = now();
      if (!queue()) break;
      const double queued = now();
      check(cudaEventRecord(stop, s), "cudaEventRecord");
      check(cudaEventSynchronize(stop), "cudaEventSynchronize");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
      if (r < kWarmup) continue;
      deviceUs.push_back(ms * 1e3);
      enqueueUs.push_back((queued - t0) * 1e6);
    }
    if (!way.unavailable.empty()) {
      rows.push_back({way.name, "n/a: " + way.unavailable});
      check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
      continue;
    }
    deviceMedian[w] = median(deviceUs);
    rows.push_back({way.name, fixed(deviceMedian[w], 1), fixed(mean(deviceUs), 1),
                    fixed(median(enqueueUs), 1),
                    fixed(2.0 * static_cast<double>(total) / (deviceMedian[w] * 1e3), 0), "",
                    bound ? "" : std::to_string(wrong)});
  }
  const double boundUs = deviceMedian.back();
  for (size_t w = 0; w < rows.size(); ++w) {
    if (rows[w].size() > 5 && boundUs > 0) rows[w][5] = fixed(boundUs / deviceMedian[w], 2);
    table.add(rows[w]);
  }
  table.print("## c. packing ResNet-50's " + std::to_string(count) + " gradients (" +
              fixed(static_cast<double>(total) / 1e6, 1) + " MB, from 512-byte-aligned places) "
              "into one buffer (" + std::to_string(kPackReps) + " packs each; device time between "
              "two events; enqueue = host time of the calls; vs bound = the bound's time / this one)");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(s);
  cudaFree(src);
  cudaFree(dst);
  cudaFree(flat);
}

// ---- main --------------------------------------------------------------------------------------

void usage(FILE *f) {
  std::fprintf(
      f,
      "usage: hora-gpu-probe [a] [b] [c] [--grads FILE]\n"
      "One process on one GPU (cuda:0 of what CUDA_VISIBLE_DEVICES shows), no hora runtime, no\n"
      "launcher: the costs hora's GPU path is built from, each measured alone. It prints the card,\n"
      "then one markdown table per part (default: all three), medians and means over repetitions:\n"
      "  a  completion: after a device-to-device cudaMemcpyAsync (4 KiB, 1 MiB, 64 MiB, 256 MiB)\n"
      "     on a non-blocking stream, the time until the host knows it finished, by a host function\n"
      "     (cudaLaunchHostFunc) setting a flag a thread spins on or waking a sleeping thread, by a\n"
      "     blocking-sync event waited for on a helper thread, by cudaEventQuery spinning, and by\n"
      "     cudaStreamSynchronize; each against the copy's own device time (cudaEvent timing)\n"
      "  b  NCCL per call at one rank, blocking and non-blocking communicator (config.blocking 1\n"
      "     and 0; ncclInProgress settled by polling ncclCommGetAsyncError with sched_yield): the\n"
      "     host time of an ncclAllReduce call, its end-to-end latency with a stream sync at 1 KiB\n"
      "     and 1 MiB, and ncclGroupStart/End around 8 calls (%d calls each)\n"
      "  c  packing ResNet-50's gradients (--grads) into one buffer: a cudaMemcpyAsync per tensor,\n"
      "     hora's batched copy kernel, cudaMemcpyBatchAsync; against one copy of the same bytes\n"
      "  --grads FILE  the model whose tensors part c packs (hora-grads' format). Default:\n"
      "                resnet50_grads.txt in " HORA_GRADS_DATA_DIR "\n"
      "                (once installed: " HORA_GRADS_INSTALLED_DIR ")\n"
      "Exits 77 where there is no GPU. Takes a few seconds (NCCL's setup is most of it).\n",
      kNcclIters);
}

}  // namespace

int main(int argc, char **argv) {
  bool parts[3] = {false, false, false};
  std::string grads = access(HORA_GRADS_DATA_DIR "/resnet50_grads.txt", R_OK) == 0
                          ? HORA_GRADS_DATA_DIR "/resnet50_grads.txt"
                          : HORA_GRADS_INSTALLED_DIR "/resnet50_grads.txt";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      usage(stdout);
      return 0;
    }
    if (a == "--grads" && i + 1 < argc) {
      grads = argv[++i];
    } else if (a.rfind("--grads=", 0) == 0) {
      grads = a.substr(8);
    } else if (a == "a" || a == "b" || a == "c") {
      parts[a[0] - 'a'] = true;
    } else {
      std::fprintf(stderr, "%s: unexpected '%s' (see --help)\n", kProgram, a.c_str());
      return 1;
    }
  }
  if (!parts[0] && !parts[1] && !parts[2]) parts[0] = parts[1] = parts[2] = true;

  int gpus = 0;
  const cudaError_t e = cudaGetDeviceCount(&gpus);
  if (e != cudaSuccess || gpus == 0) {
    std::fprintf(stderr, "%s: no CUDA device: %s\n", kProgram,
                 e != cudaSuccess ? (std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e)).c_str()
                                  : "cudaGetDeviceCount found 0 devices");
    return kExitNoDevice;
  }
  const int device = 0;
  check(cudaSetDevice(device), "cudaSetDevice");
  cudaDeviceProp prop;
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  int driver = 0, runtime = 0, nccl = 0;
  check(cudaDriverGetVersion(&driver), "cudaDriverGetVersion");
  check(cudaRuntimeGetVersion(&runtime), "cudaRuntimeGetVersion");
  check(ncclGetVersion(&nccl), "ncclGetVersion");
  auto cudaVersion = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
  auto ncclVersion = [](int v) {
    return std::to_string(v / 10000) + "." + std::to_string(v % 10000 / 100) + "." +
           std::to_string(v % 100);
  };
  std::printf("# %s: cuda:%d of %d: %s, sm_%d%d, %d SMs, %.1f GiB\n", kProgram, device, gpus,
              prop.name, prop.major, prop.minor, prop.multiProcessorCount,
              static_cast<double>(prop.totalGlobalMem) / (1 << 30));
  std::printf("# CUDA driver %s, runtime %s; NCCL %s (built against %s); hora's kernels: %s\n",
              cudaVersion(driver).c_str(), cudaVersion(runtime).c_str(), ncclVersion(nccl).c_str(),
              ncclVersion(NCCL_VERSION_CODE).c_str(), hora::nccl_kernels::builtArchitectures());
  std::fflush(stdout);
  const double t0 = now();
  if (parts[0]) completion(device);
  if (parts[1]) ncclCalls();
  if (parts[2]) packing(device, grads);
  std::printf("\n# %s: done in %.1f s\n", kProgram, now() - t0);
  return 0;
}

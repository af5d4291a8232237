// SPDX-License-Identifier: Apache-2.0
// CUDA for the rest of hora without CUDA headers: devices, device memory, streams, events. Every
// failure throws Error(HORA_ERR_BACKEND) with CUDA's own words and what hora was doing.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace hora::nccl_device {

// Visible CUDA devices; 0 when there is no GPU or no driver (never throws).
int deviceCount();
// Why deviceCount() is 0, for messages ("no CUDA driver", "no CUDA-capable device", ...).
std::string whyNoDevice();

// The calling thread's device from now on.
void setDevice(int device);

// Device memory, freed on destruction.
class Buffer {
 public:
  Buffer(int device, size_t bytes);
  ~Buffer() noexcept;
  Buffer(const Buffer &) = delete;
  Buffer &operator=(const Buffer &) = delete;
  void *data() const { return data_; }
  size_t size() const { return bytes_; }
  int device() const { return device_; }
  void upload(const void *host, size_t bytes, size_t offset = 0);    // synchronous
  void download(void *host, size_t bytes, size_t offset = 0) const;  // synchronous

 private:
  int device_;
  size_t bytes_;
  void *data_ = nullptr;
};

// A non-blocking stream of hora's own on one device (a cudaStream_t).
class Stream {
 public:
  explicit Stream(int device);
  ~Stream() noexcept;
  Stream(const Stream &) = delete;
  Stream &operator=(const Stream &) = delete;
  void *handle() const { return stream_; }
  int device() const { return device_; }
  // Later work on this stream waits for `event` (a cudaEvent_t) first.
  void waitFor(void *event);
  void synchronize();  // blocks until everything queued so far has run

 private:
  int device_;
  void *stream_ = nullptr;
};

// An event recorded on `stream` of `device` (nullptr: the legacy default stream), owned by the
// returned pointer: the caller's work so far, which hora's stream waits for. The calling thread's
// CUDA context is the same afterwards (none stays none: no context is left on another GPU).
std::shared_ptr<void> recordEvent(int device, void *stream);
// The calling thread's CUDA context (its device where the driver's context calls are missing),
// put back exactly when the returned object is dropped (none stays none). For a thread of the
// caller's that runs a set's cycle, which sets hora's device. Never throws.
std::shared_ptr<void> keepContext() noexcept;
// Whether everything before the event has run (cudaEventQuery; never blocks). "Not yet" leaves
// nothing in the thread's CUDA error slot. Throws for an error the event reports.
bool eventDone(void *event);

// Checks a cudaError_t (as int) from a launch: throws naming `what` when it is not success, and
// takes the error out of the thread's error slot (reported once).
void check(int cudaError, const char *what);

}  // namespace hora::nccl_device

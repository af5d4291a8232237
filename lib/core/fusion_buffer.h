// SPDX-License-Identifier: Apache-2.0
// A persistent staging buffer for fused collectives.
#pragma once

#include <cstddef>

namespace hora {

// Allocated once and grown when a larger fused response needs it, never per call: a fresh
// message-sized allocation above glibc's mmap threshold is mapped anew each time and every first
// touch of a page costs a fault. New memory is touched when it is allocated, off the hot path.
// The set's cycles only (one thread at a time: SetEngine's cycle lock).
class FusionBuffer {
 public:
  FusionBuffer() = default;
  ~FusionBuffer();
  FusionBuffer(const FusionBuffer &) = delete;
  FusionBuffer &operator=(const FusionBuffer &) = delete;

  // At least `bytes`, 64-byte aligned. Invalidates earlier pointers when it grows.
  void *get(size_t bytes);
  size_t capacity() const { return capacity_; }

 private:
  void *data_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace hora

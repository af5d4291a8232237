// SPDX-License-Identifier: Apache-2.0
// A POSIX shared-memory segment mapped by every rank of one group on one host.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "core/control_plane.h"

namespace hora {

// Created by rank 0, opened by the others, unlinked as soon as everyone has it mapped: nothing is
// left in /dev/shm even if a rank dies later.
// Unlinks the segments in `dir` (/dev/shm) that a hora process created and left behind: named
// /hora-<pid>-*, their creator gone, last changed at least minAge ago. Returns how many. A
// creator that is killed between creating and unlinking its segment (setup takes milliseconds)
// cannot clean up itself; the next one on the host does.
size_t removeStaleSegments(const std::string &dir, std::chrono::seconds minAge);

class ShmSegment {
 public:
  // Collective over `control`. Returns nullptr on every rank (with *why set) if any rank could not
  // create or map it; never throws for that, so the caller can fall back.
  static std::unique_ptr<ShmSegment> create(ControlPlane &control, size_t bytes, std::string *why);
  ~ShmSegment();
  ShmSegment(const ShmSegment &) = delete;
  ShmSegment &operator=(const ShmSegment &) = delete;

  void *base() const { return base_; }
  size_t size() const { return bytes_; }

 private:
  ShmSegment(void *base, size_t bytes) : base_(base), bytes_(bytes) {}
  void *base_;
  size_t bytes_;
};

}  // namespace hora

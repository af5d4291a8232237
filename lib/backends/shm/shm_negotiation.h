// SPDX-License-Identifier: Apache-2.0
// The engine's negotiation AND (Backend::andWords) through the shared segment.
#pragma once

#include <cstdint>
#include <vector>

#include "backends/shm/shm_channel.h"

namespace hora {

// A sleeping peer is woken by the barrier's futex the moment the last rank arrives, where polling
// a non-blocking MPI collective sleeps in growing slices. One thread at a time (the engine's).
class ShmNegotiation {
 public:
  explicit ShmNegotiation(ShmChannel &channel) : channel_(channel) {}
  // The longest vector the channel holds (BackendCaps::negotiationWords).
  static constexpr size_t kWords = static_cast<size_t>(ShmChannel::kAndBytes) / sizeof(uint64_t);
  // Backend::andWords, for at most kWords words.
  void andWords(std::vector<uint64_t> &words);

 private:
  ShmChannel &channel_;
  uint64_t calls_ = 0;  // ANDs run: picks the bit-vector half
};

}  // namespace hora

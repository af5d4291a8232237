// SPDX-License-Identifier: Apache-2.0
#include "backends/shm/shm_negotiation.h"

#include <cstring>

#include "base/error.h"

namespace hora {

// Halves alternate by call, so the next call's barrier makes reuse safe: a peer can be at most
// one call ahead.
void ShmNegotiation::andWords(std::vector<uint64_t> &words) {
  HORA_ENFORCE(words.size() <= kWords, "negotiation vector of ", words.size(), " words over the ",
               kWords, " the segment holds");
  const size_t bytes = words.size() * sizeof(uint64_t);
  const uint64_t parity = calls_++ & 1;
  std::memcpy(channel_.andVector(channel_.rank(), parity), words.data(), bytes);
  channel_.barrier().wait("negotiation");
  for (int r = 0; r < channel_.size(); ++r) {
    if (r == channel_.rank()) continue;
    const uint64_t *theirs = channel_.andVector(r, parity);
    for (size_t i = 0; i < words.size(); ++i) words[i] &= theirs[i];
  }
}

}  // namespace hora

// SPDX-License-Identifier: Apache-2.0
// Responses of recent ops, by name, so the steady state (the same tensors every step) negotiates
// with one bit-vector allreduce instead of a coordinator round trip.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/message.h"

namespace hora {

// Every rank applies the same put/touch/erase calls in the same order (the order in which
// responses execute), so slot numbers agree across ranks and can be used as bit positions.
// The set's cycles only (one thread at a time: SetEngine's cycle lock).
class ResponseCache {
 public:
  explicit ResponseCache(int capacity);

  int capacity() const { return capacity_; }
  int size() const { return static_cast<int>(byName_.size()); }

  enum class Lookup { kMiss, kHit, kChanged };
  // kHit: same name and this rank's request is unchanged; kChanged: same name, different request
  // (shape, dtype, ...), so the entry must be dropped on every rank. *slot set unless kMiss.
  Lookup lookup(const RequestMsg &mine, int *slot) const;
  const Response &response(int slot) const;
  // The same response, shared: what a cycle hands the executor without copying it.
  const std::shared_ptr<const Response> &shared(int slot) const;
  bool occupied(int slot) const;

  // Inserts (or replaces) the entry for response.agreed.name, evicting the least recently used
  // entry when full, and marks it most recently used. No-op when capacity is 0 or the response is
  // an error. Returns the slot, or -1.
  int put(std::shared_ptr<const Response> response, const RequestMsg &mine);
  int put(const Response &response, const RequestMsg &mine) {
    return put(std::make_shared<const Response>(response), mine);
  }
  void touch(int slot);
  void erase(int slot);

 private:
  struct Entry {
    bool used = false;
    std::shared_ptr<const Response> response;
    RequestMsg mine;
    std::list<int>::iterator lru;
  };
  int capacity_;
  std::vector<Entry> slots_;
  std::unordered_map<std::string, int> byName_;
  std::list<int> lru_;     // front: most recently used
  std::vector<int> free_;  // back: next slot to use (lowest first)
};

}  // namespace hora

// SPDX-License-Identifier: Apache-2.0
// ResponseCache: fixed slots with LRU eviction.
#include "core/response_cache.h"

#include "base/error.h"

namespace hora {

ResponseCache::ResponseCache(int capacity) : capacity_(capacity < 0 ? 0 : capacity) {
  slots_.resize(static_cast<size_t>(capacity_));
  for (int i = capacity_ - 1; i >= 0; --i) free_.push_back(i);
}

ResponseCache::Lookup ResponseCache::lookup(const RequestMsg &mine, int *slot) const {
  auto it = byName_.find(mine.name);
  if (it == byName_.end()) return Lookup::kMiss;
  *slot = it->second;
  return slots_[static_cast<size_t>(it->second)].mine == mine ? Lookup::kHit : Lookup::kChanged;
}

const Response &ResponseCache::response(int slot) const {
  HORA_ENFORCE(occupied(slot), "cache slot ", slot, " is empty");
  return *slots_[static_cast<size_t>(slot)].response;
}

const std::shared_ptr<const Response> &ResponseCache::shared(int slot) const {
  HORA_ENFORCE(occupied(slot), "cache slot ", slot, " is empty");
  return slots_[static_cast<size_t>(slot)].response;
}

bool ResponseCache::occupied(int slot) const {
  return slot >= 0 && slot < capacity_ && slots_[static_cast<size_t>(slot)].used;
}

int ResponseCache::put(std::shared_ptr<const Response> response, const RequestMsg &mine) {
  if (capacity_ == 0 || !response->ok()) return -1;
  auto it = byName_.find(response->agreed.name);
  if (it != byName_.end()) erase(it->second);
  if (free_.empty()) erase(lru_.back());
  const int slot = free_.back();
  free_.pop_back();
  Entry &e = slots_[static_cast<size_t>(slot)];
  e.used = true;
  e.mine = mine;
  lru_.push_front(slot);
  e.lru = lru_.begin();
  byName_[response->agreed.name] = slot;
  e.response = std::move(response);
  return slot;
}

void ResponseCache::touch(int slot) {
  if (!occupied(slot)) return;
  Entry &e = slots_[static_cast<size_t>(slot)];
  lru_.splice(lru_.begin(), lru_, e.lru);
}

void ResponseCache::erase(int slot) {
  if (!occupied(slot)) return;
  Entry &e = slots_[static_cast<size_t>(slot)];
  byName_.erase(e.response->agreed.name);
  lru_.erase(e.lru);
  e = Entry{};
  free_.push_back(slot);
}

}  // namespace hora

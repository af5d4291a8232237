// SPDX-License-Identifier: Apache-2.0
// Response cache: hits, changed signatures, LRU eviction and deterministic slots.
#include <gtest/gtest.h>

#include "core/response_cache.h"

namespace hora {
namespace {

RequestMsg msg(const std::string &name, int64_t n = 4) {
  RequestMsg m;
  m.name = name;
  m.shapes = {{n}};
  return m;
}

Response ok(const RequestMsg &m) {
  Response r;
  r.agreed = m;
  return r;
}

TEST(ResponseCache, MissThenHitThenChanged) {
  ResponseCache c(4);
  int slot = -1;
  EXPECT_EQ(c.lookup(msg("a"), &slot), ResponseCache::Lookup::kMiss);
  const int put = c.put(ok(msg("a")), msg("a"));
  EXPECT_EQ(put, 0);
  EXPECT_EQ(c.lookup(msg("a"), &slot), ResponseCache::Lookup::kHit);
  EXPECT_EQ(slot, 0);
  EXPECT_EQ(c.response(slot).agreed.name, "a");
  EXPECT_EQ(c.lookup(msg("a", 5), &slot), ResponseCache::Lookup::kChanged);
  EXPECT_EQ(slot, 0);
}

TEST(ResponseCache, ErrorsAndZeroCapacityAreNotCached) {
  ResponseCache c(4);
  Response bad = ok(msg("a"));
  bad.status = HORA_ERR_MISMATCH;
  EXPECT_EQ(c.put(bad, msg("a")), -1);
  EXPECT_EQ(c.size(), 0);
  ResponseCache off(0);
  EXPECT_EQ(off.put(ok(msg("a")), msg("a")), -1);
  int slot;
  EXPECT_EQ(off.lookup(msg("a"), &slot), ResponseCache::Lookup::kMiss);
}

TEST(ResponseCache, EvictsLeastRecentlyUsed) {
  ResponseCache c(3);
  c.put(ok(msg("a")), msg("a"));  // slot 0
  c.put(ok(msg("b")), msg("b"));  // slot 1
  c.put(ok(msg("c")), msg("c"));  // slot 2
  c.touch(0);                     // a is now most recent; b is least
  EXPECT_EQ(c.put(ok(msg("d")), msg("d")), 1);
  int slot;
  EXPECT_EQ(c.lookup(msg("b"), &slot), ResponseCache::Lookup::kMiss);
  EXPECT_EQ(c.lookup(msg("a"), &slot), ResponseCache::Lookup::kHit);
  EXPECT_EQ(c.lookup(msg("d"), &slot), ResponseCache::Lookup::kHit);
  EXPECT_EQ(slot, 1);
  EXPECT_EQ(c.size(), 3);
}

TEST(ResponseCache, EraseFreesTheSlotAndReplaceKeepsOneEntry) {
  ResponseCache c(2);
  c.put(ok(msg("a")), msg("a"));
  c.put(ok(msg("b")), msg("b"));
  c.erase(0);
  EXPECT_FALSE(c.occupied(0));
  EXPECT_EQ(c.put(ok(msg("c")), msg("c")), 0);
  // Putting an existing name again replaces it rather than duplicating it.
  c.put(ok(msg("c", 9)), msg("c", 9));
  EXPECT_EQ(c.size(), 2);
  int slot;
  EXPECT_EQ(c.lookup(msg("c", 9), &slot), ResponseCache::Lookup::kHit);
}

TEST(ResponseCache, SameCallsGiveSameSlots) {
  // Two caches fed the same sequence must agree slot for slot (slots are bit positions).
  ResponseCache x(8), y(8);
  for (int i = 0; i < 50; ++i) {
    const std::string name = "t" + std::to_string((i * 7) % 13);
    for (ResponseCache *c : {&x, &y}) {
      int slot;
      if (c->lookup(msg(name), &slot) == ResponseCache::Lookup::kHit) c->touch(slot);
      else c->put(ok(msg(name)), msg(name));
    }
  }
  for (int s = 0; s < 8; ++s) {
    ASSERT_EQ(x.occupied(s), y.occupied(s));
    if (x.occupied(s)) {
      EXPECT_EQ(x.response(s).agreed.name, y.response(s).agreed.name);
    }
  }
}

}  // namespace
}  // namespace hora

// SPDX-License-Identifier: Apache-2.0
// The intra-host halves of a hierarchical allreduce: a reduce-scatter through the shared segment
// before the cross-host step and an allgather after it, for a process set that spans hosts.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "backends/shm/shm_channel.h"
#include "backends/shm/shm_op.h"

namespace hora {

// One thread at a time (the backend's caller). The channel is this host's ranks of the set; the
// ranks with local index below `owners` (the fewest ranks any host of the set has) each own one
// share of every pipeline window and carry it to the other hosts.
class HierAllreduce {
 public:
  // Allreduce of `count` elements at `buf`, in place, among the ranks that own the same share on
  // every host. Called by owners only, with the same counts on every host.
  using Cross = std::function<void(void *buf, int64_t count, DType dtype, ReduceOp op)>;

  // halfAcross: the cross-host plane reduces float16 and bfloat16 itself (they cross in their own
  // type); otherwise their host sums cross as float32.
  HierAllreduce(ShmChannel &channel, int owners, Cross cross, bool halfAcross)
      : channel_(channel), owners_(owners), cross_(std::move(cross)), halfAcross_(halfAcross) {}

  // Collective over the set (every rank of every host calls it for the same operation).
  void run(const std::vector<Backend::Span> &spans, DType dtype, ReduceOp op, double pre, double post);

 private:
  using Range = std::pair<int64_t, int64_t>;  // elements [first, second) of the vector
  struct Shares {  // owner r's share of window [a, b): elements [share(r), share(r + 1))
    int64_t a, b, units, unit;
    int owners;
    int64_t operator()(int r) const { return std::min(b, a + units * r / owners * unit); }
  };
  Shares sharesOf(Range range, int64_t unit) const {
    return {range.first, range.second, (range.second - range.first + unit - 1) / unit, unit, owners_};
  }
  bool owner() const { return channel_.rank() < owners_; }
  size_t scratchElement(const ShmOp &o) const { return wide_ ? sizeof(float) : o.esize; }
  char *scratchAt(const ShmOp &o, int64_t t) {
    return scratch_.data() + static_cast<size_t>(offsets_[static_cast<size_t>(t)]) * scratchElement(o);
  }

  void exportWindow(const ShmOp &o, uint64_t w, Range range, int64_t unit);
  void reduceWindow(const ShmOp &o, uint64_t w, int64_t t, Range range, int64_t unit);
  void publishWindow(const ShmOp &o, uint64_t w, int64_t t, Range range, int64_t unit);
  void copyWindow(const ShmOp &o, uint64_t w, Range range, int64_t unit);

  ShmChannel &channel_;
  const int owners_;
  Cross cross_;
  const bool halfAcross_;
  uint64_t seq_ = 0;           // operations run: ShmOp::seq
  uint64_t windows_ = 0;       // pipeline windows run, over all operations: picks the ring slots
  bool wide_ = false;          // this operation's host sums are float32 (float16/bfloat16 input)
  SpanTable table_;            // this operation's tensors
  std::vector<int64_t> offsets_;  // owner: where each window's share starts in scratch_ (elements)
  std::vector<char> scratch_;     // owner: its shares of every window, reduced over the host
  std::vector<float> acc_;        // float32 accumulator for float16/bfloat16
  std::vector<char> staged_;      // float16/bfloat16: this rank's share, before widening
};

}  // namespace hora

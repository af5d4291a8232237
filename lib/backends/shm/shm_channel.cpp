// SPDX-License-Identifier: Apache-2.0
#include "backends/shm/shm_channel.h"

#include <unistd.h>

namespace hora {

ShmChannel::ShmChannel(std::unique_ptr<ShmSegment> segment, int rank, int size, double timeoutS)
    : segment_(std::move(segment)), rank_(rank), size_(size), timeoutS_(timeoutS) {
  char *base = static_cast<char *>(segment_->base());
  state_ = reinterpret_cast<ShmBarrierState *>(base);
  slots_ = reinterpret_cast<Slot *>(base + slotsOffset());
  areas_ = base + areasOffset(size_);
  slots_[rank_].pid = getpid();
}

void ShmChannel::connect(ControlPlane &control) {
  // Every rank's slot is filled in once every rank has entered this AND.
  std::vector<uint64_t> flag{1};
  control.allreduceAnd(flag);
  std::vector<int> pids(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) pids[static_cast<size_t>(r)] = slots_[r].pid;
  // Spinning before sleeping pays only when every rank has a core of its own.
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  coreEach_ = cores >= size_;
  barrier_ = std::make_unique<ShmBarrier>(state_, rank_, pids, timeoutS_, coreEach_);
  bell_ = std::make_unique<ShmBell>(state_, rank_, size_);
  pids_ = std::move(pids);
}

}  // namespace hora

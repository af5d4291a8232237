// SPDX-License-Identifier: Apache-2.0
#include "core/auto_names.h"

#include <iterator>

#include "base/error.h"

namespace hora {

std::string AutoNames::next(int32_t processSet, OpType op) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t n = counts_[{processSet, static_cast<int>(op)}]++;
  const uint64_t epoch = epochs_[processSet];
  if (epoch == 0) return detail::concat(opTypeName(op), ".noname.", n);
  return detail::concat(opTypeName(op), ".noname.", epoch, ".", n);
}

void AutoNames::newEpoch(int32_t processSet) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = counts_.begin(); it != counts_.end();) {
    it = it->first.first == processSet ? counts_.erase(it) : std::next(it);
  }
  ++epochs_[processSet];
}

}  // namespace hora

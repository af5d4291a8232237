// SPDX-License-Identifier: Apache-2.0
// FusionBuffer: grow in 1 MiB steps, pre-touched.
#include "core/fusion_buffer.h"

#include <cstdlib>
#include <cstring>

#include "base/error.h"

namespace hora {

FusionBuffer::~FusionBuffer() { std::free(data_); }

void *FusionBuffer::get(size_t bytes) {
  if (bytes <= capacity_ && data_ != nullptr) return data_;
  constexpr size_t kStep = size_t{1} << 20;
  const size_t want = (bytes + kStep - 1) / kStep * kStep + (bytes == 0 ? kStep : 0);
  void *fresh = std::aligned_alloc(64, want);
  if (fresh == nullptr) {
    HORA_THROW(HORA_ERR_INTERNAL, "cannot allocate a fusion buffer of ", want, " bytes");
  }
  std::memset(fresh, 0, want);
  std::free(data_);
  data_ = fresh;
  capacity_ = want;
  return data_;
}

}  // namespace hora

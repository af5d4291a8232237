// SPDX-License-Identifier: Apache-2.0
#include "backends/shm/shm_allreduce.h"

namespace hora {

// Reduced where the tensors lie: no packing, nothing allocated per call once the scratch
// buffers have grown.
void ShmAllreduce::run(const std::vector<Backend::Span> &spans, DType dtype, ReduceOp op, double pre,
                       double post) {
  ShmOp o = shmOpOver(spans, dtype, op, pre, post);
  if (o.total == 0) return;  // every rank agrees: the total is part of the response
  table_.assign(spans);
  o.seq = ++seq_;
  const Algorithm algorithm = choose(o.total * static_cast<int64_t>(o.esize), singleCopy_);
  announce(channel_, o, algorithm == Algorithm::kSingleCopy ? CmaAllreduce::published(spans.size()) : 0);
  switch (algorithm) {
    case Algorithm::kEager:
      eager_.run(o, table_);
      return;
    case Algorithm::kSingleCopy:
      if (cma_.run(o, table_)) return;
      pipelined_.run(o, table_, /*checked=*/true);  // some rank had too many tensors to publish
      return;
    case Algorithm::kPipelined:
      pipelined_.run(o, table_, /*checked=*/false);
      return;
  }
}

}  // namespace hora

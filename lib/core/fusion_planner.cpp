// SPDX-License-Identifier: Apache-2.0
// Greedy first-fit fusion over compatible allreduces.
#include "core/fusion_planner.h"

#include <algorithm>

namespace hora {
namespace {

bool fusible(const Response &r) { return r.ok() && r.agreed.op == OpType::kAllreduce; }

bool compatible(const RequestMsg &a, const RequestMsg &b) {
  return a.dtype == b.dtype && a.reduceOp == b.reduceOp && a.prescale == b.prescale &&
         a.postscale == b.postscale && a.device == b.device;
}

}  // namespace

int64_t responseBytes(const Response &response) {
  int64_t n = 0;
  for (const Shape &s : response.agreed.shapes) n += numElements(s);
  return n * static_cast<int64_t>(dtypeSize(response.agreed.dtype));
}

std::vector<FusionGroup> planFusion(const std::vector<Response> &responses, int64_t threshold) {
  std::vector<FusionGroup> groups;
  std::vector<size_t> open;  // indices into groups that may still take members
  for (size_t i = 0; i < responses.size(); ++i) {
    const Response &r = responses[i];
    const int64_t bytes = responseBytes(r);
    if (fusible(r) && bytes < threshold) {
      auto fit = std::find_if(open.begin(), open.end(), [&](size_t g) {
        const Response &first = responses[groups[g].members.front()];
        return compatible(first.agreed, r.agreed) && groups[g].bytes + bytes <= threshold;
      });
      if (fit != open.end()) {
        groups[*fit].members.push_back(i);
        groups[*fit].bytes += bytes;
        continue;
      }
      open.push_back(groups.size());
    }
    groups.push_back(FusionGroup{{i}, bytes});
  }
  return groups;
}

}  // namespace hora

// SPDX-License-Identifier: Apache-2.0
// Greedy first-fit fusion over compatible responses (the op table says which may fuse).
#include "core/fusion_planner.h"

#include <algorithm>

#include "core/op_table.h"

namespace hora {
namespace {

bool fusible(const Response &r) {
  if (!r.ok()) return false;
  switch (opSpec(r.agreed.op).fusion) {
    case OpSpec::Fusion::kAlways: return true;
    case OpSpec::Fusion::kSingleTensor: return r.agreed.shapes.size() == 1;
    case OpSpec::Fusion::kNever: return false;
  }
  return false;
}

bool compatible(const Response &a, const Response &b) {
  const RequestMsg &x = a.agreed, &y = b.agreed;
  if (x.op != y.op || x.dtype != y.dtype || x.device != y.device || a.joined != b.joined) {
    return false;
  }
  if (!opSpec(x.op).reduces) return true;
  return x.reduceOp == y.reduceOp && x.prescale == y.prescale && x.postscale == y.postscale;
}

}  // namespace

int64_t responseBytes(const Response &response) {
  const RequestMsg &m = response.agreed;
  const int64_t esize = static_cast<int64_t>(dtypeSize(m.dtype));
  if (opSpec(m.op).firstDims == OpSpec::FirstDims::kRows && m.shapes.size() == 1 &&
      !m.shapes[0].empty()) {
    // The gathered output: every rank's rows.
    int64_t rows = 0, rowElems = 1;
    for (int64_t r : response.firstDims) rows += r;
    for (size_t d = 1; d < m.shapes[0].size(); ++d) rowElems *= m.shapes[0][d];
    return rows * rowElems * esize;
  }
  int64_t n = 0;
  for (const Shape &s : m.shapes) n += numElements(s);
  return n * esize;
}

std::vector<FusionGroup> planFusion(const std::vector<Response> &responses, int64_t threshold) {
  std::vector<const Response *> all;
  all.reserve(responses.size());
  for (const Response &r : responses) all.push_back(&r);
  return planFusion(all, threshold);
}

std::vector<FusionGroup> planFusion(const std::vector<const Response *> &responses, int64_t threshold) {
  std::vector<FusionGroup> groups;
  std::vector<size_t> open;  // indices into groups that may still take members
  for (size_t i = 0; i < responses.size(); ++i) {
    const Response &r = *responses[i];
    const int64_t bytes = responseBytes(r);
    if (fusible(r) && bytes < threshold) {
      auto fit = std::find_if(open.begin(), open.end(), [&](size_t g) {
        const Response &first = *responses[groups[g].members.front()];
        return compatible(first, r) && groups[g].bytes + bytes <= threshold;
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

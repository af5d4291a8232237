// SPDX-License-Identifier: Apache-2.0
// Small helpers the algorithm families share (private to core/collectives).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace hora::collectives {

inline int mod(int a, int n) { return ((a % n) + n) % n; }

inline uint8_t *at(void *base, int64_t elems, size_t esize) {
  return static_cast<uint8_t *>(base) + static_cast<size_t>(elems) * esize;
}

inline uint8_t *grow(std::vector<uint8_t> &scratch, size_t bytes) {
  if (scratch.size() < std::max<size_t>(1, bytes)) scratch.resize(std::max<size_t>(1, bytes));
  return scratch.data();
}

// Offsets of blocks laid end to end: out[r] = sizes[0] + ... + sizes[r-1]; out[n] = the total.
inline std::vector<int64_t> offsetsOf(const std::vector<int64_t> &sizes) {
  std::vector<int64_t> out(sizes.size() + 1, 0);
  for (size_t r = 0; r < sizes.size(); ++r) out[r + 1] = out[r] + sizes[r];
  return out;
}

// A binomial tree rooted at `root` over n ranks: r's parent (-1 at the root) and its children,
// nearest subtree last.
void binomialTree(int n, int r, int root, int *parent, std::vector<int> *children);

}  // namespace hora::collectives

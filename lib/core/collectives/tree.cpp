// SPDX-License-Identifier: Apache-2.0
// The tree family: a binomial tree or a chunked chain from a root, and the control plane's
// blobs (gathered to rank 0, broadcast from it down a binomial tree).
#include "core/collectives/algorithms.h"
#include "core/collectives/common.h"

namespace hora::collectives {

void binomialTree(int n, int r, int root, int *parent, std::vector<int> *children) {
  const int vr = mod(r - root, n);
  int mask = 1;
  *parent = -1;
  while (mask < n) {
    if (vr & mask) {
      *parent = mod(vr - mask + root, n);
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (vr + mask < n) children->push_back(mod(vr + mask + root, n));
  }
}

// log2(P) rounds; each rank forwards the whole buffer to its children once it has it.
void binomialBroadcast(Link &link, const Call &call) {
  int parent;
  std::vector<int> children;
  binomialTree(link.size(), link.rank(), call.root, &parent, &children);
  if (parent >= 0) {
    Transfers t(link);
    t.recv(parent, call.buf, call.bytes);
    t.waitAll();
  }
  Transfers t(link);
  for (int child : children) t.send(child, call.buf, call.bytes);
  t.waitAll();
}

// A chain in rank order from the root, in chunks of the link's chunkBytes; each chunk is passed
// on as soon as it has arrived, so every hop streams at once.
void chainBroadcast(Link &link, const Call &call) {
  const int n = link.size(), r = link.rank();
  const size_t chunk = std::max<size_t>(1, link.tuning().chunkBytes);
  const size_t k = (call.bytes + chunk - 1) / chunk;
  const int vr = mod(r - call.root, n);
  auto *data = static_cast<uint8_t *>(call.buf);
  auto length = [&](size_t j) { return std::min(chunk, call.bytes - j * chunk); };
  Transfers recvs(link), sends(link);
  if (vr > 0) {
    for (size_t j = 0; j < k; ++j) recvs.recv(mod(r - 1, n), data + j * chunk, length(j));
  }
  for (size_t j = 0; j < k; ++j) {
    if (vr > 0) recvs.waitOne(j);
    if (vr + 1 < n) sends.send(mod(r + 1, n), data + j * chunk, length(j));
  }
  sends.waitAll();
}

std::vector<std::string> gatherBlobs(Link &link, const std::string &blob) {
  if (link.rank() != 0) {
    link.sendBlob({0}, blob);
    return {};
  }
  std::vector<std::string> out(static_cast<size_t>(link.size()));
  out[0] = blob;
  for (int r = 1; r < link.size(); ++r) out[static_cast<size_t>(r)] = link.recvBlob(r);
  return out;
}

void broadcastBlob(Link &link, std::string &blob) {
  int parent;
  std::vector<int> children;
  binomialTree(link.size(), link.rank(), 0, &parent, &children);
  if (parent >= 0) blob = link.recvBlob(parent);
  link.sendBlob(children, blob);
}

}  // namespace hora::collectives

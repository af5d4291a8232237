// SPDX-License-Identifier: Apache-2.0
// Cross-memory attach (process_vm_readv): a rank reads another process's memory directly, the
// kernel copying page by page, so a peer's tensor needs no staging copy through shared memory.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hora {
namespace cma {

// A list of address ranges consumed front to back, possibly part of an entry at a time.
class IovList {
 public:
  void clear() {
    iov_.clear();
    at_ = 0;
    skip_ = 0;
  }
  void add(const void *base, size_t bytes) {
    if (bytes != 0) iov_.push_back({const_cast<void *>(base), bytes});
  }
  bool empty() const { return at_ == iov_.size(); }
  size_t bytes() const;
  // Up to `max` entries from the front, the first one trimmed by what was already consumed.
  size_t front(iovec *out, size_t max) const;
  void consume(size_t bytes);

 private:
  std::vector<iovec> iov_;
  size_t at_ = 0;    // first entry not wholly consumed
  size_t skip_ = 0;  // bytes of it already consumed
};

// Copies `remote` (ranges in process `pid`) into `local`, in order; the two lists hold the same
// number of bytes. Throws Error(HORA_ERR_PEER_LOST) when the process is gone, naming `rank` and
// `what`, and Error(HORA_ERR_BACKEND) for any other failure.
void read(int pid, int rank, IovList &local, IovList &remote, const char *what);

// Whether this process may read process `pid`'s memory: reads the 8 bytes at `addr` there and
// compares them with `expect`. On false, *why says what stopped it (ptrace_scope, a seccomp
// filter, another user...).
bool canRead(int pid, uint64_t addr, uint64_t expect, std::string *why);

}  // namespace cma
}  // namespace hora

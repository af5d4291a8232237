// SPDX-License-Identifier: Apache-2.0
#include "backends/shm/cma.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "base/error.h"

namespace hora {
namespace cma {
namespace {
constexpr size_t kMaxIov = IOV_MAX;  // per side and call (1024 on Linux)
}  // namespace

size_t IovList::bytes() const {
  size_t n = 0;
  for (size_t i = at_; i < iov_.size(); ++i) n += iov_[i].iov_len;
  return n - skip_;
}

size_t IovList::front(iovec *out, size_t max) const {
  size_t n = 0;
  for (size_t i = at_; i < iov_.size() && n < max; ++i, ++n) out[n] = iov_[i];
  if (n != 0) {
    out[0].iov_base = static_cast<char *>(out[0].iov_base) + skip_;
    out[0].iov_len -= skip_;
  }
  return n;
}

void IovList::consume(size_t bytes) {
  while (bytes != 0 && at_ < iov_.size()) {
    const size_t left = iov_[at_].iov_len - skip_;
    if (bytes < left) {
      skip_ += bytes;
      return;
    }
    bytes -= left;
    ++at_;
    skip_ = 0;
  }
}

void read(int pid, int rank, IovList &local, IovList &remote, const char *what) {
  iovec l[kMaxIov], r[kMaxIov];
  while (!local.empty() && !remote.empty()) {
    const size_t nl = local.front(l, kMaxIov), nr = remote.front(r, kMaxIov);
    const ssize_t got = process_vm_readv(pid, l, nl, r, nr, 0);
    if (got > 0) {
      local.consume(static_cast<size_t>(got));
      remote.consume(static_cast<size_t>(got));
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && errno == ESRCH) {
      HORA_THROW(HORA_ERR_PEER_LOST, "shared-memory ", what, ": rank ", rank, " (pid ", pid,
                 ") has exited");
    }
    HORA_THROW(HORA_ERR_BACKEND, "shared-memory ", what, ": process_vm_readv from rank ", rank,
               " (pid ", pid, ") failed: ", got < 0 ? std::strerror(errno) : "nothing copied");
  }
}

bool canRead(int pid, uint64_t addr, uint64_t expect, std::string *why) {
  uint64_t value = 0;
  iovec l{&value, sizeof value};
  iovec r{reinterpret_cast<void *>(addr), sizeof value};
  const ssize_t got = process_vm_readv(pid, &l, 1, &r, 1, 0);
  if (got != static_cast<ssize_t>(sizeof value)) {
    *why = detail::concat("process_vm_readv from pid ", pid, ": ",
                          got < 0 ? std::strerror(errno) : "short read",
                          got < 0 && errno == EPERM
                              ? " (kernel.yama.ptrace_scope, or a container without CAP_SYS_PTRACE)"
                              : "");
    return false;
  }
  if (value != expect) {
    *why = detail::concat("process_vm_readv from pid ", pid, " read the wrong bytes");
    return false;
  }
  return true;
}

}  // namespace cma
}  // namespace hora

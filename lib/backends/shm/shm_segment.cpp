// SPDX-License-Identifier: Apache-2.0
#include "backends/shm/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "base/error.h"

namespace hora {
namespace {

std::string errnoText(const char *what) { return detail::concat(what, ": ", std::strerror(errno)); }

// MAP_POPULATE: every page is mapped into this process now, not at its first touch in an
// allreduce (a fault costs about 11 us per 4 KiB page on this machine class).
void *mapSegment(int fd, size_t bytes, std::string *why) {
  void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    *why = errnoText("mmap");
    return nullptr;
  }
  return p;
}

// Rank 0: a fresh segment of `bytes` zeroed bytes; returns its name, or "" with *why set.
std::string createNamed(size_t bytes, void **base, std::string *why) {
  std::random_device entropy;
  const std::string name = detail::concat("/hora-", getpid(), "-", entropy() & 0xffffffu);
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    *why = errnoText(("shm_open " + name).c_str());
    return "";
  }
  std::string result = name;
  // posix_fallocate, not ftruncate: a /dev/shm too small fails here with a message, where a
  // sparse file would kill a rank with SIGBUS at some later first touch.
  if (const int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
    *why = detail::concat("posix_fallocate of ", bytes, " bytes in /dev/shm: ", std::strerror(err));
    result.clear();
  } else if ((*base = mapSegment(fd, bytes, why)) == nullptr) {
    result.clear();
  }
  close(fd);
  if (result.empty()) shm_unlink(name.c_str());
  return result;
}

}  // namespace

std::unique_ptr<ShmSegment> ShmSegment::create(ControlPlane &control, size_t bytes,
                                               std::string *why) {
  void *base = nullptr;
  std::string name;
  std::string failure;
  if (control.rank() == 0) {
    name = createNamed(bytes, &base, &failure);
    if (name.empty()) name = "!" + failure;  // tell the others why
  }
  control.broadcastFromRoot(name);
  if (control.rank() != 0) {
    if (name.empty() || name[0] == '!') {
      failure = name.empty() ? "rank 0 sent no segment name" : name.substr(1);
    } else {
      const int fd = shm_open(name.c_str(), O_RDWR, 0600);
      if (fd < 0) {
        failure = errnoText(("shm_open " + name).c_str());
      } else {
        base = mapSegment(fd, bytes, &failure);
        close(fd);
      }
    }
  }
  std::vector<uint64_t> ok{base != nullptr ? 1u : 0u};
  control.allreduceAnd(ok);
  if (control.rank() == 0 && base != nullptr) shm_unlink(name.c_str());
  if (ok[0] == 0) {
    if (base != nullptr) munmap(base, bytes);
    *why = failure.empty() ? "another rank could not map the shared segment" : failure;
    return nullptr;
  }
  return std::unique_ptr<ShmSegment>(new ShmSegment(base, bytes));
}

ShmSegment::~ShmSegment() { munmap(base_, bytes_); }

}  // namespace hora

// SPDX-License-Identifier: Apache-2.0
#include "backends/shm/shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>

#include "base/error.h"
#include "base/logging.h"
#include "base/process.h"
#include "base/test_points.h"

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

// Removes the segment's name when the agreement is over, however it ends: every rank has it
// mapped, one rank could not, or a peer was lost in the middle (an exception). The name is what
// keeps a segment alive in /dev/shm; a mapping goes with its process.
class NameGuard {
 public:
  NameGuard() = default;
  ~NameGuard() { release(); }
  NameGuard(const NameGuard &) = delete;
  NameGuard &operator=(const NameGuard &) = delete;
  void hold(const std::string &name) { name_ = name; }
  void release() {
    if (!name_.empty()) shm_unlink(name_.c_str());
    name_.clear();
  }

 private:
  std::string name_;
};

// "/hora-<pid>-<random>": the pid of the rank that created it.
long creatorOf(const char *entry) {
  if (std::strncmp(entry, "hora-", 5) != 0) return 0;
  char *end = nullptr;
  const long pid = std::strtol(entry + 5, &end, 10);
  return end != entry + 5 && *end == '-' ? pid : 0;
}

}  // namespace

size_t removeStaleSegments(const std::string &dir, std::chrono::seconds minAge) {
  DIR *d = opendir(dir.c_str());
  if (d == nullptr) return 0;
  size_t removed = 0;
  const auto now = std::chrono::system_clock::now();
  while (dirent *entry = readdir(d)) {
    const long pid = creatorOf(entry->d_name);
    if (pid <= 0 || !processGone(pid)) continue;
    struct stat st {};
    const std::string path = dir + "/" + entry->d_name;
    if (stat(path.c_str(), &st) != 0) continue;
    const auto changed = std::chrono::system_clock::from_time_t(st.st_mtime);
    if (now - changed < minAge) continue;
    if (shm_unlink((std::string("/") + entry->d_name).c_str()) == 0) ++removed;
  }
  closedir(d);
  return removed;
}

std::unique_ptr<ShmSegment> ShmSegment::create(ControlPlane &control, size_t bytes,
                                               std::string *why) {
  void *base = nullptr;
  std::string name;
  std::string failure;
  // Rank 0 unlinks the name as soon as the agreement below ends, and every other rank unlinks
  // it if the agreement ends in an exception (rank 0 may be the rank that was lost). A creator
  // killed between shm_open and the unlink leaves its segment behind: the next creator on this
  // host removes such segments (their creator gone, a minute old).
  NameGuard guard;
  if (control.rank() == 0) {
    if (const size_t stale = removeStaleSegments("/dev/shm", std::chrono::seconds(60)); stale > 0) {
      HORA_LOG(kInfo) << "removed " << stale << " shared-memory segment" << (stale == 1 ? "" : "s")
                      << " left in /dev/shm by hora processes that died while setting one up";
    }
    name = createNamed(bytes, &base, &failure);
    if (name.empty()) {
      name = "!" + failure;  // tell the others why
    } else {
      guard.hold(name);
    }
  }
  control.broadcastFromRoot(name);
  if (control.rank() != 0) {
    if (name.empty() || name[0] == '!') {
      failure = name.empty() ? "rank 0 sent no segment name" : name.substr(1);
    } else {
      guard.hold(name);
      testPoint("shm-open", control.rank());
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
  try {
    control.allreduceAnd(ok);
  } catch (...) {
    if (base != nullptr) munmap(base, bytes);
    throw;  // the guard unlinks the name, on every rank that knows it
  }
  if (control.rank() == 0) {
    guard.release();
  } else {
    guard.hold("");  // rank 0 unlinks it; unlinked here early, a slower rank could not open it
  }
  if (ok[0] == 0) {
    if (base != nullptr) munmap(base, bytes);
    *why = failure.empty() ? "another rank could not map the shared segment" : failure;
    return nullptr;
  }
  return std::unique_ptr<ShmSegment>(new ShmSegment(base, bytes));
}

ShmSegment::~ShmSegment() { munmap(base_, bytes_); }

}  // namespace hora

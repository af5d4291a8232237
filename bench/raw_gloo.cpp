// SPDX-License-Identifier: Apache-2.0
// The raw Gloo column (raw_gloo.h).

#include "raw_gloo.h"

#include "world.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#if HORA_BENCH_GLOO
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#endif

namespace hora::bench {

#if HORA_BENCH_GLOO

struct RawGloo::Impl {
  static constexpr std::chrono::milliseconds kTimeout{600 * 1000};
  std::shared_ptr<gloo::Context> context;
  uint32_t tag = 0;
  std::string address;

  uint32_t nextTag() { return tag++ & 0xffffffu; }

  template <typename F>
  void call(const char *what, F &&f) {
    try {
      f();
    } catch (const std::exception &e) {
      failHere(std::string(what) + " failed: " + e.what());
    }
  }

  template <typename T>
  void allreduceAs(const void *in, void *out, int64_t count, ReduceFn fn) {
    call("gloo::allreduce", [&] {
      gloo::AllreduceOptions o(context);
      if (in != out)  // in place: the output alone
        o.setInput(static_cast<T *>(const_cast<void *>(in)), static_cast<size_t>(count));
      o.setOutput(static_cast<T *>(out), static_cast<size_t>(count));
      o.setReduceFunction(fn);
      o.setTag(nextTag());
      o.setTimeout(kTimeout);
      gloo::allreduce(o);
    });
  }
};

namespace {
uint8_t *bytePtr(const void *p) { return static_cast<uint8_t *>(const_cast<void *>(p)); }
}  // namespace

RawGloo::RawGloo() : impl_(new Impl) {}
RawGloo::~RawGloo() = default;

const std::string &RawGloo::address() const { return impl_->address; }

std::unique_ptr<RawGloo> RawGloo::connect(int rank, const std::vector<RankInfo> &ranks,
                                          std::string *whyNot) {
  // Rank 0 makes the directory and a marker in it; every rank must see the marker.
  std::string dir;
  if (rank == 0) {
    const char *tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/hora-bench-gloo-XXXXXX";
    if (!mkdtemp(pattern.data())) {
      dir = "!mkdtemp(" + pattern + "): " + std::strerror(errno);
    } else {
      dir = pattern;
      std::ofstream(dir + "/marker") << ranks[0].host << " " << ranks[0].pid << "\n";
    }
  }
  broadcastString(&dir);
  if (!dir.empty() && dir[0] == '!') {
    *whyNot = dir.substr(1);
    return nullptr;
  }
  std::error_code ec;
  const bool sees = std::filesystem::exists(dir + "/marker", ec);
  const int64_t blind = sumOverRanks(static_cast<int64_t>(!sees));
  auto cleanUp = [&] {
    if (rank == 0) std::filesystem::remove_all(dir, ec);
  };
  if (blind) {
    cleanUp();
    *whyNot = std::to_string(blind) + " rank(s) cannot see rank 0's rendezvous directory " + dir +
              " (its FileStore needs one directory that every rank sees)";
    return nullptr;
  }
  auto gloo = std::unique_ptr<RawGloo>(new RawGloo);
  gloo->impl_->address = listenAddress(ranks);
  std::string error;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = gloo->impl_->address;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, static_cast<int>(ranks.size()));
    context->setTimeout(Impl::kTimeout);
    gloo::rendezvous::FileStore store(dir);
    context->connectFullMesh(store, device);
    gloo->impl_->context = context;
  } catch (const std::exception &e) {
    error = e.what();
  }
  const int64_t failed = sumOverRanks(static_cast<int64_t>(!error.empty()));
  cleanUp();  // every rank is past the rendezvous: the store's files have done their work
  if (failed) {
    *whyNot = error.empty() ? "connecting its mesh failed on another rank"
                            : "connecting its mesh failed: " + error;
    return nullptr;
  }
  return gloo;
}

void RawGloo::allreduce(const void *in, void *out, int64_t count, int esize, ReduceFn fn) {
  switch (esize) {
    case 1: impl_->allreduceAs<uint8_t>(in, out, count, fn); break;
    case 2: impl_->allreduceAs<uint16_t>(in, out, count, fn); break;
    case 4: impl_->allreduceAs<uint32_t>(in, out, count, fn); break;
    default: impl_->allreduceAs<uint64_t>(in, out, count, fn); break;
  }
}

void RawGloo::allgather(const void *in, void *out, int64_t bytesPerRank) {
  impl_->call("gloo::allgather", [&] {
    gloo::AllgatherOptions o(impl_->context);
    o.setInput(bytePtr(in), static_cast<size_t>(bytesPerRank));
    o.setOutput(static_cast<uint8_t *>(out),
                static_cast<size_t>(bytesPerRank) * impl_->context->size);
    o.setTag(impl_->nextTag());
    o.setTimeout(Impl::kTimeout);
    gloo::allgather(o);
  });
}

void RawGloo::broadcast(void *buf, int64_t bytes, int root) {
  impl_->call("gloo::broadcast", [&] {
    gloo::BroadcastOptions o(impl_->context);
    o.setOutput(static_cast<uint8_t *>(buf), static_cast<size_t>(bytes));
    o.setRoot(root);
    o.setTag(impl_->nextTag());
    o.setTimeout(Impl::kTimeout);
    gloo::broadcast(o);
  });
}

void RawGloo::alltoall(const void *in, void *out, int64_t bytes) {
  impl_->call("gloo::alltoall", [&] {
    gloo::AlltoallOptions o(impl_->context);
    o.setInput(bytePtr(in), static_cast<size_t>(bytes));
    o.setOutput(static_cast<uint8_t *>(out), static_cast<size_t>(bytes));
    o.setTag(impl_->nextTag());
    o.setTimeout(Impl::kTimeout);
    gloo::alltoall(o);
  });
}

#else  // built without Gloo: connect() says so and nothing else is ever called

struct RawGloo::Impl {
  std::string address;
};
RawGloo::RawGloo() : impl_(new Impl) {}
RawGloo::~RawGloo() = default;
const std::string &RawGloo::address() const { return impl_->address; }
std::unique_ptr<RawGloo> RawGloo::connect(int, const std::vector<RankInfo> &ranks,
                                          std::string *whyNot) {
  (void)ranks;
  *whyNot = "this build has no Gloo (meson found no libgloo-dev)";
  return nullptr;
}
void RawGloo::allreduce(const void *, void *, int64_t, int, ReduceFn) {}
void RawGloo::allgather(const void *, void *, int64_t) {}
void RawGloo::broadcast(void *, int64_t, int) {}
void RawGloo::alltoall(const void *, void *, int64_t) {}

#endif

}  // namespace hora::bench

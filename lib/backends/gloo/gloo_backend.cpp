// SPDX-License-Identifier: Apache-2.0
// GlooBackend: hora's collectives on Gloo's algorithms over TCP pairs.
#include "backends/gloo/gloo_backend.h"

#include <unistd.h>

#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/broadcast.h>

#include <algorithm>
#include <cstring>

#include "bootstrap/env/auth.h"
#include "bootstrap/env/gloo_group.h"
#include "bootstrap/env/env_bootstrap.h"
#include "bootstrap/env/tcp_store.h"
#include "core/kernels.h"

namespace hora {
namespace {

std::chrono::milliseconds toMs(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

// Gloo calls reduce(c, a, b, n) with c = a op b; hora's vectorised kernels do dst op= src.
gloo::AllreduceOptions::Func reduceFunction(DType dtype, ReduceOp op) {
  return [dtype, op](void *c, const void *a, const void *b, size_t n) {  // n: elements
    const size_t bytes = n * dtypeSize(dtype);
    if (c == b) {
      reduceInto(c, a, static_cast<int64_t>(n), dtype, op);  // every op here is commutative
      return;
    }
    if (c != a) std::memmove(c, a, bytes);
    reduceInto(c, b, static_cast<int64_t>(n), dtype, op);
  };
}

class GlooBackend final : public Backend {
 public:
  GlooBackend(std::shared_ptr<gloo::Context> context, double timeoutS,
              std::unique_ptr<TcpStoreServer> server, std::unique_ptr<GlooGroup> ownGroup)
      : server_(std::move(server)),
        ownGroup_(std::move(ownGroup)),
        context_(std::move(context)),
        timeout_(toMs(timeoutS)) {}

  const char *name() const override { return "gloo"; }
  const BackendCaps &caps() const override {
    static const BackendCaps kCaps =
        BackendCaps::plain(/*usesSockets=*/true, BackendCaps::Scope::kAnyHost);
    return kCaps;
  }

  void allreduce(const void *in, void *out, int64_t count, DType dtype, ReduceOp op) override {
    if (count == 0) return;
    if (dtype == DType::kBool) {
      normalizeBools(out, in, count);  // a set of one reduces nothing, yet its result is 0 or 1
    } else if (in != out) {
      std::memcpy(out, in, static_cast<size_t>(count) * dtypeSize(dtype));
    }
    if (context_->size == 1) return;
    glooCall("allreduce", context_->rank, [&] {
      gloo::AllreduceOptions opts(context_);
      // Gloo sizes segments and calls the reduce function in elements of the pointer's type;
      // a type of the element's width keeps both whole-element (the function knows the dtype).
      switch (dtypeSize(dtype)) {
        case 1: opts.setOutput(static_cast<uint8_t *>(out), static_cast<size_t>(count)); break;
        case 2: opts.setOutput(static_cast<uint16_t *>(out), static_cast<size_t>(count)); break;
        case 4: opts.setOutput(static_cast<uint32_t *>(out), static_cast<size_t>(count)); break;
        default: opts.setOutput(static_cast<uint64_t *>(out), static_cast<size_t>(count)); break;
      }
      opts.setReduceFunction(reduceFunction(dtype, op));
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
    });
  }

  void broadcast(void *buf, int64_t bytes, int root) override {
    if (bytes == 0 || context_->size == 1) return;
    glooCall("broadcast", context_->rank, [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setRoot(root);
      opts.setOutput(static_cast<uint8_t *>(buf), static_cast<size_t>(bytes));
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
  }

  void allgatherv(const void *in, void *out, const std::vector<int64_t> &bytesPerRank) override {
    size_t total = 0;
    std::vector<size_t> counts;
    for (int64_t b : bytesPerRank) {
      counts.push_back(static_cast<size_t>(b));
      total += static_cast<size_t>(b);
    }
    if (total == 0) return;
    const size_t mine = counts[static_cast<size_t>(context_->rank)];
    if (context_->size == 1) {
      if (out != in) std::memmove(out, in, mine);
      return;
    }
    uint8_t dummy = 0;
    glooCall("allgatherv", context_->rank, [&] {
      gloo::AllgathervOptions opts(context_);
      opts.setInput(mine ? static_cast<uint8_t *>(const_cast<void *>(in)) : &dummy, mine);
      opts.setOutput(static_cast<uint8_t *>(out), counts);
      opts.setTimeout(timeout_);
      gloo::allgatherv(opts);
    });
  }

  void alltoallv(const void *in, const std::vector<int64_t> &sendBytes, void *out,
                 const std::vector<int64_t> &recvBytes) override {
    int64_t sendTotal = 0, recvTotal = 0;
    for (int64_t b : sendBytes) sendTotal += b;
    for (int64_t b : recvBytes) recvTotal += b;
    if (context_->size == 1) {
      if (sendTotal > 0 && out != in) std::memmove(out, in, static_cast<size_t>(sendTotal));
      return;
    }
    uint8_t dummyIn = 0, dummyOut = 0;
    glooCall("alltoallv", context_->rank, [&] {
      gloo::AlltoallvOptions opts(context_);
      opts.setInput(sendTotal ? static_cast<uint8_t *>(const_cast<void *>(in)) : &dummyIn, sendBytes);
      opts.setOutput(recvTotal ? static_cast<uint8_t *>(out) : &dummyOut, recvBytes);
      opts.setTimeout(timeout_);
      gloo::alltoallv(opts);
    });
  }

  // Gloo has no reduce-scatter for arbitrary blocks: reduce everything, keep this rank's block.
  // Twice the traffic of a true reduce-scatter; fine for a CPU fallback.
  void reducescatter(const void *in, void *out, const std::vector<int64_t> &counts, DType dtype,
                     ReduceOp op) override {
    int64_t total = 0, before = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
      if (static_cast<int>(r) < context_->rank) before += counts[r];
      total += counts[r];
    }
    const size_t esize = dtypeSize(dtype);
    scratch_.resize(static_cast<size_t>(total) * esize + 1);
    allreduce(in, scratch_.data(), total, dtype, op);
    const int64_t mine = counts[static_cast<size_t>(context_->rank)];
    if (mine > 0) {
      std::memcpy(out, scratch_.data() + static_cast<size_t>(before) * esize,
                  static_cast<size_t>(mine) * esize);
    }
  }

 private:
  std::unique_ptr<TcpStoreServer> server_;  // rank 0 of a Gloo context built over MPI
  std::unique_ptr<GlooGroup> ownGroup_;
  std::shared_ptr<gloo::Context> context_;
  std::chrono::milliseconds timeout_;
  std::vector<uint8_t> scratch_;
};

std::string hostAddress() {
  char name[256] = {0};
  gethostname(name, sizeof name - 1);
  return name;
}

}  // namespace

std::unique_ptr<Backend> createGlooBackend(Group &group, double timeoutS) {
  if (auto *gloo = dynamic_cast<GlooGroup *>(&group)) {
    return std::make_unique<GlooBackend>(gloo->context(), timeoutS, nullptr, nullptr);
  }
  // Another transport formed this group (MPI): stand up a store on set rank 0 and tell the
  // others where it is, and a fresh job token for it, through the group's own control plane,
  // which the launcher already protects. Only this group's ranks can then join the store or the
  // mesh, whatever else reaches the port.
  std::unique_ptr<TcpStoreServer> server;
  std::string where;
  if (group.rank() == 0) {
    StoreServerOptions options;
    options.token = hexOf(randomBytes(32));
    options.maxConnections = 4 * static_cast<size_t>(group.size()) + 64;
    options.idleTimeoutS = std::min(10.0, std::max(1.0, timeoutS));
    server = std::make_unique<TcpStoreServer>("", 0, options);
    where = options.token + " " + hostAddress() + ":" + std::to_string(server->port());
  }
  group.control().broadcastFromRoot(where);
  const size_t space = where.find(' ');
  const std::string token = where.substr(0, space);
  const std::string address = where.substr(space + 1);
  const size_t colon = address.rfind(':');
  const std::string host = address.substr(0, colon);
  const int port = std::stoi(address.substr(colon + 1));
  auto store = std::make_shared<TcpStoreClient>(host, port, timeoutS, StoreClientOptions{token, ""});
  auto own = std::make_unique<GlooGroup>(store, "gloo/", group.rank(), group.size(),
                                         routeAddressTo(host, port), timeoutS);
  std::shared_ptr<gloo::Context> context = own->context();
  return std::make_unique<GlooBackend>(context, timeoutS, std::move(server), std::move(own));
}

}  // namespace hora

// SPDX-License-Identifier: Apache-2.0
// GlooBackend: hora's collectives on Gloo's algorithms over TCP pairs.
#include "backends/gloo/gloo_backend.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "bootstrap/env/auth.h"
#include "bootstrap/env/gloo_group.h"
#include "bootstrap/env/env_bootstrap.h"
#include "bootstrap/env/tcp_store.h"
#include "core/kernels.h"

namespace hora {
namespace {

// The mesh's reductions are dst op= src, which is what hora's vectorised kernels do.
GlooMesh::Reduce reduceFunction(DType dtype, ReduceOp op) {
  return [dtype, op](void *dst, const void *src, size_t n) {
    reduceInto(dst, src, static_cast<int64_t>(n), dtype, op);
  };
}

std::vector<size_t> unsignedSizes(const std::vector<int64_t> &sizes) {
  std::vector<size_t> out;
  out.reserve(sizes.size());
  for (int64_t b : sizes) out.push_back(static_cast<size_t>(b));
  return out;
}

// Every collective runs on the group's GlooMesh (synchronous pairs, driven by the engine thread;
// see bootstrap/env/gloo_group.h for why not Gloo's own algorithms).
class GlooBackend final : public Backend {
 public:
  GlooBackend(std::shared_ptr<GlooMesh> mesh, std::unique_ptr<TcpStoreServer> server,
              std::unique_ptr<GlooGroup> ownGroup)
      : server_(std::move(server)), ownGroup_(std::move(ownGroup)), mesh_(std::move(mesh)) {}

  const char *name() const override { return "gloo"; }
  void interrupt(const Status &why) override { mesh_->interrupt(why); }
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
    if (mesh_->size() == 1) return;
    glooCall("allreduce", mesh_->rank(), [&] {
      mesh_->allreduce(out, static_cast<size_t>(count), dtypeSize(dtype), reduceFunction(dtype, op));
    });
  }

  void broadcast(void *buf, int64_t bytes, int root) override {
    if (bytes == 0 || mesh_->size() == 1) return;
    glooCall("broadcast", mesh_->rank(),
             [&] { mesh_->broadcast(buf, static_cast<size_t>(bytes), root); });
  }

  void allgatherv(const void *in, void *out, const std::vector<int64_t> &bytesPerRank) override {
    const std::vector<size_t> counts = unsignedSizes(bytesPerRank);
    size_t total = 0;
    for (size_t b : counts) total += b;
    if (total == 0) return;
    if (mesh_->size() == 1) {
      if (out != in) std::memmove(out, in, counts[0]);
      return;
    }
    glooCall("allgatherv", mesh_->rank(), [&] { mesh_->allgatherv(in, out, counts); });
  }

  void alltoallv(const void *in, const std::vector<int64_t> &sendBytes, void *out,
                 const std::vector<int64_t> &recvBytes) override {
    int64_t sendTotal = 0;
    for (int64_t b : sendBytes) sendTotal += b;
    if (mesh_->size() == 1) {
      if (sendTotal > 0 && out != in) std::memmove(out, in, static_cast<size_t>(sendTotal));
      return;
    }
    glooCall("alltoallv", mesh_->rank(), [&] {
      mesh_->alltoallv(in, unsignedSizes(sendBytes), out, unsignedSizes(recvBytes));
    });
  }

  // Reduce everything, keep this rank's block: twice the traffic of a true reduce-scatter;
  // fine for a CPU fallback.
  void reducescatter(const void *in, void *out, const std::vector<int64_t> &counts, DType dtype,
                     ReduceOp op) override {
    int64_t total = 0, before = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
      if (static_cast<int>(r) < mesh_->rank()) before += counts[r];
      total += counts[r];
    }
    const size_t esize = dtypeSize(dtype);
    scratch_.resize(static_cast<size_t>(total) * esize + 1);
    allreduce(in, scratch_.data(), total, dtype, op);
    const int64_t mine = counts[static_cast<size_t>(mesh_->rank())];
    if (mine > 0) {
      std::memcpy(out, scratch_.data() + static_cast<size_t>(before) * esize,
                  static_cast<size_t>(mine) * esize);
    }
  }

 private:
  std::unique_ptr<TcpStoreServer> server_;  // rank 0 of a Gloo mesh built over MPI
  std::unique_ptr<GlooGroup> ownGroup_;
  std::shared_ptr<GlooMesh> mesh_;
  std::vector<uint8_t> scratch_;
};

std::string hostAddress() {
  char name[256] = {0};
  gethostname(name, sizeof name - 1);
  return name;
}

}  // namespace

std::unique_ptr<Backend> createGlooBackend(Group &group, const Knobs &knobs) {
  const double timeoutS = knobs.timeoutS;
  if (auto *gloo = dynamic_cast<GlooGroup *>(&group)) {
    return std::make_unique<GlooBackend>(gloo->mesh(), nullptr, nullptr);
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
                                         routeAddressTo(host, port), timeoutS, nullptr);
  std::shared_ptr<GlooMesh> mesh = own->mesh();
  return std::make_unique<GlooBackend>(std::move(mesh), std::move(server), std::move(own));
}

}  // namespace hora

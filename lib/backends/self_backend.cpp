// SPDX-License-Identifier: Apache-2.0
// The world-of-one backend: every collective over one rank is a copy.
#include <cstring>

#include "backends/registry.h"
#include "core/kernels.h"

namespace hora {
namespace {

class SelfBackend final : public Backend {
 public:
  const char *name() const override { return "self"; }
  const BackendCaps &caps() const override {
    static const BackendCaps kCaps =
        BackendCaps::plain(/*usesSockets=*/false, BackendCaps::Scope::kOneHost);
    return kCaps;
  }
  void allreduce(const void *in, void *out, int64_t count, DType dtype, ReduceOp) override {
    reduceOne(in, out, count, dtype);
  }
  void broadcast(void *, int64_t, int) override {}
  void allgatherv(const void *in, void *out, const std::vector<int64_t> &bytesPerRank) override {
    copy(out, in, static_cast<size_t>(bytesPerRank.at(0)));
  }
  void alltoallv(const void *in, const std::vector<int64_t> &sendBytes, void *out,
                 const std::vector<int64_t> &) override {
    copy(out, in, static_cast<size_t>(sendBytes.at(0)));
  }
  void reducescatter(const void *in, void *out, const std::vector<int64_t> &counts, DType dtype,
                     ReduceOp) override {
    reduceOne(in, out, counts.at(0), dtype);
  }

 private:
  // A reduction over one rank: the input itself, bool as 0 or 1 as on every other backend.
  static void reduceOne(const void *in, void *out, int64_t count, DType dtype) {
    if (dtype == DType::kBool) {
      normalizeBools(out, in, count);
    } else {
      copy(out, in, static_cast<size_t>(count) * dtypeSize(dtype));
    }
  }
  static void copy(void *dst, const void *src, size_t n) {
    if (n != 0 && dst != src) std::memmove(dst, src, n);
  }
};

}  // namespace

std::unique_ptr<Backend> createSelfBackend() { return std::make_unique<SelfBackend>(); }

}  // namespace hora

// SPDX-License-Identifier: Apache-2.0
// The raw Gloo column: Gloo's own collectives over its own TCP mesh, as a Gloo user calls them
// (blocking), a baseline for what another CPU library does on the same machines. Built only
// where meson found Gloo (HORA_BENCH_GLOO); elsewhere connect() says why not.
#pragma once

#include "bench_util.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hora::bench {

class RawGloo {
 public:
  // Collective. The mesh rendezvouses through a FileStore in a directory rank 0 makes (under
  // $TMPDIR, else /tmp) and broadcasts: it runs where every rank sees that directory (one
  // machine, network namespaces included), else nullptr with *whyNot set. The ranks listen on
  // 127.0.0.1 when they share a host name, else on the address that routes to MASTER_ADDR (an
  // env:// world) or on the host name's address.
  static std::unique_ptr<RawGloo> connect(int rank, const std::vector<RankInfo> &ranks,
                                          std::string *whyNot);
  ~RawGloo();

  // Where the mesh listens ("127.0.0.1", "10.0.0.2", a host name): for the header.
  const std::string &address() const;

  // in == out: in place.
  void allreduce(const void *in, void *out, int64_t count, int esize, ReduceFn fn);
  void allgather(const void *in, void *out, int64_t bytesPerRank);
  void broadcast(void *buf, int64_t bytes, int root);
  void alltoall(const void *in, void *out, int64_t bytes);

 private:
  RawGloo();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hora::bench

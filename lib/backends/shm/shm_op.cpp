// SPDX-License-Identifier: Apache-2.0
#include "backends/shm/shm_op.h"

#include "base/error.h"

namespace hora {

void announce(ShmChannel &channel, const ShmOp &o, uint32_t spans) {
  channel.slot(channel.rank()).ops[o.seq & 1] = {o.seq, o.total, static_cast<uint32_t>(o.dtype),
                                                 static_cast<uint32_t>(o.op), spans};
}

void checkPeers(const ShmChannel &channel, const ShmOp &o) {
  for (int r = 0; r < channel.size(); ++r) {
    const ShmChannel::OpDescriptor &peer = channel.slot(r).ops[o.seq & 1];
    if (peer.seq != o.seq || peer.total != o.total || peer.dtype != static_cast<uint32_t>(o.dtype) ||
        peer.op != static_cast<uint32_t>(o.op)) {
      HORA_THROW(HORA_ERR_INTERNAL, "shared-memory allreduce out of step: rank ", channel.rank(),
                 " runs op ", o.seq, " (", o.total, " x ", dtypeName(o.dtype), ", ",
                 reduceOpName(o.op), "), rank ", r, " op ", peer.seq, " (", peer.total, " x ",
                 dtypeName(static_cast<DType>(peer.dtype)), ")");
    }
  }
}

}  // namespace hora

// SPDX-License-Identifier: Apache-2.0
// The optional calls of a backend, for one whose caps() does not offer them: the engine never
// makes such a call, so reaching one is a bug in the engine or in the backend's description.
#include "core/backend.h"

#include "base/error.h"

namespace hora {

BackendCaps BackendCaps::plain(bool usesSockets, Scope scope) {
  BackendCaps c;
  c.collectives = kAllDataCollectives;
  c.reduceDtypes = kAllButHalfDtypes;
  c.usesSockets = usesSockets;
  c.scope = scope;
  return c;
}

void Backend::allreduceSpans(const std::vector<Span> &, DType, ReduceOp, double, double) {
  HORA_THROW(HORA_ERR_INTERNAL, "backend ", name(),
             " was asked to reduce spans in place, which its capabilities do not offer");
}

void Backend::andWords(std::vector<uint64_t> &words) {
  HORA_THROW(HORA_ERR_INTERNAL, "backend ", name(), " was asked for a negotiation AND of ",
             words.size(), " words, which its capabilities do not offer");
}

}  // namespace hora

// SPDX-License-Identifier: Apache-2.0
// glooCall: Gloo exceptions to hora Errors, classified by blast radius.
#pragma once

#include <gloo/common/error.h>

#include <string>
#include <utility>

#include "base/error.h"

namespace hora {

// What the mesh's own transfers throw (GlooMesh::wait and friends): hora's Error, with the
// status the transfer established (HORA_ERR_TIMEOUT, HORA_ERR_PEER_LOST, HORA_ERR_BACKEND), and
// Gloo's words, which glooCall completes with the collective and the peer.
class MeshError : public Error {
 public:
  MeshError(hora_status_t status, std::string message)
      : Error(status, std::move(message), __FILE__, __LINE__) {}
};

[[noreturn]] void throwGlooError(const char *what, int rank, const std::exception &e,
                                 const char *file, int line);

template <typename F>
void glooCall(const char *what, int rank, F &&body) {
  try {
    body();
  } catch (const MeshError &e) {
    throwGlooError(what, rank, e, __FILE__, __LINE__);
  } catch (const Error &) {
    throw;
  } catch (const std::exception &e) {
    throwGlooError(what, rank, e, __FILE__, __LINE__);
  }
}

}  // namespace hora

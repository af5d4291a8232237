// SPDX-License-Identifier: Apache-2.0
// Status strings, blast radius and the Error type.
#include "base/error.h"

#include <cstring>

namespace hora {

const char *statusString(hora_status_t status) {
  switch (status) {
    case HORA_SUCCESS: return "success";
    case HORA_ERR_INVALID_ARGUMENT: return "invalid argument";
    case HORA_ERR_NOT_INITIALIZED: return "not initialized";
    case HORA_ERR_DUPLICATE_NAME: return "duplicate name";
    case HORA_ERR_MISMATCH: return "mismatch between ranks";
    case HORA_ERR_UNSUPPORTED: return "unsupported";
    case HORA_ERR_TIMEOUT: return "timeout";
    case HORA_ERR_PEER_LOST: return "peer lost";
    case HORA_ERR_BACKEND: return "backend error";
    case HORA_ERR_SHUT_DOWN: return "shut down";
    case HORA_ERR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

BlastRadius blastRadius(hora_status_t status) {
  switch (status) {
    case HORA_SUCCESS: return BlastRadius::kNone;
    case HORA_ERR_INVALID_ARGUMENT:
    case HORA_ERR_NOT_INITIALIZED:
    case HORA_ERR_DUPLICATE_NAME:
    case HORA_ERR_MISMATCH:
    case HORA_ERR_UNSUPPORTED: return BlastRadius::kThisOp;
    case HORA_ERR_SHUT_DOWN: return BlastRadius::kShutDown;
    case HORA_ERR_TIMEOUT:
    case HORA_ERR_PEER_LOST:
    case HORA_ERR_BACKEND:
    case HORA_ERR_INTERNAL: return BlastRadius::kRuntime;
  }
  return BlastRadius::kRuntime;
}

static std::string fileBase(const char *file) {
  const char *slash = std::strrchr(file, '/');
  return slash ? slash + 1 : file;
}

Error::Error(hora_status_t status, std::string message, const char *file, int line)
    : std::runtime_error("[" + fileBase(file) + ":" + std::to_string(line) + "] " + message),
      status_(status),
      message_(std::move(message)) {}

}  // namespace hora

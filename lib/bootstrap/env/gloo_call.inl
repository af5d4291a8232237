// SPDX-License-Identifier: Apache-2.0
// glooCall: Gloo exceptions to hora Errors, classified by blast radius.
#pragma once

#include <gloo/common/error.h>

#include <string>

#include "base/error.h"

namespace hora {

[[noreturn]] void throwGlooError(const char *what, int rank, const std::exception &e,
                                 const char *file, int line);

template <typename F>
void glooCall(const char *what, int rank, F &&body) {
  try {
    body();
  } catch (const Error &) {
    throw;
  } catch (const std::exception &e) {
    throwGlooError(what, rank, e, __FILE__, __LINE__);
  }
}

}  // namespace hora

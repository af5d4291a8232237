// SPDX-License-Identifier: Apache-2.0
// The Gloo data plane (TCP), for worlds formed without MPI or with HORA_CPU_BACKEND=gloo.
#pragma once

#include <memory>

#include "base/knobs.h"
#include "bootstrap/bootstrap.h"
#include "core/backend.h"

namespace hora {

// On a GlooGroup, shares its context. On any other group (MPI), builds a Gloo context of its own:
// set rank 0 serves a TCP store whose address travels over the group's control plane. Waits for
// peers up to HORA_TIMEOUT_S.
std::unique_ptr<Backend> createGlooBackend(Group &group, const Knobs &knobs);

}  // namespace hora

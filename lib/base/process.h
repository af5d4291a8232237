// SPDX-License-Identifier: Apache-2.0
// Facts about other processes on this host, for naming a peer that is gone.
#pragma once

#include <string>

namespace hora {

// A process that exited: no such process, or a zombie its parent has not reaped yet (a busy
// launcher, or a test harness, can leave it so for a long time).
bool processGone(long pid);

// This host's name, as gethostname() gives it ("" if it fails).
std::string hostName();

}  // namespace hora

// SPDX-License-Identifier: Apache-2.0
// Named places in the code where a test can make one rank wait or die (HORA_TEST_AT).
#pragma once

namespace hora {

// HORA_TEST_AT="point@rank:action[,...]" makes the process whose rank (in the group being formed
// or used) is `rank` pause or die when it reaches `point`: `sleep=MS` sleeps that long, `kill`
// ends the process with SIGKILL (nothing of hora's runs after it, as with a real kill -9). `rank`
// may be `*` for every rank. Tests use it to put a race's loser on a fixed side (a rank that
// switches its pairs late) or to kill a rank in the middle of a phase (setting up the shared
// segment). Unset, or a point not named: returns at once (one load after the first call).
// Malformed entries are ignored with a warning, once.
void testPoint(const char *point, int rank);

}  // namespace hora

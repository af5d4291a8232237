# SPDX-License-Identifier: Apache-2.0
# One factor for every time limit in the tests (see time_scale.h): `scaled 60` prints 60 times
# HORA_TEST_TIME_SCALE (default 1), rounded up to whole seconds. Source it; it defines a function.
scaled() {
  awk -v s="${HORA_TEST_TIME_SCALE:-1}" -v t="$1" 'BEGIN {
    if (s + 0 < 1) s = 1
    v = t * s; r = int(v); if (r < v) r++; print r }'
}

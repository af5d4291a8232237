/* SPDX-License-Identifier: Apache-2.0 */
/* Forms and tears down a world again and again: ROUNDS times (argv[1], default 20) hora_init, an
   allreduce over the world, two process sets created (at 3 ranks and more: the first size-1
   ranks and the last size-1 ranks; at 2: each rank alone), an allreduce on each set this rank is
   in, the sets destroyed, hora_shutdown. Every sum is checked against the value computed here.
   Prints "formation_rounds: N rounds ok (slowest S s)" on rank 0 and exits 0, or names the round,
   the step and hora's message and exits 1. Used by test/formation and tools/formation_stress.sh. */
#define _POSIX_C_SOURCE 200809L
#include <hora/hora.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int failed(int round, const char *step, hora_status_t s) {
  fprintf(stderr, "formation_rounds: round %d: %s: %s: %s\n", round, step, hora_status_string(s),
          hora_last_error());
  return 1;
}

/* Sums (rank + 1) * (i + 1) + round over the set's members `ranks`, checks every element. */
static int reduce_and_check(int round, int32_t set, const int *ranks, int n, int rank) {
  enum { kCount = 257 };
  float x[kCount];
  int64_t shape[1] = {kCount};
  DLTensor t = {x, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, NULL, 0};
  for (int i = 0; i < kCount; ++i) x[i] = (float)((rank + 1) * (i + 1) + round);
  hora_request_t req = NULL;
  hora_status_t s = hora_allreduce_async(NULL, &t, &t, HORA_OP_SUM, 1.0, 1.0, set, &req);
  if (s == HORA_SUCCESS) s = hora_wait(req);
  if (req != NULL) hora_request_free(req);
  if (s != HORA_SUCCESS) return failed(round, set == 0 ? "allreduce on the world" : "allreduce on a set", s);
  for (int i = 0; i < kCount; ++i) {
    double want = 0;
    for (int m = 0; m < n; ++m) want += (double)((ranks[m] + 1) * (i + 1) + round);
    if ((double)x[i] != want) {
      fprintf(stderr, "formation_rounds: round %d: set %d: element %d is %g, expected %g\n", round,
              (int)set, i, (double)x[i], want);
      return 1;
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  const int rounds = argc > 1 ? atoi(argv[1]) : 20;
  double slowest = 0;
  int rank = -1;
  for (int round = 0; round < rounds; ++round) {
    const double began = now();
    hora_status_t s = hora_init();
    if (s != HORA_SUCCESS) return failed(round, "hora_init", s);
    rank = hora_rank();
    const int size = hora_size();
    int all[64];
    if (size > 64) {
      fprintf(stderr, "formation_rounds: at most 64 ranks\n");
      return 1;
    }
    for (int r = 0; r < size; ++r) all[r] = r;
    if (reduce_and_check(round, 0, all, size, rank)) return 1;
    /* Two sets: where size >= 3 each has size-1 ranks and a mesh of its own. */
    int first[64], last[64], n = size >= 3 ? size - 1 : 1;
    for (int i = 0; i < n; ++i) {
      first[i] = size >= 3 ? i : 0;
      last[i] = size >= 3 ? i + 1 : size - 1;
    }
    int32_t a = -1, b = -1;
    if ((s = hora_process_set_create(first, n, &a)) != HORA_SUCCESS) return failed(round, "creating the first set", s);
    if ((s = hora_process_set_create(last, n, &b)) != HORA_SUCCESS) return failed(round, "creating the second set", s);
    if (hora_process_set_rank(a) >= 0 && reduce_and_check(round, a, first, n, rank)) return 1;
    if (hora_process_set_rank(b) >= 0 && reduce_and_check(round, b, last, n, rank)) return 1;
    if ((s = hora_process_set_destroy(a)) != HORA_SUCCESS) return failed(round, "destroying the first set", s);
    if (b != a && (s = hora_process_set_destroy(b)) != HORA_SUCCESS) return failed(round, "destroying the second set", s);
    if ((s = hora_shutdown()) != HORA_SUCCESS) return failed(round, "hora_shutdown", s);
    const double took = now() - began;
    if (took > slowest) slowest = took;
  }
  if (rank == 0) printf("formation_rounds: %d rounds ok (slowest %.2f s)\n", rounds, slowest);
  return 0;
}

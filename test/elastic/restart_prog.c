/* SPDX-License-Identifier: Apache-2.0 */
/* A job for horarun --max-restarts: STEPS (default 10) allreduces, each checked against the sum
   it must give. Rank FAIL_RANK (default 1) aborts at step FAIL_STEP (default 5) in restart round
   0 (HORA_RESTART_COUNT unset or 0), so a job with a restart left finishes and one without fails.
   Prints "rank R of N: STEPS steps correct in round K" at the end; exits 2 on a wrong sum. */
#include "elastic_prog.h"

int main(void) {
  if (hora_init() != HORA_SUCCESS) {
    fprintf(stderr, "hora_init: %s\n", hora_last_error());
    return 1;
  }
  const int rank = hora_rank(), size = hora_size();
  const int round = env_int("HORA_RESTART_COUNT", 0);
  const int steps = env_int("STEPS", 10);
  const int fail_rank = env_int("FAIL_RANK", 1), fail_step = env_int("FAIL_STEP", 5);
  static double x[kStepCount];
  for (int step = 0; step < steps; ++step) {
    if (round == 0 && step == fail_step && is_victim(rank, fail_rank)) {
      fprintf(stderr, "rank %d fails at step %d of round %d (on purpose)\n", rank, step, round);
      if (report_times()) fprintf(stderr, "KILLED_AT %.6f\n", wall_s());
      if (getenv("FAIL_HOST") != NULL) fail_now();
      abort();
    }
    const int s = checked_step(x, rank, size, step);
    if (s < 0) return 2;
    if (s != HORA_SUCCESS) {
      fprintf(stderr, "rank %d step %d: %s\n", rank, step, hora_last_error());
      return 1;
    }
    if (report_times() && round > 0 && rank == 0 && step == 0) printf("RESUMED_AT %.6f\n", wall_s());
  }
  printf("rank %d of %d: %d steps correct in round %d\n", rank, size, steps, round);
  fflush(stdout);
  hora_shutdown();
  return 0;
}

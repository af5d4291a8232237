/* SPDX-License-Identifier: Apache-2.0 */
/* An elastic worker through the C API alone (horarun --min-np): STEPS (default 20) allreduces,
   each checked against the sum the current world must give. In the first world, rank VICTIM
   (default the last; with FAIL_HOST, the first rank on that host, and with KILL_AGENT=1 its
   horarun first) kills itself at step FAIL_STEP (default 5). The survivors get
   HORA_ERR_PEER_LOST (or HORA_ERR_TIMEOUT), call hora_shutdown() and hora_init(), which joins
   the agents' next world, and redo the step there. Each prints "rank R of N: STEPS steps
   correct, K worlds" at the end; exits 2 on a wrong sum, 1 when a call fails otherwise. */
#include "elastic_prog.h"

int main(void) {
  if (hora_init() != HORA_SUCCESS) {
    fprintf(stderr, "hora_init: %s\n", hora_last_error());
    return 1;
  }
  const int steps = env_int("STEPS", 20), fail_step = env_int("FAIL_STEP", 5);
  const int victim = env_int("VICTIM", hora_size() - 1);
  int worlds = 1, resumed = 0;
  static double x[kStepCount];
  for (int step = 0; step < steps;) {
    const int rank = hora_rank(), size = hora_size();
    if (worlds == 1 && step == fail_step && is_victim(rank, victim)) {
      if (report_times()) fprintf(stderr, "KILLED_AT %.6f\n", wall_s());
      fail_now();
    }
    const int s = checked_step(x, rank, size, step);
    if (s < 0) return 2;
    if (s == HORA_ERR_PEER_LOST || s == HORA_ERR_TIMEOUT) {
      fprintf(stderr, "rank %d of %d, step %d: %s; joining the next world\n", rank, size, step,
              hora_status_string((hora_status_t)s));
      hora_shutdown();
      if (hora_init() != HORA_SUCCESS) {
        fprintf(stderr, "hora_init: %s\n", hora_last_error());
        return 1;
      }
      ++worlds;
      fprintf(stderr, "now rank %d of %d\n", hora_rank(), hora_size());
      continue;  /* redo the step in the new world */
    }
    if (s != HORA_SUCCESS) {
      fprintf(stderr, "rank %d step %d: %s\n", rank, step, hora_last_error());
      return 1;
    }
    if (report_times() && worlds > 1 && !resumed && rank == 0) {
      printf("RESUMED_AT %.6f\n", wall_s());
      fflush(stdout);
      resumed = 1;
    }
    ++step;
  }
  printf("rank %d of %d: %d steps correct, %d worlds\n", hora_rank(), hora_size(), steps, worlds);
  fflush(stdout);
  hora_shutdown();
  return 0;
}

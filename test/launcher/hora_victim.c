/* SPDX-License-Identifier: Apache-2.0 */
/* A hora job in which one rank (VICTIM, default 1) fails mid-run at step 20: HOW=kill (default)
   SIGKILLs itself, HOW=stop SIGSTOPs itself (a hung process). The survivors report the error
   they got and whether hora_shutdown then returns, and exit with status 3. */
#include <hora/hora.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grad_step.h"

int main(void) {
  if (hora_init() != HORA_SUCCESS) {
    fprintf(stderr, "hora_init: %s\n", hora_last_error());
    return 1;
  }
  const int victim = atoi(getenv("VICTIM") ? getenv("VICTIM") : "1");
  const int stop = getenv("HOW") != NULL && strcmp(getenv("HOW"), "stop") == 0;
  const int rank = hora_rank();
  float x[1024] = {0};
  int64_t shape[1] = {1024};
  DLTensor t = {x, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, NULL, 0};
  for (int step = 0;; ++step) {
    if (step == 20 && rank == victim) raise(stop ? SIGSTOP : SIGKILL);
    hora_status_t s = grad_step(&t, rank, step);
    if (s != HORA_SUCCESS) {
      s = hora_shutdown();
      fprintf(stderr, "rank %d: hora_shutdown -> %s\n", rank, hora_status_string(s));
      return 3;
    }
  }
}

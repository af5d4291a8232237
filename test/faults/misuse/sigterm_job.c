/* SPDX-License-Identifier: Apache-2.0 */
/* A hora job under mpirun in which rank VICTIM (default 1) SIGKILLs itself at step STEP (default
   20) of an allreduce loop. The others block in the next allreduce until mpirun, seeing a rank
   die, ends the job with SIGTERM: what they print and leave behind is the test. Every rank says
   "rank R: step STEP" on reaching that step, so the test knows the job really ran.
   IGNORE_SIGTERM=1: the program ignores SIGTERM itself, before hora_init (hora must leave it).
   FORK_CHILD=1: after hora_init, forks a child that says "child PID" and waits for a signal (a
   data loader's worker: not a rank, so hora must stay out of its death). */
#define _POSIX_C_SOURCE 200809L
#include <hora/hora.h>
#include <signal.h>
#include <sys/types.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "grad_step.h"

int main(void) {
  if (getenv("IGNORE_SIGTERM") != NULL) signal(SIGTERM, SIG_IGN);
  if (hora_init() != HORA_SUCCESS) {
    fprintf(stderr, "hora_init: %s\n", hora_last_error());
    return 1;
  }
  if (getenv("FORK_CHILD") != NULL) {
    const pid_t child = fork();
    if (child == 0) {
      fprintf(stderr, "child %d\n", (int)getpid());
      for (;;) pause();
    }
  }
  const int victim = atoi(getenv("VICTIM") ? getenv("VICTIM") : "1");
  const int last = atoi(getenv("STEP") ? getenv("STEP") : "20");
  const int rank = hora_rank();
  float x[256];
  int64_t shape[1] = {256};
  DLTensor t = {x, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, NULL, 0};
  for (int step = 0;; ++step) {
    if (step == last) {
      fprintf(stderr, "rank %d: step %d\n", rank, step);
      if (rank == victim) raise(SIGKILL);
    }
    for (int i = 0; i < 256; ++i) x[i] = (float)(rank + 1);
    if (grad_step(&t, rank, step) != HORA_SUCCESS) return 3;
    const float want = (float)(hora_size() * (hora_size() + 1) / 2);
    if (x[0] != want || x[255] != want) {
      fprintf(stderr, "rank %d: step %d: got %g, want %g\n", rank, step, x[0], want);
      return 4;
    }
  }
}

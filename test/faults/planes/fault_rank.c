/* SPDX-License-Identifier: Apache-2.0 */
#define _POSIX_C_SOURCE 200809L
/* A training loop that checks every result, for the fault suite. Each step allreduces 4096
   floats, x[i] = rank + step + i % 7, and checks the sum on every element. At step STEP (default
   20) rank VICTIM (default 1) fails: HOW=kill SIGKILLs itself, HOW=stop SIGSTOPs itself (a hung
   process; the test may resume it), HOW=none runs on. On an error a rank prints
     rank R: step S: STATUS: MESSAGE
   stays alive HOLD_S seconds (so that a resumed peer meets a live rank), calls hora_shutdown,
   prints "rank R: shutdown -> STATUS" and exits 3. A wrong element prints "rank R: WRONG DATA"
   and exits 4; STEPS steps (default 1000000) without error exit 0. With PID_DIR set, each rank
   writes its pid to PID_DIR/pid.R after hora_init. */
#include <hora/hora.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "grad_step.h"

enum { kCount = 4096 };

static int env_int(const char *name, int fallback) {
  const char *v = getenv(name);
  return v != NULL && *v != '\0' ? atoi(v) : fallback;
}

static double env_double(const char *name) {
  const char *v = getenv(name);
  return v != NULL && *v != '\0' ? atof(v) : 0.0;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  setvbuf(stderr, NULL, _IOLBF, 0);
  if (hora_init() != HORA_SUCCESS) {
    fprintf(stderr, "rank ?: hora_init: %s\n", hora_last_error());
    return 1;
  }
  const int victim = env_int("VICTIM", 1), fail_step = env_int("STEP", 20);
  const int steps = env_int("STEPS", 1000000);
  const double hold_s = env_double("HOLD_S");
  const char *how = getenv("HOW") != NULL ? getenv("HOW") : "none";
  const int rank = hora_rank(), size = hora_size();
  if (getenv("PID_DIR") != NULL) {
    char path[4096];
    snprintf(path, sizeof path, "%s/pid.%d", getenv("PID_DIR"), rank);
    FILE *f = fopen(path, "w");
    if (f != NULL) {
      fprintf(f, "%d\n", (int)getpid());
      fclose(f);
    }
  }
  static float x[kCount];
  int64_t shape[1] = {kCount};
  DLTensor t = {x, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, NULL, 0};
  for (int step = 0; step < steps; ++step) {
    if (step == fail_step && rank == victim) {
      if (strcmp(how, "kill") == 0) raise(SIGKILL);
      if (strcmp(how, "stop") == 0) raise(SIGSTOP);
    }
    for (int i = 0; i < kCount; ++i) x[i] = (float)(rank + step + i % 7);
    hora_status_t s = grad_step(&t, rank, step);
    if (s != HORA_SUCCESS) {
      if (hold_s > 0) {
        struct timespec hold = {(time_t)hold_s, (long)((hold_s - (double)(time_t)hold_s) * 1e9)};
        nanosleep(&hold, NULL);
      }
      s = hora_shutdown();
      fprintf(stderr, "rank %d: shutdown -> %s\n", rank, hora_status_string(s));
      return 3;
    }
    for (int i = 0; i < kCount; ++i) {
      const float want = (float)(size * (size - 1) / 2 + size * (step + i % 7));
      if (x[i] != want) {
        fprintf(stderr, "rank %d: WRONG DATA at step %d element %d: %g, want %g\n", rank, step, i,
                (double)x[i], (double)want);
        return 4;
      }
    }
  }
  hora_shutdown();
  return 0;
}

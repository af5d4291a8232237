/* SPDX-License-Identifier: Apache-2.0 */
/* A job for horarun --max-restarts: STEPS (default 10) allreduces, each checked against the sum
   it must give. Rank FAIL_RANK (default 1) aborts at step FAIL_STEP (default 5) in restart round
   0 (HORA_RESTART_COUNT unset or 0), so a job with a restart left finishes and one without fails.
   Prints "rank R of N: STEPS steps correct in round K" at the end; exits 2 on a wrong sum. */
#define _DEFAULT_SOURCE 1 /* gethostname, kill */
#include <hora/hora.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int env_int(const char *name, int fallback) {
  const char *v = getenv(name);
  return v != NULL && v[0] != '\0' ? atoi(v) : fallback;
}

/* Whether this process is the one that fails: the first local rank on host FAIL_HOST when that
   is set (the rank numbers a host gets depend on which agent joined first), else rank `rank`. */
static int is_victim(int rank, int victim) {
  const char *host = getenv("FAIL_HOST");
  if (host == NULL || host[0] == '\0') return rank == victim;
  char name[256] = {0};
  gethostname(name, sizeof name - 1);
  return strcmp(name, host) == 0 && hora_local_rank() == 0;
}

/* KILL_AGENT=1: the host's horarun goes first (a host lost with its agent), then this process. */
static void fail_now(void) {
  const char *agent = getenv("KILL_AGENT");
  if (agent != NULL && strcmp(agent, "1") == 0) kill(getppid(), SIGKILL);
  raise(SIGKILL);
}

/* REPORT_TIMES=1: "KILLED_AT t" (stderr, the victim) and "RESUMED_AT t" (stdout, rank 0 after
   its first good step in the next round or world), wall-clock seconds, for
   bench/elastic_recovery.py. */
static int report_times(void) { return getenv("REPORT_TIMES") != NULL; }
static double wall_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(void) {
  if (hora_init() != HORA_SUCCESS) {
    fprintf(stderr, "hora_init: %s\n", hora_last_error());
    return 1;
  }
  const int rank = hora_rank(), size = hora_size();
  const int round = env_int("HORA_RESTART_COUNT", 0);
  const int steps = env_int("STEPS", 10);
  const int fail_rank = env_int("FAIL_RANK", 1), fail_step = env_int("FAIL_STEP", 5);
  enum { kCount = 4096 };
  static double x[kCount];
  int64_t shape[1] = {kCount};
  DLTensor t = {x, {kDLCPU, 0}, 1, {kDLFloat, 64, 1}, shape, NULL, 0};
  for (int step = 0; step < steps; ++step) {
    if (round == 0 && step == fail_step && is_victim(rank, fail_rank)) {
      fprintf(stderr, "rank %d fails at step %d of round %d (on purpose)\n", rank, step, round);
      if (report_times()) fprintf(stderr, "KILLED_AT %.6f\n", wall_s());
      if (getenv("FAIL_HOST") != NULL) fail_now();
      abort();
    }
    for (int i = 0; i < kCount; ++i) x[i] = (double)(rank + 1) * (step + 1) + i;
    hora_request_t req = NULL;
    hora_status_t s = hora_allreduce_async("step", &t, &t, HORA_OP_SUM, 1.0, 1.0, 0, &req);
    if (s == HORA_SUCCESS) {
      s = hora_wait(req);
      hora_request_free(req);
    }
    if (s != HORA_SUCCESS) {
      fprintf(stderr, "rank %d step %d: %s\n", rank, step, hora_last_error());
      return 1;
    }
    if (report_times() && round > 0 && rank == 0 && step == 0) printf("RESUMED_AT %.6f\n", wall_s());
    for (int i = 0; i < kCount; ++i) {
      const double want = (double)size * (size + 1) / 2 * (step + 1) + (double)size * i;
      if (x[i] != want) {
        fprintf(stderr, "rank %d step %d: x[%d] = %g, want %g\n", rank, step, i, x[i], want);
        return 2;
      }
    }
  }
  printf("rank %d of %d: %d steps correct in round %d\n", rank, size, steps, round);
  fflush(stdout);
  hora_shutdown();
  return 0;
}

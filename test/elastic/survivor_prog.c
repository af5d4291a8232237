/* SPDX-License-Identifier: Apache-2.0 */
/* An elastic worker through the C API alone (horarun --min-np): STEPS (default 20) allreduces,
   each checked against the sum the current world must give. In the first world, rank VICTIM
   (default the last; with FAIL_HOST, the first rank on that host, and with KILL_AGENT=1 its
   horarun first) kills itself at step FAIL_STEP (default 5). The survivors get
   HORA_ERR_PEER_LOST (or HORA_ERR_TIMEOUT), call hora_shutdown() and hora_init(), which joins
   the agents' next world, and redo the step there. Each prints "rank R of N: STEPS steps
   correct, K worlds" at the end; exits 2 on a wrong sum, 1 when a call fails otherwise. */
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
  const int steps = env_int("STEPS", 20), fail_step = env_int("FAIL_STEP", 5);
  const int victim = env_int("VICTIM", hora_size() - 1);
  int worlds = 1, resumed = 0;
  enum { kCount = 4096 };
  static double x[kCount];
  int64_t shape[1] = {kCount};
  DLTensor t = {x, {kDLCPU, 0}, 1, {kDLFloat, 64, 1}, shape, NULL, 0};
  for (int step = 0; step < steps;) {
    const int rank = hora_rank(), size = hora_size();
    if (worlds == 1 && step == fail_step && is_victim(rank, victim)) {
      if (report_times()) fprintf(stderr, "KILLED_AT %.6f\n", wall_s());
      fail_now();
    }
    for (int i = 0; i < kCount; ++i) x[i] = (double)(rank + 1) * (step + 1) + i;
    hora_request_t req = NULL;
    hora_status_t s = hora_allreduce_async("step", &t, &t, HORA_OP_SUM, 1.0, 1.0, 0, &req);
    if (s == HORA_SUCCESS) {
      s = hora_wait(req);
      hora_request_free(req);
    }
    if (s == HORA_ERR_PEER_LOST || s == HORA_ERR_TIMEOUT) {
      fprintf(stderr, "rank %d of %d, step %d: %s; joining the next world\n", rank, size, step,
              hora_status_string(s));
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
    for (int i = 0; i < kCount; ++i) {
      const double want = (double)size * (size + 1) / 2 * (step + 1) + (double)size * i;
      if (x[i] != want) {
        fprintf(stderr, "rank %d step %d: x[%d] = %g, want %g\n", rank, step, i, x[i], want);
        return 2;
      }
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

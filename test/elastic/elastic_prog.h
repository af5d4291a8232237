/* SPDX-License-Identifier: Apache-2.0 */
/* What the elastic test programs share: variables, the failing process, timestamps, and one
   checked allreduce step. Header-only (static functions), C99 + POSIX. */
#ifndef HORA_TEST_ELASTIC_PROG_H
#define HORA_TEST_ELASTIC_PROG_H

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
   bench/elastic/recovery.py. */
static int report_times(void) { return getenv("REPORT_TIMES") != NULL; }
static double wall_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

enum { kStepCount = 4096 };

/* One step: x[i] = (rank + 1) * (step + 1) + i summed over the world. The status of the
   allreduce; on success, -1 when an element differs from size*(size+1)/2*(step+1) + size*i (said
   on stderr), else HORA_SUCCESS. */
static int checked_step(double *x, int rank, int size, int step) {
  int64_t shape[1] = {kStepCount};
  DLTensor t = {x, {kDLCPU, 0}, 1, {kDLFloat, 64, 1}, shape, NULL, 0};
  for (int i = 0; i < kStepCount; ++i) x[i] = (double)(rank + 1) * (step + 1) + i;
  hora_request_t req = NULL;
  hora_status_t s = hora_allreduce_async("step", &t, &t, HORA_OP_SUM, 1.0, 1.0, 0, &req);
  if (s == HORA_SUCCESS) {
    s = hora_wait(req);
    hora_request_free(req);
  }
  if (s != HORA_SUCCESS) return s;
  for (int i = 0; i < kStepCount; ++i) {
    const double want = (double)size * (size + 1) / 2 * (step + 1) + (double)size * i;
    if (x[i] != want) {
      fprintf(stderr, "rank %d step %d: x[%d] = %g, want %g\n", rank, step, i, x[i], want);
      return -1;
    }
  }
  return HORA_SUCCESS;
}

#endif

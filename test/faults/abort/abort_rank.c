/* SPDX-License-Identifier: Apache-2.0 */
/* One rank of the abort tests (test_abort.py). The ranks of SET (a comma list of world ranks,
   default every rank) form a process set (the world itself when that is every rank).
   The set's first rank submits allreduce 'x' on it with its tensor filled with 1, waits
   ABORT_AFTER_S (0.5), calls hora_process_set_abort(set, HORA_ERR_TIMEOUT, "test reason 42")
   and checks: the call returns at once, the request failed with HORA_ERR_TIMEOUT naming the
   reason, and nothing writes into the tensor after it refills it with 100 (looked at for 1 s).
   It then creates $DIR/aborted. The set's second rank waits for that file, submits 'x' with 2,
   and must fail within 5 s naming the first rank and the reason ("late rank failed: ..." is
   printed with the message), then creates $DIR/late_done, until which the first rank stays.
   Every rank then runs an allreduce on the world, which must still work where the set was not
   the world (printed "world ok S"). Exit 0 when every check holds. */
#define _POSIX_C_SOURCE 200809L
#include <hora/hora.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void sleep_s(double s) {
  struct timespec t = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&t, NULL);
}

#define CHECK(cond, ...)                                     \
  do {                                                       \
    if (!(cond)) {                                           \
      fprintf(stderr, "rank %d: ", hora_rank());             \
      fprintf(stderr, __VA_ARGS__);                          \
      fprintf(stderr, "\n");                                 \
      return 1;                                              \
    }                                                        \
  } while (0)

int main(void) {
  if (hora_init() != HORA_SUCCESS) {
    fprintf(stderr, "hora_init: %s\n", hora_last_error());
    return 2;
  }
  const int size = hora_size();
  const char *dir = getenv("DIR") ? getenv("DIR") : ".";
  const double after = getenv("ABORT_AFTER_S") ? atof(getenv("ABORT_AFTER_S")) : 0.5;
  int ranks[64], n = 0;
  if (getenv("SET") != NULL && *getenv("SET") != '\0') {
    char *list = strdup(getenv("SET"));
    for (char *tok = strtok(list, ","); tok != NULL && n < 64; tok = strtok(NULL, ",")) ranks[n++] = atoi(tok);
    free(list);
  } else {
    for (n = 0; n < size && n < 64; ++n) ranks[n] = n;
  }
  int32_t set = 0;
  if (n != size) CHECK(hora_process_set_create(ranks, n, &set) == HORA_SUCCESS, "set: %s", hora_last_error());
  const int me = hora_process_set_rank(set);
  char flag[4096];
  snprintf(flag, sizeof flag, "%s/aborted", dir);
  float x[1024];
  int64_t shape[1] = {1024};
  DLTensor t = {x, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, NULL, 0};
  if (me == 0) {
    for (int i = 0; i < 1024; ++i) x[i] = 1.0f;
    hora_request_t req = NULL;
    CHECK(hora_allreduce_async("x", &t, &t, HORA_OP_SUM, 1.0, 1.0, set, &req) == HORA_SUCCESS,
          "submit: %s", hora_last_error());
    sleep_s(after);
    const double began = now();
    const hora_status_t a = hora_process_set_abort(set, HORA_ERR_TIMEOUT, "test reason 42");
    const double took = now() - began;
    CHECK(a == HORA_SUCCESS, "abort: %s", hora_last_error());
    CHECK(took < 2.0, "the abort took %.2f s", took);
    int done = 0;
    CHECK(hora_poll(req, &done) == HORA_SUCCESS && done, "the request is not done after the abort");
    const hora_status_t w = hora_wait(req);
    CHECK(w == HORA_ERR_TIMEOUT, "the aborted request returned %s", hora_status_string(w));
    CHECK(strstr(hora_last_error(), "test reason 42") != NULL, "its message: %s", hora_last_error());
    printf("aborted after %.3f s: %s\n", took, hora_last_error());
    hora_request_free(req);
    for (int i = 0; i < 1024; ++i) x[i] = 100.0f;
    FILE *f = fopen(flag, "w");
    CHECK(f != NULL, "cannot create %s", flag);
    fclose(f);
    /* a later op on the set fails at once */
    hora_request_t again = NULL;
    hora_status_t s = hora_allreduce_async("y", &t, &t, HORA_OP_SUM, 1.0, 1.0, set, &again);
    if (s == HORA_SUCCESS) s = hora_wait(again);
    hora_request_free(again);
    CHECK(s != HORA_SUCCESS, "an op on the aborted set succeeded");
    /* until the late rank has failed (this process serves the store the late rank reads this
       rank's last word from, under horarun): nothing writes into the tensor meanwhile */
    char late[4096];
    snprintf(late, sizeof late, "%s/late_done", dir);
    for (int k = 0; k < 20 || access(late, F_OK) != 0; ++k) {
      CHECK(k < 600, "%s never appeared", late);
      sleep_s(0.05);
      for (int i = 0; i < 1024; ++i) CHECK(x[i] == 100.0f, "element %d became %g after the abort", i, (double)x[i]);
    }
  } else if (me == 1) {
    for (int tries = 0; access(flag, F_OK) != 0; ++tries) {
      CHECK(tries < 600, "%s never appeared", flag);
      sleep_s(0.05);
    }
    for (int i = 0; i < 1024; ++i) x[i] = 2.0f;
    const double began = now();
    hora_request_t req = NULL;
    hora_status_t s = hora_allreduce_async("x", &t, &t, HORA_OP_SUM, 1.0, 1.0, set, &req);
    if (s == HORA_SUCCESS) s = hora_wait(req);
    const double took = now() - began;
    CHECK(s != HORA_SUCCESS, "the late allreduce succeeded with %g", (double)x[0]);
    CHECK(took < 5.0, "the late rank failed only after %.1f s", took);
    printf("late rank failed after %.3f s: %s: %s\n", took, hora_status_string(s), hora_last_error());
    hora_request_free(req);
    char done[4096];
    snprintf(done, sizeof done, "%s/late_done", dir);
    FILE *f = fopen(done, "w");
    CHECK(f != NULL, "cannot create %s", done);
    fclose(f);
  }
  if (set != 0) {
    /* the world still works where the aborted set was another */
    float y[4] = {1, 1, 1, 1};
    int64_t ys[1] = {4};
    DLTensor u = {y, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, ys, NULL, 0};
    hora_request_t req = NULL;
    hora_status_t s = hora_allreduce_async("w", &u, &u, HORA_OP_SUM, 1.0, 1.0, 0, &req);
    if (s == HORA_SUCCESS) s = hora_wait(req);
    hora_request_free(req);
    CHECK(s == HORA_SUCCESS && y[0] == (float)size, "world allreduce after the abort: %s (%g)",
          hora_status_string(s), (double)y[0]);
    printf("world ok %g\n", (double)y[0]);
  }
  hora_shutdown();
  return 0;
}

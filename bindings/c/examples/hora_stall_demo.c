/* SPDX-License-Identifier: Apache-2.0 */
/* What hora says when a rank does not keep up (README: When things go wrong).
     mpirun -np 3 -x HORA_STALL_WARNING_S=2 -x HORA_STALL_SHUTDOWN_S=5 hora-stall-demo skip
       rank 1 never submits grad.fc.weight; every rank keeps doing small steps meanwhile
     mpirun -np 2 -x HORA_TIMEOUT_S=3 hora-stall-demo idle
       rank 1 submits nothing for 8 s */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <hora/hora.h>

#include <stdio.h>
#include <string.h>
#include <time.h>

/* The whole time, even if a signal (SIGUSR1 for a stall report) interrupts the sleep. */
static void pause_ms(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&t, &t) != 0) {
  }
}

static hora_status_t submit(const char *name, float *data, int64_t *shape, hora_reduce_op_t op,
                            hora_request_t *request) {
  DLTensor t = {data, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, NULL, 0};
  return hora_allreduce_async(name, &t, &t, op, 1.0, 1.0, 0, request);
}

int main(int argc, char **argv) {
  const int idle = argc > 1 && strcmp(argv[1], "idle") == 0;
  if (hora_init() != HORA_SUCCESS) {
    fprintf(stderr, "hora_init: %s\n", hora_last_error());
    return 1;
  }
  static float weight[4096], waiting[1];
  int64_t weight_shape[1] = {4096}, one[1] = {1};
  hora_request_t stuck = NULL;
  if (hora_rank() != 1 &&
      submit("grad.fc.weight", weight, weight_shape, HORA_OP_AVERAGE, &stuck) != HORA_SUCCESS) {
    fprintf(stderr, "submit: %s\n", hora_last_error());
    return 1;
  }
  if (idle) {
    if (hora_rank() == 1) pause_ms(8000);
  } else {
    /* Small steps everywhere until no rank waits for grad.fc.weight any more. */
    for (int step = 0;; ++step) {
      char name[32];
      snprintf(name, sizeof name, "step.%d", step);
      int done = 1;
      if (stuck != NULL) hora_poll(stuck, &done);
      waiting[0] = done ? 0.0f : 1.0f;
      hora_request_t r = NULL;
      if (submit(name, waiting, one, HORA_OP_SUM, &r) != HORA_SUCCESS || hora_wait(r) != HORA_SUCCESS) {
        fprintf(stderr, "rank %d: %s: %s\n", hora_rank(), name, hora_last_error());
        hora_request_free(r);
        break;
      }
      hora_request_free(r);
      if (waiting[0] == 0.0f) break;
      pause_ms(20);
    }
  }
  if (stuck != NULL) {
    const hora_status_t s = hora_wait(stuck);
    printf("rank %d: grad.fc.weight -> %s: %s\n", hora_rank(), hora_status_string(s),
           s == HORA_SUCCESS ? "" : hora_last_error());
    hora_request_free(stuck);
  }
  const int rank = hora_rank();
  const hora_status_t s = hora_shutdown();
  printf("rank %d: hora_shutdown -> %s\n", rank, hora_status_string(s));
  return 0;
}

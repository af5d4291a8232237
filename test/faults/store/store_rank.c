/* SPDX-License-Identifier: Apache-2.0 */
/* One rank of the store fault tests (test_store_faults.py).
   store_rank allreduce: hora_init, one allreduce (SUM) of 256 doubles equal to $VALUE (default
     rank + 1), prints "rank R of N sum S", sleeps $HOLD_S seconds, hora_shutdown.
   store_rank cycles N: N times init / allreduce / shutdown; after each shutdown rank 0 tries to
     connect to 127.0.0.1:$MASTER_PORT and prints "cycle I: store port closed" (or "open").
   A failed hora_init prints "init failed: <status name> (<code>): <why>" and exits 2. */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <hora/hora.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int init(void) {
  hora_status_t s = hora_init();
  if (s != HORA_SUCCESS) {
    fprintf(stderr, "init failed: %s (%d): %s\n", hora_status_string(s), (int)s, hora_last_error());
    return 0;
  }
  return 1;
}

static int allreduce(double *sum_p) {
  double x[256];
  const char *v = getenv("VALUE");
  const double value = v ? atof(v) : hora_rank() + 1;
  for (int i = 0; i < 256; ++i) x[i] = value;
  int64_t shape[1] = {256};
  DLTensor t = {x, {kDLCPU, 0}, 1, {kDLFloat, 64, 1}, shape, NULL, 0};
  hora_request_t req = NULL;
  hora_status_t s = hora_allreduce_async("x", &t, &t, HORA_OP_SUM, 1.0, 1.0, 0, &req);
  if (s == HORA_SUCCESS) s = hora_wait(req);
  hora_request_free(req);
  if (s != HORA_SUCCESS) {
    fprintf(stderr, "allreduce failed: %s: %s\n", hora_status_string(s), hora_last_error());
    return 0;
  }
  for (int i = 1; i < 256; ++i) {
    if (x[i] != x[0]) {
      fprintf(stderr, "allreduce: element %d is %g, element 0 %g\n", i, x[i], x[0]);
      return 0;
    }
  }
  *sum_p = x[0];
  return 1;
}

static int port_open(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
  close(fd);
  return ok;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  const char *mode = argc > 1 ? argv[1] : "allreduce";
  const int cycles = strcmp(mode, "cycles") == 0 ? (argc > 2 ? atoi(argv[2]) : 2) : 1;
  for (int c = 0; c < cycles; ++c) {
    if (!init()) return 2;
    double sum = 0;
    if (!allreduce(&sum)) return 3;
    const int rank = hora_rank();
    printf("rank %d of %d sum %g\n", rank, hora_size(), sum);
    if (getenv("HOLD_S")) {
      const double hold = atof(getenv("HOLD_S"));
      struct timespec ts = {(time_t)hold, (long)((hold - (double)(time_t)hold) * 1e9)};
      nanosleep(&ts, NULL);
    }
    if (hora_shutdown() != HORA_SUCCESS) {
      fprintf(stderr, "shutdown failed: %s\n", hora_last_error());
      return 4;
    }
    if (strcmp(mode, "cycles") == 0 && rank == 0 && getenv("MASTER_PORT")) {
      printf("cycle %d: store port %s\n", c, port_open(atoi(getenv("MASTER_PORT"))) ? "open" : "closed");
    }
  }
  return 0;
}

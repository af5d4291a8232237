/* SPDX-License-Identifier: Apache-2.0 */
/* A hora job in which one rank dies mid-run (SIGKILL), for the launcher's failure test. */
#include <hora/hora.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

int main(void) {
  if (hora_init() != HORA_SUCCESS) {
    fprintf(stderr, "hora_init: %s\n", hora_last_error());
    return 1;
  }
  const int victim = atoi(getenv("VICTIM") ? getenv("VICTIM") : "1");
  float x[1024] = {0};
  int64_t shape[1] = {1024};
  DLTensor t = {x, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, NULL, 0};
  for (int step = 0;; ++step) {
    if (step == 20 && hora_rank() == victim) raise(SIGKILL);
    hora_request_t req;
    if (hora_allreduce_async("grad", &t, &t, HORA_OP_SUM, 1.0, 1.0, 0, &req) != HORA_SUCCESS ||
        hora_wait(req) != HORA_SUCCESS) {
      fprintf(stderr, "rank %d: %s\n", hora_rank(), hora_last_error());
      return 1;
    }
    hora_request_free(req);
  }
}

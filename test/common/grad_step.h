/* SPDX-License-Identifier: Apache-2.0 */
/* The step every fault and launcher rank program runs: allreduce "grad" in place and wait. On a
   failure it prints "rank R: step S: <status>: <hora's message>" (the line the drivers match)
   and frees the request; what the program does next is its own. */
#ifndef HORA_TEST_GRAD_STEP_H
#define HORA_TEST_GRAD_STEP_H

#include <stdio.h>

#include <hora/hora.h>

static inline hora_status_t grad_step(DLTensor *t, int rank, int step) {
  hora_request_t req = NULL;
  hora_status_t s = hora_allreduce_async("grad", t, t, HORA_OP_SUM, 1.0, 1.0, 0, &req);
  if (s == HORA_SUCCESS) s = hora_wait(req);
  if (s != HORA_SUCCESS) {
    fprintf(stderr, "rank %d: step %d: %s: %s\n", rank, step, hora_status_string(s), hora_last_error());
  }
  hora_request_free(req);
  return s;
}

#endif

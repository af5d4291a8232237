/* SPDX-License-Identifier: Apache-2.0 */
/* Built by test_install.sh with CMake against an installed hora: a world of one, one allreduce. */
#include <hora/hora.h>
#include <stdio.h>

int main(void) {
  if (hora_init() != HORA_SUCCESS) {
    fprintf(stderr, "hora_init: %s\n", hora_last_error());
    return 1;
  }
  float x[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  DLTensor t = {x, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, NULL, 0};
  hora_request_t req = NULL;
  hora_status_t s = hora_allreduce_async("x", &t, &t, HORA_OP_SUM, 1.0, 2.0, 0, &req);
  if (s == HORA_SUCCESS) {
    s = hora_wait(req);
    hora_request_free(req);
  }
  printf("consumer: rank %d of %d, %s, x = %g %g %g %g\n", hora_rank(), hora_size(),
         hora_status_string(s), x[0], x[1], x[2], x[3]);
  hora_shutdown();
  return s == HORA_SUCCESS && x[3] == 8.0f ? 0 : 1;
}

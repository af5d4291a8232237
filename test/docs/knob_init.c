/* SPDX-License-Identifier: Apache-2.0 */
/* Starts and stops hora twice in one process: what it logs about its environment, it logs once. */
#include <hora/hora.h>
#include <stdio.h>

int main(void) {
  for (int round = 0; round < 2; ++round) {
    hora_status_t s = hora_init();
    if (s != HORA_SUCCESS) {
      printf("hora_init: %s: %s\n", hora_status_string(s), hora_last_error());
      return 1;
    }
    printf("round %d: rank %d of %d\n", round, hora_rank(), hora_size());
    fflush(stdout);
    hora_shutdown();
  }
  return 0;
}

/* SPDX-License-Identifier: Apache-2.0 */
/* Prints what hora_init returned and why; exits with the status (0 = initialized). */
#include <hora/hora.h>
#include <stdio.h>

int main(void) {
  hora_status_t s = hora_init();
  printf("%s: %s\n", hora_status_string(s), s == HORA_SUCCESS ? "" : hora_last_error());
  fflush(stdout);
  if (s == HORA_SUCCESS) hora_shutdown();
  return (int)s;
}

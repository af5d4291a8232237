/* SPDX-License-Identifier: Apache-2.0 */
/* hora_timeline_start/stop from the C API: only ops between them are traced, bad paths are
   refused with a message naming the file. check_timeline.py reads what it wrote.
   Usage: timeline_api TRACE_PATH */
#include <hora/hora.h>

#include <stdio.h>
#include <string.h>

static int failures = 0;

#define CHECK(cond, ...)                          \
  do {                                            \
    if (!(cond)) {                                \
      fprintf(stderr, "timeline_api: " __VA_ARGS__); \
      fprintf(stderr, " (%s)\n", hora_last_error()); \
      ++failures;                                 \
    }                                             \
  } while (0)

static void allreduce(const char *name, float *data, int64_t n) {
  int64_t shape[1] = {n};
  DLTensor t = {data, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, NULL, 0};
  hora_request_t req = NULL;
  hora_status_t st = hora_allreduce_async(name, &t, &t, HORA_OP_SUM, 1.0, 1.0, 0, &req);
  CHECK(st == HORA_SUCCESS, "allreduce %s submit: %s", name, hora_status_string(st));
  if (st != HORA_SUCCESS) return;
  st = hora_wait(req);
  CHECK(st == HORA_SUCCESS, "allreduce %s: %s", name, hora_status_string(st));
  hora_request_free(req);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: timeline_api TRACE_PATH\n");
    return 2;
  }
  CHECK(hora_timeline_start(argv[1]) == HORA_ERR_NOT_INITIALIZED, "start before init");
  if (hora_init() != HORA_SUCCESS) {
    fprintf(stderr, "timeline_api: hora_init: %s\n", hora_last_error());
    return 1;
  }
  static float data[1 << 16];
  allreduce("untraced.before", data, 1024);

  CHECK(hora_timeline_start(NULL) == HORA_ERR_INVALID_ARGUMENT, "NULL path accepted");
  const hora_status_t bad = hora_timeline_start("/nonexistent-dir/trace.json");
  CHECK(bad == HORA_ERR_INVALID_ARGUMENT, "unwritable path: %s", hora_status_string(bad));
  CHECK(strstr(hora_last_error(), "/nonexistent-dir/trace") != NULL, "message names the file");

  CHECK(hora_timeline_start(argv[1]) == HORA_SUCCESS, "start");
  for (int step = 0; step < 3; ++step) {
    allreduce("traced.small", data, 16);
    allreduce("traced.large", data, 1 << 16);
  }
  CHECK(hora_timeline_stop() == HORA_SUCCESS, "stop");
  CHECK(hora_timeline_stop() == HORA_SUCCESS, "second stop");
  allreduce("untraced.after", data, 1024);

  CHECK(hora_shutdown() == HORA_SUCCESS, "shutdown");
  if (failures == 0) printf("timeline_api: OK\n");
  return failures == 0 ? 0 : 1;
}

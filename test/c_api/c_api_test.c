/* SPDX-License-Identifier: Apache-2.0 */
/* hora.h compiled alone as strict C99: every type, enum value and function, plus a world of one. */
#include <hora/hora.h>
#include <hora/hora.h> /* twice: the include guard must hold */

#include <stdio.h>
#include <string.h>

/* The numeric values are part of the ABI (DESIGN.md): a negative array size fails the build. */
#define C_API_CHECK(name, cond) typedef char c_api_check_##name[(cond) ? 1 : -1]
C_API_CHECK(success, HORA_SUCCESS == 0);
C_API_CHECK(invalid_argument, HORA_ERR_INVALID_ARGUMENT == 1);
C_API_CHECK(not_initialized, HORA_ERR_NOT_INITIALIZED == 2);
C_API_CHECK(duplicate_name, HORA_ERR_DUPLICATE_NAME == 3);
C_API_CHECK(mismatch, HORA_ERR_MISMATCH == 4);
C_API_CHECK(unsupported, HORA_ERR_UNSUPPORTED == 5);
C_API_CHECK(timeout, HORA_ERR_TIMEOUT == 6);
C_API_CHECK(peer_lost, HORA_ERR_PEER_LOST == 7);
C_API_CHECK(backend, HORA_ERR_BACKEND == 8);
C_API_CHECK(shut_down, HORA_ERR_SHUT_DOWN == 9);
C_API_CHECK(internal, HORA_ERR_INTERNAL == 10);
C_API_CHECK(op_sum, HORA_OP_SUM == 0);
C_API_CHECK(op_average, HORA_OP_AVERAGE == 1);
C_API_CHECK(op_min, HORA_OP_MIN == 2);
C_API_CHECK(op_max, HORA_OP_MAX == 3);
C_API_CHECK(op_product, HORA_OP_PRODUCT == 4);
/* The request handle is an opaque pointer. */
C_API_CHECK(request_is_pointer, sizeof(hora_request_t) == sizeof(struct hora_request *));

/* Pointers typed with the exact contract signatures: a changed argument type or order fails to
   compile, a missing definition fails to link. */
static hora_status_t (*const p_init)(void) = hora_init;
static hora_status_t (*const p_shutdown)(void) = hora_shutdown;
static int (*const p_is_initialized)(void) = hora_is_initialized;
static int (*const p_rank)(void) = hora_rank;
static int (*const p_size)(void) = hora_size;
static int (*const p_local_rank)(void) = hora_local_rank;
static int (*const p_local_size)(void) = hora_local_size;
static int (*const p_cross_rank)(void) = hora_cross_rank;
static int (*const p_cross_size)(void) = hora_cross_size;
static hora_status_t (*const p_allreduce)(const char *, const DLTensor *, DLTensor *,
                                          hora_reduce_op_t, double, double, int32_t,
                                          hora_request_t *) = hora_allreduce_async;
static hora_status_t (*const p_grouped_allreduce)(const char *, int, const DLTensor *, DLTensor *,
                                                  hora_reduce_op_t, double, double, int32_t,
                                                  hora_request_t *) = hora_grouped_allreduce_async;
static hora_status_t (*const p_broadcast)(const char *, DLTensor *, int, int32_t,
                                          hora_request_t *) = hora_broadcast_async;
static hora_status_t (*const p_allgather)(const char *, const DLTensor *, int32_t,
                                          hora_request_t *) = hora_allgather_async;
static hora_status_t (*const p_alltoall)(const char *, const DLTensor *, const int64_t *, int32_t,
                                         hora_request_t *) = hora_alltoall_async;
static hora_status_t (*const p_reducescatter)(const char *, const DLTensor *, hora_reduce_op_t,
                                              int32_t, hora_request_t *) = hora_reducescatter_async;
static hora_status_t (*const p_barrier)(int32_t) = hora_barrier;
static hora_status_t (*const p_join)(int32_t, int *) = hora_join;
static hora_status_t (*const p_poll)(hora_request_t, int *) = hora_poll;
static hora_status_t (*const p_wait)(hora_request_t) = hora_wait;
static const DLTensor *(*const p_request_output)(hora_request_t) = hora_request_output;
static const int64_t *(*const p_request_received_splits)(hora_request_t) =
    hora_request_received_splits;
static void (*const p_request_free)(hora_request_t) = hora_request_free;
static hora_status_t (*const p_process_set_create)(const int *, int, int32_t *) =
    hora_process_set_create;
static hora_status_t (*const p_process_set_destroy)(int32_t) = hora_process_set_destroy;
static int (*const p_process_set_rank)(int32_t) = hora_process_set_rank;
static int (*const p_process_set_size)(int32_t) = hora_process_set_size;
static hora_status_t (*const p_cuda_set_stream)(void *) = hora_cuda_set_stream;
static hora_status_t (*const p_cuda_wait)(hora_request_t, void *) = hora_cuda_wait;
static hora_status_t (*const p_timeline_start)(const char *) = hora_timeline_start;
static hora_status_t (*const p_timeline_stop)(void) = hora_timeline_stop;
static const char *(*const p_status_string)(hora_status_t) = hora_status_string;
static const char *(*const p_last_error)(void) = hora_last_error;
/* Extensions beyond DESIGN.md. */
static hora_status_t (*const p_reject)(const char *, const char *, int32_t, const char *) =
    hora_reject;
static hora_status_t (*const p_set_join_mode)(int) = hora_set_join_mode;
C_API_CHECK(join_zero_fill, HORA_JOIN_ZERO_FILL == 0);
C_API_CHECK(join_allreduce_only, HORA_JOIN_ALLREDUCE_ONLY == 1);

typedef void (*any_fn)(void);

static int failures = 0;

#define CHECK(cond)                                                                   \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      fprintf(stderr, "%s:%d: check failed: %s (last error: '%s')\n", __FILE__,      \
              __LINE__, #cond, hora_last_error() ? hora_last_error() : "(null)");     \
      ++failures;                                                                     \
    }                                                                                 \
  } while (0)

/* Every enumerator, through a switch over the type, so -Wswitch flags one the header drops. */
static int status_index(hora_status_t s) {
  switch (s) {
    case HORA_SUCCESS: return 0;
    case HORA_ERR_INVALID_ARGUMENT: return 1;
    case HORA_ERR_NOT_INITIALIZED: return 2;
    case HORA_ERR_DUPLICATE_NAME: return 3;
    case HORA_ERR_MISMATCH: return 4;
    case HORA_ERR_UNSUPPORTED: return 5;
    case HORA_ERR_TIMEOUT: return 6;
    case HORA_ERR_PEER_LOST: return 7;
    case HORA_ERR_BACKEND: return 8;
    case HORA_ERR_SHUT_DOWN: return 9;
    case HORA_ERR_INTERNAL: return 10;
  }
  return -1;
}

static int op_index(hora_reduce_op_t op) {
  switch (op) {
    case HORA_OP_SUM: return 0;
    case HORA_OP_AVERAGE: return 1;
    case HORA_OP_MIN: return 2;
    case HORA_OP_MAX: return 3;
    case HORA_OP_PRODUCT: return 4;
  }
  return -1;
}

int main(void) {
  const any_fn fns[] = {
      (any_fn)p_init, (any_fn)p_shutdown, (any_fn)p_is_initialized, (any_fn)p_rank,
      (any_fn)p_size, (any_fn)p_local_rank, (any_fn)p_local_size, (any_fn)p_cross_rank,
      (any_fn)p_cross_size, (any_fn)p_allreduce, (any_fn)p_grouped_allreduce,
      (any_fn)p_broadcast, (any_fn)p_allgather, (any_fn)p_alltoall, (any_fn)p_reducescatter,
      (any_fn)p_barrier, (any_fn)p_join, (any_fn)p_poll, (any_fn)p_wait,
      (any_fn)p_request_output, (any_fn)p_request_received_splits, (any_fn)p_request_free,
      (any_fn)p_process_set_create, (any_fn)p_process_set_destroy, (any_fn)p_process_set_rank,
      (any_fn)p_process_set_size, (any_fn)p_cuda_set_stream, (any_fn)p_cuda_wait,
      (any_fn)p_timeline_start, (any_fn)p_timeline_stop,
      (any_fn)p_status_string, (any_fn)p_last_error, (any_fn)p_reject, (any_fn)p_set_join_mode};
  const hora_status_t statuses[] = {
      HORA_SUCCESS, HORA_ERR_INVALID_ARGUMENT, HORA_ERR_NOT_INITIALIZED,
      HORA_ERR_DUPLICATE_NAME, HORA_ERR_MISMATCH, HORA_ERR_UNSUPPORTED, HORA_ERR_TIMEOUT,
      HORA_ERR_PEER_LOST, HORA_ERR_BACKEND, HORA_ERR_SHUT_DOWN, HORA_ERR_INTERNAL};
  const hora_reduce_op_t ops[] = {HORA_OP_SUM, HORA_OP_AVERAGE, HORA_OP_MIN, HORA_OP_MAX,
                                  HORA_OP_PRODUCT};
  float data[3] = {1.5f, -2.0f, 4.25f};
  const float expected[3] = {1.5f, -2.0f, 4.25f};
  int64_t shape[1] = {3};
  DLTensor t;
  hora_request_t req = NULL;
  struct hora_request *same = NULL; /* the struct tag is usable as an incomplete type */
  size_t i;
  int done = 0;

  for (i = 0; i < sizeof fns / sizeof fns[0]; ++i) CHECK(fns[i] != NULL);
  for (i = 0; i < sizeof statuses / sizeof statuses[0]; ++i) {
    const char *s = hora_status_string(statuses[i]);
    CHECK(status_index(statuses[i]) == (int)i);
    CHECK(s != NULL && s[0] != '\0');
  }
  for (i = 0; i < sizeof ops / sizeof ops[0]; ++i) CHECK(op_index(ops[i]) == (int)i);

  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.device.device_id = 0;
  t.ndim = 1;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  t.strides = NULL;
  t.byte_offset = 0;

  /* Before init: -1 topology, and calls report NOT_INITIALIZED instead of crashing. */
  CHECK(hora_is_initialized() == 0);
  CHECK(hora_rank() == -1);
  CHECK(hora_size() == -1);
  CHECK(hora_local_rank() == -1);
  CHECK(hora_local_size() == -1);
  CHECK(hora_cross_rank() == -1);
  CHECK(hora_cross_size() == -1);
  CHECK(hora_last_error() != NULL);
  CHECK(hora_allreduce_async("c.before", &t, &t, HORA_OP_SUM, 1.0, 1.0, 0, &req) ==
        HORA_ERR_NOT_INITIALIZED);
  CHECK(hora_shutdown() == HORA_ERR_NOT_INITIALIZED);
  CHECK(hora_reject("allreduce", "c.before", 0, "why") == HORA_ERR_NOT_INITIALIZED);
  /* The join mode is the process's: settable before init, and only to the two modes. */
  CHECK(p_set_join_mode(2) == HORA_ERR_INVALID_ARGUMENT);
  CHECK(p_set_join_mode(HORA_JOIN_ALLREDUCE_ONLY) == HORA_SUCCESS);
  CHECK(p_set_join_mode(HORA_JOIN_ZERO_FILL) == HORA_SUCCESS);

  /* A world of one: no launcher in this test's environment. */
  CHECK(p_init() == HORA_SUCCESS);
  CHECK(hora_is_initialized() == 1);
  CHECK(hora_rank() == 0);
  CHECK(hora_size() == 1);
  CHECK(hora_local_rank() == 0 && hora_local_size() == 1);
  CHECK(hora_cross_rank() == 0 && hora_cross_size() == 1);

  req = NULL;
  CHECK(hora_allreduce_async("c.sum", &t, &t, HORA_OP_SUM, 1.0, 1.0, 0, &req) == HORA_SUCCESS);
  if (req != NULL) {
    same = req;
    CHECK(hora_wait(same) == HORA_SUCCESS);
    CHECK(hora_poll(req, &done) == HORA_SUCCESS && done == 1);
    CHECK(memcmp(data, expected, sizeof data) == 0);
    hora_request_free(req);
  }

  /* A refusal told to a world of one fails nobody's op; the name is free again right after. */
  CHECK(p_reject("allreduce", "c.sum", 0, "refused by the caller") == HORA_SUCCESS);
  CHECK(p_reject("grouped_allreduce", NULL, 0, NULL) == HORA_SUCCESS);
  CHECK(p_reject("allreduse", "c.sum", 0, "typo") == HORA_ERR_INVALID_ARGUMENT);
  CHECK(p_reject("allreduce", "c.sum", 12345, "no such set") == HORA_ERR_INVALID_ARGUMENT);
  req = NULL;
  CHECK(hora_allreduce_async("c.sum", &t, &t, HORA_OP_SUM, 1.0, 1.0, 0, &req) == HORA_SUCCESS);
  if (req != NULL) {
    CHECK(hora_wait(req) == HORA_SUCCESS);
    CHECK(memcmp(data, expected, sizeof data) == 0);
    hora_request_free(req);
  }

  CHECK(hora_shutdown() == HORA_SUCCESS);
  CHECK(hora_is_initialized() == 0);
  CHECK(hora_rank() == -1);

  if (failures != 0) {
    fprintf(stderr, "c_api_test: %d check(s) failed\n", failures);
    return 1;
  }
  printf("c_api_test: ok\n");
  return 0;
}

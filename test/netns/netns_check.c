/* SPDX-License-Identifier: Apache-2.0 */
/* A rank of the cluster tests: topology as the hosts imply it, and collectives across hosts.
   Usage: netns_check [HOSTS] (default 2). Ranks [0, size/HOSTS) are on the first host, etc. */
#include <hora/hora.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;
#define CHECK(cond, ...)                                          \
  do {                                                            \
    if (!(cond)) {                                                \
      fprintf(stderr, "rank %d: check failed: ", hora_rank());    \
      fprintf(stderr, __VA_ARGS__);                               \
      fprintf(stderr, "\n");                                      \
      ++failures;                                                 \
    }                                                             \
  } while (0)
#define OK(call)                                                                          \
  do {                                                                                    \
    hora_status_t s_ = (call);                                                            \
    if (s_ != HORA_SUCCESS) {                                                             \
      fprintf(stderr, "rank %d: %s: %s: %s\n", hora_rank(), #call, hora_status_string(s_), \
              hora_last_error());                                                         \
      return 1;                                                                           \
    }                                                                                     \
  } while (0)

int main(int argc, char **argv) {
  const int hosts = argc > 1 ? atoi(argv[1]) : 2;
  OK(hora_init());
  const int rank = hora_rank(), size = hora_size();
  if (hosts < 1 || size % hosts != 0 || size > 32) {
    fprintf(stderr, "netns_check: %d ranks cannot be spread evenly over %d hosts\n", size, hosts);
    return 2;
  }
  const int perHost = size / hosts;
  CHECK(hora_local_size() == perHost, "local_size %d, expected %d", hora_local_size(), perHost);
  CHECK(hora_local_rank() == rank % perHost, "local_rank %d, expected %d", hora_local_rank(),
        rank % perHost);
  CHECK(hora_cross_size() == hosts, "cross_size %d, expected %d", hora_cross_size(), hosts);
  CHECK(hora_cross_rank() == rank / perHost, "cross_rank %d, expected %d", hora_cross_rank(),
        rank / perHost);

  /* allreduce: 100k floats (several TCP segments), every element distinct. */
  enum { N = 100000 };
  static float x[N];
  for (int i = 0; i < N; ++i) x[i] = (float)(rank + 1) * (float)(i % 1000);
  int64_t shape[1] = {N};
  DLTensor t = {x, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, NULL, 0};
  hora_request_t req;
  OK(hora_allreduce_async("grad", &t, &t, HORA_OP_SUM, 1.0, 1.0, 0, &req));
  OK(hora_wait(req));
  hora_request_free(req);
  const float factor = (float)size * (size + 1) / 2.0f;
  int wrong = 0;
  for (int i = 0; i < N; ++i) wrong += x[i] != factor * (float)(i % 1000);
  CHECK(wrong == 0, "allreduce: %d wrong values", wrong);

  /* allgather: rank r contributes r rows of [r, 2] int64 = r*10 + column. */
  int64_t rows[2] = {rank, 2};
  int64_t mine[64];
  for (int i = 0; i < rank * 2; ++i) mine[i] = rank * 10 + i % 2;
  DLTensor g = {mine, {kDLCPU, 0}, 2, {kDLInt, 64, 1}, rows, NULL, 0};
  OK(hora_allgather_async("rows", &g, 0, &req));
  OK(hora_wait(req));
  const DLTensor *out = hora_request_output(req);
  int64_t pos = 0;
  for (int r = 0; r < size; ++r)
    for (int i = 0; i < r * 2; ++i, ++pos)
      CHECK(((int64_t *)out->data)[pos] == r * 10 + i % 2, "allgather element %ld", (long)pos);
  CHECK(out->shape[0] == (int64_t)size * (size - 1) / 2, "allgather rows %ld", (long)out->shape[0]);
  hora_request_free(req);

  /* a process set with one rank of each host */
  int pair[2] = {0, size - 1};
  int32_t ps;
  OK(hora_process_set_create(pair, 2, &ps));
  if (rank == 0 || rank == size - 1) {
    double v = rank;
    int64_t one[1] = {1};
    DLTensor d = {&v, {kDLCPU, 0}, 1, {kDLFloat, 64, 1}, one, NULL, 0};
    OK(hora_broadcast_async("from.b", &d, 1, ps, &req));
    OK(hora_wait(req));
    hora_request_free(req);
    CHECK(v == size - 1, "broadcast in the set gave %g", v);
  }
  OK(hora_barrier(0));
  OK(hora_shutdown());
  if (rank == 0) printf("netns: %d ranks on %d hosts: %s\n", size, hosts, failures ? "FAIL" : "OK");
  return failures ? 1 : 0;
}

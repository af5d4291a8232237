/* SPDX-License-Identifier: Apache-2.0 */
/* A simulated data-parallel training loop written only against <hora/hora.h>: run it with
   `mpirun -np 4 hora-example [steps]`. */

#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include <hora/hora.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { kTensors = 300, kDefaultSteps = 5, kParams = 4 };

/* Any failed hora call ends this rank at once; mpirun then stops the others. */
#define CHECK(call)                                                                          \
  do {                                                                                       \
    hora_status_t st_ = (call);                                                              \
    if (st_ != HORA_SUCCESS) {                                                               \
      fprintf(stderr, "[rank %d] %s:%d: %s failed: %s: %s\n", hora_rank(), __FILE__,         \
              __LINE__, #call, hora_status_string(st_), hora_last_error());                  \
      exit(2);                                                                               \
    }                                                                                        \
  } while (0)

typedef struct {
  char name[48];
  int64_t shape[2];
  int ndim;
  int64_t numel;
  int in_place;
  float *in;
  float *out;
  DLTensor in_t;
  DLTensor out_t;
  hora_request_t req;
} Grad;

static DLTensor make_tensor(void *data, int ndim, int64_t *shape, uint8_t code, uint8_t bits) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.device.device_id = 0;
  t.ndim = ndim;
  t.dtype.code = code;
  t.dtype.bits = bits;
  t.dtype.lanes = 1;
  t.shape = shape;
  t.strides = NULL; /* compact row-major */
  t.byte_offset = 0;
  return t;
}

static void *xmalloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) {
    fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
    exit(2);
  }
  return p;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Expected average of element j of tensor i at a step: {1, 1.25} x 2^p, p < 8. Rank r contributes
   this plus (2r - (n-1)) / 2, so every input and every partial sum is a multiple of 0.25 far below
   2^24 (exact in float32), the sum is exactly n times the expected value, and dividing it by n, or
   multiplying it by a rounded 1/n, gives the expected value back exactly for the ranks we run. */
static float expected_avg(int i, int64_t j, int step) {
  unsigned h = (unsigned)((i * 31 + j * 7 + step * 13) & 15);
  return (float)((1.0 + 0.25 * (h & 1u)) * (double)(1u << (h >> 1)));
}

static float rank_offset(int rank, int size) { return 0.5f * (float)(2 * rank - (size - 1)); }

/* Shapes loosely like a CNN's: every third tensor a weight matrix (a few large ones), the others
   biases and normalisation scales. */
static void grad_shape(int i, Grad *g) {
  if (i % 3 == 0) {
    int64_t rows = (i % 50 == 0) ? 1024 : 8 * (1 + (i * 7919) % 97);
    int64_t cols = (i % 50 == 0) ? 128 : 32 + 32 * (i % 4);
    g->ndim = 2;
    g->shape[0] = rows;
    g->shape[1] = cols;
    snprintf(g->name, sizeof g->name, "layer%03d.weight", i / 3);
  } else {
    g->ndim = 1;
    g->shape[0] = 64 * (1 + (i * 131) % 8);
    g->shape[1] = 1;
    snprintf(g->name, sizeof g->name, "layer%03d.%s", i / 3, i % 3 == 1 ? "bias" : "norm.scale");
  }
  g->numel = g->shape[0] * (g->ndim == 2 ? g->shape[1] : 1);
}

int main(int argc, char **argv) {
  int steps = argc > 1 ? atoi(argv[1]) : kDefaultSteps;
  if (steps < 1) {
    fprintf(stderr, "usage: %s [steps >= 1]\n", argv[0]);
    return 1;
  }

  CHECK(hora_init());
  const int rank = hora_rank();
  const int size = hora_size();
  int64_t wrong = 0;

  /* 1. Start from the same parameters everywhere: broadcast rank 0's. */
  static const int64_t param_numel[kParams] = {3, 4096, 65536, 262144};
  float *params[kParams];
  DLTensor param_t[kParams];
  int64_t param_shape[kParams];
  hora_request_t preq[kParams];
  for (int p = 0; p < kParams; ++p) {
    param_shape[p] = param_numel[p];
    params[p] = xmalloc((size_t)param_numel[p] * sizeof(float));
    for (int64_t j = 0; j < param_numel[p]; ++j)
      params[p][j] = rank == 0 ? (float)((j * 37 + p) % 1001) * 0.125f : -1.0f;
    param_t[p] = make_tensor(params[p], 1, &param_shape[p], kDLFloat, 32);
    char name[32];
    snprintf(name, sizeof name, "init.param%d", p);
    CHECK(hora_broadcast_async(name, &param_t[p], 0, 0, &preq[p]));
  }
  for (int p = 0; p < kParams; ++p) {
    CHECK(hora_wait(preq[p]));
    hora_request_free(preq[p]);
    for (int64_t j = 0; j < param_numel[p]; ++j)
      wrong += params[p][j] != (float)((j * 37 + p) % 1001) * 0.125f;
  }
  const int64_t wrong_bcast = wrong;

  /* 2. Each rank holds a different number of samples: allgather the counts, then the rows. */
  int64_t my_rows = rank + 1, one = 1;
  DLTensor count_t = make_tensor(&my_rows, 1, &one, kDLInt, 64);
  hora_request_t creq;
  CHECK(hora_allgather_async("data.row_counts", &count_t, 0, &creq));
  CHECK(hora_wait(creq));
  const DLTensor *counts = hora_request_output(creq);
  int64_t total_rows = 0;
  if (!counts || counts->ndim != 1 || counts->shape[0] != size) {
    ++wrong;
  } else {
    for (int r = 0; r < size; ++r) {
      int64_t c = ((const int64_t *)counts->data)[r];
      wrong += c != r + 1;
      total_rows += c;
    }
  }
  hora_request_free(creq);

  int64_t row_shape[2] = {my_rows, 3};
  int32_t *rows = xmalloc((size_t)my_rows * 3 * sizeof(int32_t));
  for (int64_t k = 0; k < my_rows * 3; ++k) rows[k] = rank * 1000 + (int32_t)k;
  DLTensor rows_t = make_tensor(rows, 2, row_shape, kDLInt, 32);
  hora_request_t rreq;
  CHECK(hora_allgather_async("data.rows", &rows_t, 0, &rreq));
  CHECK(hora_wait(rreq));
  const DLTensor *all_rows = hora_request_output(rreq);
  if (!all_rows || all_rows->ndim != 2 || all_rows->shape[0] != total_rows ||
      all_rows->shape[1] != 3) {
    ++wrong;
  } else {
    const int32_t *v = all_rows->data;
    for (int r = 0, at = 0; r < size; at += 3 * (r + 1), ++r)
      for (int k = 0; k < 3 * (r + 1); ++k) wrong += v[at + k] != r * 1000 + k;
  }
  hora_request_free(rreq);
  free(rows);
  const int64_t wrong_gather = wrong - wrong_bcast;

  /* 3. Training steps: every gradient averaged, submitted in a different order on each rank. */
  Grad *g = xmalloc(kTensors * sizeof(Grad));
  int64_t total_numel = 0;
  for (int i = 0; i < kTensors; ++i) {
    grad_shape(i, &g[i]);
    g[i].in_place = i % 2;
    g[i].in = xmalloc((size_t)g[i].numel * sizeof(float));
    g[i].out = g[i].in_place ? g[i].in : xmalloc((size_t)g[i].numel * sizeof(float));
    g[i].in_t = make_tensor(g[i].in, g[i].ndim, g[i].shape, kDLFloat, 32);
    g[i].out_t = make_tensor(g[i].out, g[i].ndim, g[i].shape, kDLFloat, 32);
    total_numel += g[i].numel;
  }
  int order[kTensors];
  for (int i = 0; i < kTensors; ++i) order[i] = i;
  uint64_t rng = 0x5EED0000ull + (uint64_t)rank;
  const float offset = rank_offset(rank, size);
  double step_time[2] = {0.0, 0.0}; /* first step (negotiation), mean of the later ones */

  for (int step = 0; step < steps; ++step) {
    for (int i = 0; i < kTensors; ++i) /* the "backward pass" */
      for (int64_t j = 0; j < g[i].numel; ++j) g[i].in[j] = expected_avg(i, j, step) + offset;
    for (int i = kTensors - 1; i > 0; --i) {
      int k = (int)(splitmix64(&rng) % (uint64_t)(i + 1));
      int t = order[i];
      order[i] = order[k];
      order[k] = t;
    }

    const double t0 = now_s();
    for (int n = 0; n < kTensors; ++n) {
      Grad *x = &g[order[n]];
      CHECK(hora_allreduce_async(x->name, &x->in_t, &x->out_t, HORA_OP_AVERAGE, 1.0, 1.0, 0,
                                 &x->req));
    }
    for (int n = 0; n < kTensors; ++n) {
      Grad *x = &g[order[n]];
      CHECK(hora_wait(x->req));
      hora_request_free(x->req);
    }
    const double dt = now_s() - t0;
    if (step == 0) step_time[0] = dt;
    else step_time[1] += dt / (steps - 1);

    for (int i = 0; i < kTensors; ++i)
      for (int64_t j = 0; j < g[i].numel; ++j) wrong += g[i].out[j] != expected_avg(i, j, step);
  }
  const int64_t wrong_grads = wrong - wrong_bcast - wrong_gather;

  /* 4. Agree on the verdict and the slowest rank's times, through hora itself. */
  int64_t shape3 = 3, shape2 = 2;
  int64_t wrong_all[3] = {wrong_bcast, wrong_gather, wrong_grads};
  DLTensor wrong_tensor = make_tensor(wrong_all, 1, &shape3, kDLInt, 64);
  DLTensor time_tensor = make_tensor(step_time, 1, &shape2, kDLFloat, 64);
  hora_request_t wreq, treq;
  CHECK(hora_allreduce_async("summary.wrong", &wrong_tensor, &wrong_tensor, HORA_OP_SUM, 1.0, 1.0,
                             0, &wreq));
  CHECK(hora_allreduce_async("summary.time", &time_tensor, &time_tensor, HORA_OP_MAX, 1.0, 1.0, 0,
                             &treq));
  CHECK(hora_wait(wreq));
  CHECK(hora_wait(treq));
  hora_request_free(wreq);
  hora_request_free(treq);
  const int ok = wrong_all[0] == 0 && wrong_all[1] == 0 && wrong_all[2] == 0;

  if (rank == 0) {
    const double mib = (double)total_numel * 4.0 / (1024.0 * 1024.0);
    printf("hora-example: %d ranks, %d gradient tensors (%" PRId64
           " float32, %.1f MiB), %d steps\n",
           size, kTensors, total_numel, mib, steps);
    char what[64];
    snprintf(what, sizeof what, "%d parameter tensors from rank 0", kParams);
    printf("  broadcast  %-42s %s\n", what, wrong_all[0] ? "FAIL" : "ok");
    snprintf(what, sizeof what, "row counts, then %" PRId64 " rows x 3", total_rows);
    printf("  allgather  %-42s %s\n", what, wrong_all[1] ? "FAIL" : "ok");
    printf("  allreduce  %-42s %s (%" PRId64 " wrong values)\n",
           "average, submitted in a per-rank order", wrong_all[2] ? "FAIL" : "ok", wrong_all[2]);
    printf("  step time  first %.2f ms", step_time[0] * 1e3);
    if (steps > 1)
      printf(", then %.2f ms (%.2f GB/s of gradients)", step_time[1] * 1e3,
             (double)total_numel * 4.0 / step_time[1] / 1e9);
    printf("  [slowest rank]\n");
    printf("hora-example: %s\n", ok ? "OK" : "FAIL");
    fflush(stdout);
  }

  for (int i = 0; i < kTensors; ++i) {
    if (!g[i].in_place) free(g[i].out);
    free(g[i].in);
  }
  free(g);
  for (int p = 0; p < kParams; ++p) free(params[p]);
  CHECK(hora_shutdown());
  return ok ? 0 : 1;
}

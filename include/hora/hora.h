/* SPDX-License-Identifier: Apache-2.0 */
/* hora: the stable C ABI. Compiles as C99 and as C++. Tensors are DLPack DLTensors. */
#ifndef HORA_HORA_H_
#define HORA_HORA_H_

#include <stdint.h>
#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define HORA_API
#else
#define HORA_API __attribute__((visibility("default")))
#endif

/* Every call returns one of these. Blast radius: INVALID_ARGUMENT, DUPLICATE_NAME, MISMATCH and
   UNSUPPORTED fail one op and the runtime stays usable; PEER_LOST, BACKEND and INTERNAL poison the
   runtime (shut it down and init again); SHUT_DOWN means the runtime is no longer running. */
typedef enum {
  HORA_SUCCESS = 0,
  HORA_ERR_INVALID_ARGUMENT = 1, /* caller error; nothing was enqueued                       */
  HORA_ERR_NOT_INITIALIZED  = 2,
  HORA_ERR_DUPLICATE_NAME   = 3, /* a request of that name is already in flight on this rank */
  HORA_ERR_MISMATCH         = 4, /* ranks disagree on dtype/shape/op/root/scale/device; this
                                    op failed on every rank, the runtime stays usable       */
  HORA_ERR_UNSUPPORTED      = 5, /* e.g. a CUDA tensor without NCCL, AVERAGE on an int dtype */
  HORA_ERR_TIMEOUT          = 6,
  HORA_ERR_PEER_LOST        = 7, /* a rank died or left; the runtime is poisoned            */
  HORA_ERR_BACKEND          = 8, /* MPI, Gloo, NCCL or CUDA reported an error                 */
  HORA_ERR_SHUT_DOWN        = 9, /* the runtime shut down before the op finished            */
  HORA_ERR_INTERNAL         = 10
} hora_status_t;

typedef enum {
  HORA_OP_SUM = 0,
  HORA_OP_AVERAGE,
  HORA_OP_MIN,
  HORA_OP_MAX,
  HORA_OP_PRODUCT
} hora_reduce_op_t;

/* One in-flight collective. Owned by the caller from a successful *_async call until
   hora_request_free; it stays valid across hora_shutdown (its op then completes with
   HORA_ERR_SHUT_DOWN). A handle is checked, never dereferenced: a freed or made-up handle makes
   hora_poll and hora_wait return HORA_ERR_INVALID_ARGUMENT (hora_last_error names the call),
   hora_request_output and hora_request_received_splits return NULL, and hora_request_free does
   nothing (a double free records the error and does not crash). */
typedef struct hora_request *hora_request_t;

/* Forms the world (MPI launcher, env:// variables, Slurm, or a world of one; HORA_BOOTSTRAP
   overrides) and starts the engine thread. Blocks until the engine reports its init status and
   returns that status. On a running runtime: returns HORA_SUCCESS and does nothing. */
HORA_API hora_status_t hora_init(void);
/* Stops the engine: every pending request completes with HORA_ERR_SHUT_DOWN. Collective: every
   rank should call it. Finalizes MPI only if hora initialized it, and only at process exit, so
   hora_init may start a new runtime afterwards. Returns HORA_ERR_NOT_INITIALIZED if not running. */
HORA_API hora_status_t hora_shutdown(void);
/* 1 while the runtime runs, else 0. */
HORA_API int hora_is_initialized(void);
/* Elastic jobs (horarun --min-np/--max-np): 1 when horarun's agents are forming a new world (a
   worker waits to join, or one was lost), so the ranks should reach a consistent point, then call
   hora_shutdown() and hora_init() to join it; 0 when not, when not initialized, or outside an
   elastic job. Asks the agents' store (one round trip); not collective, so ranks may see the
   change at different times: agree on it (a broadcast from rank 0) before acting. -1 when the
   agents' store cannot be reached (hora_last_error says why). After
   HORA_ERR_PEER_LOST or HORA_ERR_TIMEOUT in an elastic job, hora_shutdown() then hora_init()
   joins the next world with the survivors; hora_rank() and hora_size() then describe it. */
HORA_API int hora_elastic_world_changed(void);
/* Topology of the world. -1 when not initialized. local = same host; cross = ranks with the same
   local rank across hosts. */
HORA_API int hora_rank(void);
HORA_API int hora_size(void);
HORA_API int hora_local_rank(void);
HORA_API int hora_local_size(void);
HORA_API int hora_cross_rank(void);
HORA_API int hora_cross_size(void);

/* name: matching key across ranks; NULL = auto-named by call order within the process set.
   input/output: DLTensor, contiguous (strides NULL or compact), CPU (kDLCPU) or CUDA (kDLCUDA);
   output may be input (in place). process_set: 0 = all ranks.
   dtypes (lanes 1): uint8, int8, int16, int32, int64 (kDLUInt/kDLInt), float16, float32, float64
   (kDLFloat), bfloat16 (kDLBfloat 16) and bool (DLPack type code 6, kDLBool, 8 bits: any nonzero
   byte is true). Integers reduce with wrap-around; bool's SUM and MAX are logical OR, MIN and
   PRODUCT logical AND, and every reduced byte is 0 or 1. AVERAGE and scale factors other than 1
   take floating dtypes only (HORA_ERR_UNSUPPORTED otherwise). On CUDA, int16 moves (broadcast,
   allgather, alltoall) but does not reduce: NCCL has no 16-bit integer (HORA_ERR_UNSUPPORTED).
   The tensors' memory must stay valid and untouched until the request completes. Non-blocking:
   on success *request_p is a new request; on failure nothing was enqueued. */
HORA_API hora_status_t hora_allreduce_async(const char *name, const DLTensor *input,
                                            DLTensor *output, hora_reduce_op_t op,
                                            double prescale, double postscale,
                                            int32_t process_set, hora_request_t *request_p);
/* n tensors negotiated, fused and completed as one unit; one request for all of them. */
HORA_API hora_status_t hora_grouped_allreduce_async(const char *name, int n,
                                                    const DLTensor *inputs, DLTensor *outputs,
                                                    hora_reduce_op_t op, double prescale,
                                                    double postscale, int32_t process_set,
                                                    hora_request_t *request_p);
/* In place: root's tensor is copied into every other rank's tensor. root is a rank of the
   process set (its rank within the set). */
HORA_API hora_status_t hora_broadcast_async(const char *name, DLTensor *tensor, int root,
                                            int32_t process_set, hora_request_t *request_p);
/* output shape: first dimension = sum over ranks; other dimensions must agree.
   The output is allocated by hora and read with hora_request_output after hora_wait. */
HORA_API hora_status_t hora_allgather_async(const char *name, const DLTensor *input,
                                            int32_t process_set, hora_request_t *request_p);
/* splits[i] = rows of input's first dimension sent to rank i (within the process set);
   NULL = even split, and the first dimension must then divide by the set's size */
HORA_API hora_status_t hora_alltoall_async(const char *name, const DLTensor *input,
                                           const int64_t *splits, int32_t process_set,
                                           hora_request_t *request_p);
/* rank i receives the i-th block of the first dimension: rows / size rows each, and the first
   (rows % size) ranks one row more */
HORA_API hora_status_t hora_reducescatter_async(const char *name, const DLTensor *input,
                                                hora_reduce_op_t op, int32_t process_set,
                                                hora_request_t *request_p);
/* Blocks until every rank of the process set has called it. */
HORA_API hora_status_t hora_barrier(int32_t process_set);
/* join: this rank has no more data; ops of others complete with zeros as its contribution.
   Blocks until every rank of the set has joined; *last_joined_rank_p (may be NULL) gets the
   last rank to join. */
HORA_API hora_status_t hora_join(int32_t process_set, int *last_joined_rank_p);

/* Never blocks: *done_p = 1 once the request has completed (successfully or not). */
HORA_API hora_status_t hora_poll(hora_request_t request, int *done_p);
/* Blocks until the request completes; returns the op's own status (hora_last_error says why). */
HORA_API hora_status_t hora_wait(hora_request_t request);
/* after a successful wait: output of allgather / alltoall / reducescatter, owned by the request */
HORA_API const DLTensor *hora_request_output(hora_request_t request);
/* alltoall only: rows received from each rank of the set, owned by the request */
HORA_API const int64_t *hora_request_received_splits(hora_request_t request);
/* Releases the request and whatever it owns. A request still in flight is released once it
   completes (its tensors must then stay valid until then). NULL is ignored; a handle that is
   not live (freed already, or never returned by hora) is ignored with hora_last_error set. */
HORA_API void hora_request_free(hora_request_t request);

/* Collective over the world: every rank calls it with the same ranks. Returns the set's id;
   creating a set that exists returns its id. */
HORA_API hora_status_t hora_process_set_create(const int *ranks, int nranks, int32_t *id_p);
HORA_API hora_status_t hora_process_set_destroy(int32_t id);
/* This rank's rank within the set and the set's size; -1 if unknown or not a member. */
HORA_API int hora_process_set_rank(int32_t id);
HORA_API int hora_process_set_size(int32_t id);
/* Not collective: stops process set `id` on this rank at once, as a failure (as NCCL's
   ncclCommAbort does a communicator; torch's "hora" backend calls it when an op outlives the
   group's timeout). Every request of the set on this rank completes with `status` (an error
   status; HORA_ERR_TIMEOUT for a timeout) and a message ending in `reason`; later calls on the
   set fail at once. The set's other ranks fail their current or next collective on it, and
   their message says that this rank aborted it and why. Returns once hora touches no tensor of
   the set's requests any more: HORA_SUCCESS (also when the set had stopped already), or
   HORA_ERR_TIMEOUT if an operation moving data could not be stopped within HORA_TIMEOUT_S (it
   ends at its own deadline). Set 0 is the world: the runtime fails on this rank as after a lost
   peer, and hora_shutdown is still to be called. */
HORA_API hora_status_t hora_process_set_abort(int32_t id, hora_status_t status, const char *reason);

/* CUDA tensors: the stream (a cudaStream_t, or NULL for the legacy default stream, the default)
   whose queued work this thread's later submissions wait for. At submission hora records an
   event on it; its own NCCL work runs on a stream of its own, after that event, and a request is
   complete once the result is on the device, visible to every stream. A framework passes its
   current stream before each submission (PyTorch: torch.cuda.current_stream().cuda_stream).
   HORA_ERR_UNSUPPORTED in a build without NCCL. Not collective. */
HORA_API hora_status_t hora_cuda_set_stream(void *stream);
/* Stream-ordered wait, as torch's work.wait() on an NCCL op: returns once the op's device work
   is queued, having made `stream` (a cudaStream_t; NULL: the legacy default stream) wait for its
   end, so that work queued on `stream` afterwards sees the result while the host goes on at once.
   HORA_SUCCESS then; the op's own status if it completed before that (an error, or a CPU
   request: for those it is hora_wait). hora_wait and hora_poll keep their meaning (the result is
   on the device), and a request waited for here is still freed with hora_request_free; an output
   (allgather, alltoall, reducescatter) may be read after either wait. A failure the device
   reports after the launch (a peer lost while NCCL runs) completes the request with that status
   for hora_poll and hora_wait; the stream goes on, and the tensors may hold partial results, as
   with NCCL itself. Not collective. */
HORA_API hora_status_t hora_cuda_wait(hora_request_t request, void *stream);

/* Chrome-trace JSON timeline of every op, written by this process. */
HORA_API hora_status_t hora_timeline_start(const char *path);
HORA_API hora_status_t hora_timeline_stop(void);

/* Static string naming the status class, e.g. "invalid argument". */
HORA_API const char *hora_status_string(hora_status_t status);
/* thread-local: why the last failed call on this thread failed ("" if none). Valid until the next
   hora call on this thread. */
HORA_API const char *hora_last_error(void);

/* ---- Extensions beyond DESIGN.md ------------------------------------------------------------ */

/* A rank that gives up an op before submitting it tells the other ranks of the set, so that
   their op of the same name fails promptly (HORA_ERR_MISMATCH, naming this rank and its
   reason) instead of waiting for it. hora's own op calls do this for every error they return
   once the op's set is known (not for HORA_ERR_DUPLICATE_NAME); bindings call it for errors
   they raise themselves before reaching hora. `op`: "allreduce", "allgather", "broadcast",
   "alltoall", "reducescatter", "grouped_allreduce" (the name the error messages use). `name`
   NULL or "": the op would have been named by call order, and that name is used up. `reason`
   (NULL: none given) is quoted in the other ranks' error. Never blocks. A later submission of
   the same name on this rank waits for the refusal to be negotiated, then goes ahead in order.
   HORA_ERR_DUPLICATE_NAME if this rank has a request of that name in flight (one it submitted,
   not one it refused);
   HORA_ERR_INVALID_ARGUMENT for an unknown op or process set, or a set without this rank. */
HORA_API hora_status_t hora_reject(const char *op, const char *name, int32_t process_set,
                                   const char *reason);

/* How ops other than allreduce treat ranks of the set that have joined (hora_join). */
#define HORA_JOIN_ZERO_FILL 0      /* default: a joined rank takes part with zeros / no rows */
#define HORA_JOIN_ALLREDUCE_ONLY 1 /* Horovod's: allgather, broadcast, alltoall and
                                      reducescatter fail (HORA_ERR_UNSUPPORTED) on every rank
                                      while a rank of the set has joined */
/* Per process (also before hora_init, kept across hora_shutdown); every rank sets the same, and
   a rank that asks for HORA_JOIN_ALLREDUCE_ONLY gets it for the ops it takes part in.
   HORA_ERR_INVALID_ARGUMENT for another mode. Not collective. */
HORA_API hora_status_t hora_set_join_mode(int mode);

#ifdef __cplusplus
}
#endif

#endif /* HORA_HORA_H_ */

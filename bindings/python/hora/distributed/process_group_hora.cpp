// SPDX-License-Identifier: Apache-2.0
// ProcessGroupHora: each torch collective becomes one hora request; a watcher thread completes them.

// Python's header goes first (it sets feature macros). The destructor releases the GIL while it
// waits for the watcher thread, which may be running a Python callback.
#include <Python.h>

#include "process_group_hora.h"

#include <pthread.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

// HORA_TORCH_CUDA (meson): torch was built with CUDA and hora with NCCL. CUDA tensors then go to
// hora's NCCL path; without it they are refused, as every device but the CPU.
#if HORA_TORCH_CUDA
#include <c10/core/StreamGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace hora {
namespace dist {
namespace {

// Torch calls are checked here before anything reaches hora, and fail with hora's statuses so that
// Python raises the same exception classes as hora's own bindings do.
[[noreturn]] void fail(hora_status_t status, const std::string &message) {
  throw StatusError(status, message);
}

std::string where(const char *what) { return std::string("hora backend: ") + what + ": "; }

// hora's message names its own op and the request ("allreduce 'c10d.0.7': ..."); ours adds the
// torch op in front, as the two differ (reduce_scatter runs hora's reducescatter, barrier an
// allreduce, ...). hora_last_error is per thread and lasts until the next hora call: call this
// right after the failed one.
StatusError horaError(hora_status_t status, const char *what, const std::string &signature = "") {
  const char *why = hora_last_error();
  const std::string head = signature.empty()
                               ? where(what)
                               : std::string("hora backend: ") + what + " (" + signature + "): ";
  return StatusError(status, head + (why != nullptr && why[0] != '\0'
                                         ? std::string(why)
                                         : std::string(hora_status_string(status))));
}

const char *dtypeName(at::ScalarType t) { return c10::toString(t); }

// The DLPack type hora moves for a torch dtype; false for one it cannot move. bool is DLPack's
// kDLBool (code 6; the dlpack.h hora builds against may predate the name), which hora reduces as
// logical OR (SUM, MAX) and AND (MIN, PRODUCT), as torch's NCCL backend does.
bool dlType(at::ScalarType t, DLDataType *type) {
  switch (t) {
    case at::kByte: *type = DLDataType{kDLUInt, 8, 1}; return true;
    case at::kBool: *type = DLDataType{6, 8, 1}; return true;
    case at::kChar: *type = DLDataType{kDLInt, 8, 1}; return true;
    case at::kShort: *type = DLDataType{kDLInt, 16, 1}; return true;
    case at::kInt: *type = DLDataType{kDLInt, 32, 1}; return true;
    case at::kLong: *type = DLDataType{kDLInt, 64, 1}; return true;
    case at::kHalf: *type = DLDataType{kDLFloat, 16, 1}; return true;
    case at::kBFloat16: *type = DLDataType{kDLBfloat, 16, 1}; return true;
    case at::kFloat: *type = DLDataType{kDLFloat, 32, 1}; return true;
    case at::kDouble: *type = DLDataType{kDLFloat, 64, 1}; return true;
    default: return false;
  }
}

void checkTensor(const at::Tensor &t, const char *what, const std::string &role) {
  if (!t.defined()) fail(HORA_ERR_INVALID_ARGUMENT, where(what) + role + " is an undefined tensor");
  if (t.layout() != at::kStrided) {
    fail(HORA_ERR_UNSUPPORTED, where(what) + role + " is not a dense (strided) tensor");
  }
#if HORA_TORCH_CUDA
  if (!t.device().is_cpu() && !t.device().is_cuda()) {
    fail(HORA_ERR_UNSUPPORTED, where(what) + role + " is on " + t.device().str() +
                                   "; hora takes CPU and CUDA tensors");
  }
#else
  if (!t.device().is_cpu()) {
    fail(HORA_ERR_UNSUPPORTED, where(what) + role + " is on " + t.device().str() +
                                   "; this torch build gives hora CPU tensors only");
  }
#endif
  DLDataType type;
  if (!dlType(t.scalar_type(), &type)) {
    fail(HORA_ERR_UNSUPPORTED,
         where(what) + role + " is " + dtypeName(t.scalar_type()) +
             ", which hora does not move (it moves uint8, int8, int16, int32, int64, float16, "
             "bfloat16, float32, float64 and bool)");
  }
}

// `t` (`role`) against the op's tensor `like` (`likeRole`), both accepted by checkTensor: one op
// moves one dtype, on one device.
void checkLike(const at::Tensor &t, const at::Tensor &like, const char *what,
               const std::string &role, const char *likeRole) {
  if (t.scalar_type() != like.scalar_type()) {
    fail(HORA_ERR_INVALID_ARGUMENT, where(what) + role + " is " + dtypeName(t.scalar_type()) +
                                        " but " + likeRole + " is " +
                                        dtypeName(like.scalar_type()));
  }
  if (t.device() != like.device()) {
    fail(HORA_ERR_INVALID_ARGUMENT, where(what) + role + " is on " + t.device().str() + " but " +
                                        likeRole + " is on " + like.device().str() +
                                        ": one op's tensors must all be on one device");
  }
}

// The DLPack view hora reads (and writes) of a contiguous tensor that checkTensor accepted (CPU,
// or CUDA device N as kDLCUDA N). Valid while `t` lives (the shape array is the tensor's own);
// hora copies what it needs of the view at submission, and reads and writes the data until the
// request completes.
DLTensor toDl(const at::Tensor &t) {
  TORCH_INTERNAL_ASSERT(t.is_contiguous(), "hora backend: a non-contiguous tensor reached hora");
  DLTensor d{};
  d.data = t.data_ptr();
  d.device = t.device().is_cuda() ? DLDevice{kDLCUDA, static_cast<int32_t>(t.device().index())}
                                  : DLDevice{kDLCPU, 0};
  d.ndim = static_cast<int32_t>(t.dim());
  TORCH_INTERNAL_ASSERT(dlType(t.scalar_type(), &d.dtype));
  d.shape = const_cast<int64_t *>(t.sizes().data());
  return d;
}

// Torch passes one tensor per device in these lists; hora gives each process one device.
at::Tensor &single(std::vector<at::Tensor> &tensors, const char *what, const char *role) {
  if (tensors.size() != 1) {
    fail(HORA_ERR_INVALID_ARGUMENT,
         where(what) + "expected one " + role + " tensor per call, got " +
             std::to_string(tensors.size()) +
             " (a list is one tensor per device; hora gives each process one device)");
  }
  checkTensor(tensors[0], what, role);
  return tensors[0];
}

void checkRoot(int64_t root, int size, const char *what) {
  if (root < 0 || root >= size) {
    fail(HORA_ERR_INVALID_ARGUMENT, where(what) + "root " + std::to_string(root) +
                                        " is outside the group's ranks [0, " +
                                        std::to_string(size) + ")");
  }
}

// The contents of `t` as one row: shape [1, numel], contiguous.
at::Tensor asRow(const at::Tensor &t) { return t.contiguous().reshape({1, t.numel()}); }

// The tensors flattened and laid end to end, as one contiguous 1-D tensor.
at::Tensor concatenated(const std::vector<at::Tensor> &tensors) {
  std::vector<at::Tensor> flat;
  flat.reserve(tensors.size());
  for (const auto &t : tensors) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

// What every member of a group agrees on about an op's tensors, for its name:
// "Float[2,3]+Long[4]". Past kLongSignature bytes (a coalesced op of many tensors) the rest
// becomes a hash, as hora's names are at most 4096 bytes.
constexpr size_t kLongSignature = 160;
std::string signatureOf(const std::vector<at::Tensor> &tensors) {
  std::string s;
  for (const auto &t : tensors) {
    if (!s.empty()) s += '+';
    s += dtypeName(t.scalar_type());
    s += '[';
    for (int64_t d = 0; d < t.dim(); ++d) s += (d > 0 ? "," : "") + std::to_string(t.size(d));
    s += ']';
  }
  if (s.size() > kLongSignature) {
    char hash[20];
    std::snprintf(hash, sizeof hash, "~%016zx", std::hash<std::string>()(s));
    s = s.substr(0, kLongSignature / 2) + hash;
  }
  return s;
}

// What hora checks that every member agrees on about an op, for later ops' names
// (ProcessGroupHora::kLag): its tensors as hora gets them (hora's dtype, the shape) and `more`
// (the reduce op, the root).
uint64_t agreedKey(const std::vector<at::Tensor> &horaTensors, const std::string &more) {
  std::string s = more;
  for (const auto &t : horaTensors) {
    DLDataType d{};
    dlType(t.scalar_type(), &d);
    s += '|' + std::to_string(d.code) + ':' + std::to_string(d.bits);
    for (const int64_t dim : t.sizes()) s += ',' + std::to_string(dim);
  }
  return std::hash<std::string>()(s);
}

// hora's output of allgather/alltoall/reducescatter, seen as a 1-D tensor of `dtype`. It belongs
// to the request: copy out of it before the request is freed.
at::Tensor horaOutput(hora_request_t request, at::ScalarType dtype, const char *what) {
  const DLTensor *o = hora_request_output(request);
  if (o == nullptr) fail(HORA_ERR_INTERNAL, where(what) + "hora returned no output");
  int64_t n = 1;
  for (int d = 0; d < o->ndim; ++d) n *= o->shape[d];
  const at::Device device =
      o->device.device_type == kDLCUDA
          ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(o->device.device_id))
          : at::Device(at::kCPU);
  return at::from_blob(static_cast<char *>(o->data) + o->byte_offset, {n},
                       at::TensorOptions().dtype(dtype).device(device));
}

at::Tensor expectNumel(const at::Tensor &t, int64_t numel, const char *what) {
  if (t.numel() != numel) {
    fail(HORA_ERR_MISMATCH, where(what) + "received " + std::to_string(t.numel()) +
                                " elements but the output holds " + std::to_string(numel));
  }
  return t;
}

// Copies `src` (1-D, at least offset + dst.numel() elements) into `dst` of any layout.
void copyChunk(at::Tensor &dst, const at::Tensor &src, int64_t offset) {
  dst.copy_(src.narrow(0, offset, dst.numel()).view(dst.sizes()));
}

// torch's TORCH_DISTRIBUTED_DEBUG: INFO or DETAIL asks backends to check that ranks agree. Read
// when the group is made (torch's own copy is read once, at import).
bool debugLevelAtLeastInfo() {
  const char *level = std::getenv("TORCH_DISTRIBUTED_DEBUG");
  return level != nullptr && (std::strcmp(level, "INFO") == 0 || std::strcmp(level, "DETAIL") == 0);
}

const char *opName(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM: return "SUM";
    case c10d::ReduceOp::AVG: return "AVG";
    case c10d::ReduceOp::PRODUCT: return "PRODUCT";
    case c10d::ReduceOp::MIN: return "MIN";
    case c10d::ReduceOp::MAX: return "MAX";
    case c10d::ReduceOp::BAND: return "BAND";
    case c10d::ReduceOp::BOR: return "BOR";
    case c10d::ReduceOp::BXOR: return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return "UNUSED";
  }
}

// How a torch ReduceOp runs on hora. hora reduces with SUM, AVERAGE, MIN, MAX and PRODUCT;
// PREMUL_SUM is a SUM with hora's prescale; BAND, BOR and BXOR, which hora lacks, gather every
// rank's tensor and fold it here (size times the traffic, fine for the masks they are used on).
struct Reduction {
  hora_reduce_op_t op = HORA_OP_SUM;
  double prescale = 1.0;
  bool bitwise = false;
  c10d::ReduceOp::RedOpType kind = c10d::ReduceOp::SUM;
};

double premulFactor(const c10d::ReduceOp &op, const char *what) {
  auto *s = dynamic_cast<c10d::NCCLPreMulSumSupplement *>(op.supplement_.get());
  if (s == nullptr) {
    fail(HORA_ERR_INVALID_ARGUMENT, where(what) + "PREMUL_SUM arrived without its factor");
  }
  if (s->tensor_factors.empty()) return s->double_factor;
  if (s->tensor_factors.size() != 1 || s->tensor_factors[0].numel() != 1) {
    fail(HORA_ERR_INVALID_ARGUMENT,
         where(what) + "PREMUL_SUM takes one scalar factor per call on hora");
  }
  return s->tensor_factors[0].item<double>();
}

Reduction reductionFor(const c10d::ReduceOp &op, at::ScalarType dtype, const char *what) {
  Reduction r;
  r.kind = op.op_;
  switch (op.op_) {
    case c10d::ReduceOp::SUM: r.op = HORA_OP_SUM; break;
    case c10d::ReduceOp::AVG: r.op = HORA_OP_AVERAGE; break;
    case c10d::ReduceOp::PRODUCT: r.op = HORA_OP_PRODUCT; break;
    case c10d::ReduceOp::MIN: r.op = HORA_OP_MIN; break;
    case c10d::ReduceOp::MAX: r.op = HORA_OP_MAX; break;
    case c10d::ReduceOp::PREMUL_SUM:
      if (!at::isFloatingType(dtype)) {
        fail(HORA_ERR_UNSUPPORTED, where(what) + "PREMUL_SUM needs a floating-point tensor, got " +
                                       dtypeName(dtype));
      }
      r.op = HORA_OP_SUM;
      r.prescale = premulFactor(op, what);
      break;
    case c10d::ReduceOp::BAND:
    case c10d::ReduceOp::BOR:
    case c10d::ReduceOp::BXOR:
      if (!at::isIntegralType(dtype, /*includeBool=*/true)) {
        fail(HORA_ERR_UNSUPPORTED, where(what) + "ReduceOp." + opName(op.op_) +
                                       " needs an integer or bool tensor, got " + dtypeName(dtype));
      }
      r.bitwise = true;
      break;
    default:
      fail(HORA_ERR_UNSUPPORTED,
           where(what) + "ReduceOp " + std::to_string(static_cast<int>(op.op_)) + " is unknown");
  }
  if (dtype == at::kBool && op.op_ == c10d::ReduceOp::AVG) {
    fail(HORA_ERR_UNSUPPORTED, where(what) + "ReduceOp.AVG of bool tensors has no bool result; "
                                   "SUM, MAX and BOR are any (logical OR), PRODUCT, MIN and BAND "
                                   "all (logical AND)");
  }
  return r;
}

// rows: [size, n]; folds the rows with the bitwise op.
at::Tensor foldBitwise(const at::Tensor &rows, c10d::ReduceOp::RedOpType op) {
  at::Tensor acc = rows[0].clone();
  for (int64_t r = 1; r < rows.size(0); ++r) {
    switch (op) {
      case c10d::ReduceOp::BAND: acc.bitwise_and_(rows[r]); break;
      case c10d::ReduceOp::BOR: acc.bitwise_or_(rows[r]); break;
      default: acc.bitwise_xor_(rows[r]); break;
    }
  }
  return acc;
}

// The Submit of ops that give hora one tensor to gather: hora allocates the output.
std::function<hora_status_t(const char *, hora_request_t *)> allgatherOf(at::Tensor input,
                                                                         int32_t set) {
  return [input, set](const char *name, hora_request_t *request) {
    const DLTensor in = toDl(input);
    return hora_allgather_async(name, &in, set, request);
  };
}

}  // namespace

// ------------------------------------------------------------------------------------------------

// The future is a CPU one even for CUDA tensors: the watcher completes it once hora_wait says the
// result is on the device, visible to every stream, so its callbacks and value() need no event.
WorkHora::WorkHora(int rank, c10d::OpType type, const char *what,
                   const std::vector<at::Tensor> &inputs, c10::Device device, bool streamOrdered)
    : Work(rank, type, what, c10::optional<std::vector<at::Tensor>>(inputs)),
      what_(what),
      device_(device),
      streamOrdered_(streamOrdered && device.is_cuda()),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors())) {}

bool WorkHora::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
#if HORA_TORCH_CUDA
  if (streamOrdered_ && timeout == kNoTimeout) {
    // The op may still wait in the group's queue for its name (ProcessGroupHora::kLag).
    cv_.wait(lock, [this] { return completed_ || request_ != nullptr; });
    if (!completed_) {
      // Torch's current stream of the device, as on the thread that waits (torch's NCCL
      // backend's work.wait() blocks that one too). The watcher frees the request only once no
      // wait() uses it (releaseRequest).
      const hora_request_t request = request_;
      void *stream = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
      ++requestUsers_;
      lock.unlock();
      const hora_status_t status = hora_cuda_wait(request, stream);
      lock.lock();
      --requestUsers_;
      cv_.notify_all();
      if (status == HORA_SUCCESS) return true;
      // It failed before its launch: the watcher completes the work with hora's message.
    }
  }
#endif
  if (timeout == kNoTimeout) {
    cv_.wait(lock, [this] { return completed_; });
  } else if (!cv_.wait_for(lock, timeout, [this] { return completed_; })) {
    fail(HORA_ERR_TIMEOUT, where(what_) + "not complete after " + std::to_string(timeout.count()) +
                               " ms; it is still in flight");
  }
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

void WorkHora::submitted(hora_request_t request) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    request_ = request;
  }
  cv_.notify_all();
}

void WorkHora::releaseRequest() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [this] { return requestUsers_ == 0; });
  request_ = nullptr;
}

std::vector<at::Tensor> WorkHora::result() {
  std::lock_guard<std::mutex> lock(mutex_);
  return result_;
}

bool WorkHora::complete(std::vector<at::Tensor> value, std::exception_ptr error) {
  if (claimed_.exchange(true)) return false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    result_ = value;
  }
  finish(error);
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(std::move(value)));
  }
  return true;
}

// ------------------------------------------------------------------------------------------------

namespace {

// The key of an op that failed (see ProcessGroupHora::kLag): hora failed it on every member.
constexpr uint64_t kFailedKey = ~uint64_t{0};


// "3 s", "0.25 s": a timeout as torch's user wrote it, near enough.
std::string seconds(std::chrono::milliseconds t) {
  char text[32];
  if (t.count() % 1000 == 0) {
    std::snprintf(text, sizeof text, "%lld s", static_cast<long long>(t.count() / 1000));
  } else {
    std::snprintf(text, sizeof text, "%.3g s", static_cast<double>(t.count()) / 1000.0);
  }
  return text;
}

}  // namespace

// Never destroyed: used at exit.
std::mutex &ProcessGroupHora::liveGroupsMutex() {
  static auto *m = new std::mutex();
  return *m;
}

std::vector<std::weak_ptr<ProcessGroupHora::Shared>> &ProcessGroupHora::liveGroups() {
  static auto *v = new std::vector<std::weak_ptr<Shared>>();
  return *v;
}

ProcessGroupHora::ProcessGroupHora(int rank, int size, int32_t processSet, std::string groupName,
                                   std::chrono::milliseconds timeout)
    : ProcessGroupBase(rank, size),
      processSet_(processSet),
      groupName_(std::move(groupName)),
      timeout_(timeout.count() > 0 ? timeout : std::chrono::milliseconds(0)),
      shared_(std::make_shared<Shared>(groupName_, processSet, debugLevelAtLeastInfo())) {
  if (hora_is_initialized() == 0) {
    fail(HORA_ERR_NOT_INITIALIZED, "hora backend: hora is not initialized");
  }
  const int horaRank = hora_process_set_rank(processSet_);
  const int horaSize = hora_process_set_size(processSet_);
  if (horaRank != rank || horaSize != size) {
    fail(HORA_ERR_INVALID_ARGUMENT,
         "hora backend: torch made this process rank " + std::to_string(rank) + " of " +
             std::to_string(size) + " in group '" + groupName_ + "', but it is rank " +
             std::to_string(horaRank) + " of " + std::to_string(horaSize) +
             " in hora's process set " + std::to_string(processSet_) +
             (processSet_ == 0 ? " (hora's world, formed by hora_init from MPI or RANK/WORLD_SIZE)"
                               : ""));
  }
  init();
  const std::string threadName = ("hora-c10d " + groupName_).substr(0, 15);
  const std::shared_ptr<Shared> shared = shared_;
  std::lock_guard<std::mutex> threads(shared->threadsMutex);
  shared->watcher = std::thread([shared, threadName] {
    pthread_setname_np(pthread_self(), threadName.c_str());
    watch(shared);
  });
  if (timeout_.count() > 0) {
    const std::chrono::milliseconds t = timeout_;
    const std::string timerName = ("hora-c10dt " + groupName_).substr(0, 15);
    shared->timer = std::thread([shared, t, timerName] {
      pthread_setname_np(pthread_self(), timerName.c_str());
      enforceTimeout(shared, t);
    });
  }
  std::lock_guard<std::mutex> lock(liveGroupsMutex());
  liveGroups().push_back(shared_);
}

ProcessGroupHora::~ProcessGroupHora() {
  // The last reference often goes in Python, with the GIL held, while the watcher (or the
  // timer, failing works) may be running a Python callback of a future (or dropping a Python
  // object): it needs the GIL to finish.
  PyThreadState *state = nullptr;
  if (Py_IsInitialized() != 0 && PyGILState_Check() != 0) state = PyEval_SaveThread();
  shared_->stopAndJoin();
  if (state != nullptr) PyEval_RestoreThread(state);
}

// Every op completes: hora completes it, or the group's timeout aborts the process set in hora
// (enforceTimeout), which completes it too. So the wait below ends, and no thread is left that
// could touch Python objects later (a watcher detached in hora_wait used to drop its tensors
// while the interpreter finalized, which aborted the process).
void ProcessGroupHora::Shared::stopAndJoin() {
  {
    std::lock_guard<std::mutex> lock(mutex);
    stop = true;
  }
  queued.notify_all();
  changed.notify_all();
  std::lock_guard<std::mutex> threads(threadsMutex);
  if (watcher.joinable()) watcher.join();
  if (timer.joinable()) timer.join();
}

void ProcessGroupHora::stopAll() {
  std::vector<std::shared_ptr<Shared>> groups;
  {
    std::lock_guard<std::mutex> lock(liveGroupsMutex());
    for (const std::weak_ptr<Shared> &g : liveGroups()) {
      if (std::shared_ptr<Shared> live = g.lock()) groups.push_back(std::move(live));
    }
    liveGroups().clear();
  }
  if (groups.empty()) return;
  {
    for (const std::shared_ptr<Shared> &g : groups) {
      std::lock_guard<std::mutex> lock(g->mutex);
      g->stop = true;
    }
    // What the watchers still wait for completes (with HORA_ERR_SHUT_DOWN) as hora shuts down,
    // as it would at exit anyway.
    if (hora_is_initialized() != 0) {
      if (hora_shutdown() != HORA_SUCCESS) {
        std::fprintf(stderr, "hora backend: hora_shutdown at exit: %s\n", hora_last_error());
      }
    }
  }
  for (const std::shared_ptr<Shared> &g : groups) g->stopAndJoin();
}

void ProcessGroupHora::watch(const std::shared_ptr<Shared> &shared) {
  Shared &s = *shared;
  // Results are copied into tensors that may require grad (a parameter broadcast in place):
  // that copy is the collective's, not part of any graph. (A future's callbacks run with the
  // grad mode of the thread that added them.)
  at::NoGradGuard noGrad;
  for (;;) {
    Op op;
    {
      std::unique_lock<std::mutex> lock(s.mutex);
      s.queued.wait(lock, [&s] { return s.stop || !s.ops.empty(); });
      if (s.ops.empty()) {  // stopping, and every op has completed
        s.watcherDone = true;
        lock.unlock();
        s.changed.notify_all();
        return;
      }
      // Only this thread pops the front or changes an op already queued (the timer only reads
      // them): the front stays put while the lock is let go.
      Op &front = s.ops.front();
      TORCH_INTERNAL_ASSERT(front.request != nullptr || front.error != nullptr);
      if (front.error == nullptr) {
        const hora_request_t request = front.request;
        lock.unlock();
        const hora_status_t status = hora_wait(request);
        std::exception_ptr error;
        std::string why;
        if (status != HORA_SUCCESS) {
          // hora's message names its request; the tensors' signature says which call it was.
          const StatusError e = horaError(status, front.what, front.signature);
          error = std::make_exception_ptr(e);
          why = e.what();
        }
        lock.lock();
        front.error = error;
        // hora gave up on the op (HORA_STALL_SHUTDOWN_S, HORA_TIMEOUT_S): the members' sequences
        // no longer line up, as with the group's own timeout.
        if (status == HORA_ERR_TIMEOUT && s.brokenStatus == HORA_SUCCESS) {
          s.brokenStatus = status;
          s.broken = why;
        }
      }
      op = std::move(front);
      s.ops.pop_front();
      // What every member now knows of the op (hora checked that they agree, or failed it on
      // all of them), for the names of later ops of its kind.
      s.kinds[op.what].record(op.k, op.error == nullptr ? op.key : kFailedKey);
      // hora freed the name before completing the request, and the key is known: queued ops
      // that waited for either go now.
      s.submitReady();
      if (s.stop) s.changed.notify_all();  // the timer may be waiting for the queue to empty
    }
    std::vector<at::Tensor> value;
    // A work the timer failed keeps its tensors as they are: its caller has been told it failed.
    if (op.error == nullptr && !op.work->claimed() && !op.failedByTimer) {
      try {
        value = finishOp(op);
      } catch (...) {
        op.error = std::current_exception();
      }
    }
    op.work->releaseRequest();
    hora_request_free(op.request);
    // The tensors hora used are let go before anyone is told.
    op.submit = nullptr;
    op.finish = nullptr;
    try {
      // The timer completes the works it failed, after hora has let go of their tensors.
      if (!op.failedByTimer) op.work->complete(std::move(value), op.error);
    } catch (const std::exception &e) {
      // A callback on the future threw; this thread must go on completing the group's ops.
      std::fprintf(stderr, "hora backend: a callback of %s's future threw: %s\n", op.what,
                   e.what());
    }
  }
}

// The group's timeout, counted from each op's call: ops complete in order, so the front of the
// queue is the one to watch. When it outlives the timeout (hora has not completed it), the
// group fails: that op's work with a timeout error naming it, every other queued op's work with
// the same cause, and every later call at once. hora may still hold the late op (until a member
// submits it, HORA_STALL_SHUTDOWN_S fails it, or hora shuts down); the watcher keeps its tensors
// alive until then. The members' sequences of ops no longer line up (a skipped op shifts every
// later name), which is why the group does not go on.
void ProcessGroupHora::enforceTimeout(const std::shared_ptr<Shared> &shared,
                                      std::chrono::milliseconds timeout) {
  Shared &s = *shared;
  std::unique_lock<std::mutex> lock(s.mutex);
  for (;;) {
    if (s.stop && (s.ops.empty() || s.stuck)) break;
    if (s.ops.empty() || s.stuck) {
      // Woken by the next op queued (enqueue notifies only an idle timer) or by stop.
      s.timerIdle = true;
      s.changed.wait(lock);
      s.timerIdle = false;
      continue;
    }
    const Op &front = s.ops.front();
    const Clock::time_point now = Clock::now();
    if (now < front.deadline) {
      const Clock::time_point deadline = front.deadline;  // the front may go while waiting
      s.changed.wait_until(lock, deadline);
      continue;
    }
    // Past its deadline. Done in hora (or failed at submission), it only waits for the watcher,
    // which may be busy with a slow callback of an earlier op's future.
    int done = 0;
    if (front.error != nullptr || front.request == nullptr ||
        hora_poll(front.request, &done) != HORA_SUCCESS || done != 0) {
      s.changed.wait_for(lock, std::chrono::milliseconds(10));
      continue;
    }
    const std::string why =
        std::string(front.what) + " '" + front.name + "'" +
        (front.signature.empty() ? std::string() : " (" + front.signature + ")") +
        " did not complete within the process group's timeout of " + seconds(timeout) +
        " (init_process_group/new_group timeout=): a member of the group has not called it, or "
        "called another collective at this point; the group is unusable from now on (every "
        "later op on it fails at once): destroy it or restart";
    s.stuck = true;
    s.brokenStatus = HORA_ERR_TIMEOUT;
    s.broken = why;
    std::vector<std::pair<c10::intrusive_ptr<WorkHora>, std::exception_ptr>> failed;
    for (Op &op : s.ops) {
      const std::string message =
          &op == &front ? std::string("hora backend: ") + why
                        : where(op.what) + "not complete: the group failed: " + why;
      failed.emplace_back(op.work, std::make_exception_ptr(StatusError(HORA_ERR_TIMEOUT, message)));
      op.failedByTimer = true;
    }
    lock.unlock();
    // The op is over in hora before anyone is told: the process set stops on this rank, so hora
    // writes into none of its tensors later (the caller may reuse them as soon as it hears), the
    // members that did submit it fail too instead of running it with this rank's tensor as it
    // is then, and the watcher's hora_wait returns. Not collective; the other members hear of it
    // as their next collective on the set fails.
    if (hora_process_set_abort(s.processSet, HORA_ERR_TIMEOUT, why.c_str()) != HORA_SUCCESS &&
        hora_is_initialized() != 0) {
      std::fprintf(stderr, "hora backend: stopping process set %d after the timeout: %s\n",
                   static_cast<int>(s.processSet), hora_last_error());
    }
    s.changed.notify_all();
    for (auto &f : failed) {
      try {
        f.first->complete({}, f.second);
      } catch (const std::exception &e) {
        std::fprintf(stderr, "hora backend: a callback of a failed op's future threw: %s\n",
                     e.what());
      }
    }
    failed.clear();
    lock.lock();
  }
}

uint64_t ProcessGroupHora::Kind::modulus(uint64_t k) {
  while (tracked < needed(k)) track(tracked++);
  if (period == 0) return kLag;
  return period * ((kLag + period - 1) / period);
}

void ProcessGroupHora::Kind::record(uint64_t k, uint64_t key) {
  TORCH_INTERNAL_ASSERT(k == known, "hora backend: op ", k, " of a kind completed as op ", known);
  keys[k % kWindow] = key;
  ++known;
}

// Keeps `period` that of keys [0, i]: the smallest p whose last two runs of p keys are equal,
// looked for again only when key i breaks the current one.
void ProcessGroupHora::Kind::track(uint64_t i) {
  auto at = [this](uint64_t j) { return keys[j % kWindow]; };
  if (period > 0 && i >= period && at(i) == at(i - period)) return;
  period = 0;
  for (uint64_t p = 1; p <= kMaxPeriod && 2 * p <= i + 1; ++p) {
    bool repeats = true;
    for (uint64_t j = 0; j < p && repeats; ++j) repeats = at(i - j) == at(i - j - p);
    if (repeats) {
      period = p;
      return;
    }
  }
}

namespace {

// hora's CUDA stream is per thread, and an op is submitted on its caller's thread or, when it
// waited in the queue, on the watcher's: each CUDA submission sets the stream the op was called
// on for its own thread, and puts hora's default (NULL) back after it. Nothing for CPU ops.
class SubmitStream {
 public:
  SubmitStream(c10::Device device, void *stream) : cuda_(device.is_cuda()) {
    if (cuda_) status_ = hora_cuda_set_stream(stream);
  }
  ~SubmitStream() {
    if (cuda_ && status_ == HORA_SUCCESS) hora_cuda_set_stream(nullptr);
  }
  SubmitStream(const SubmitStream &) = delete;
  SubmitStream &operator=(const SubmitStream &) = delete;
  hora_status_t status() const { return status_; }

 private:
  const bool cuda_;
  hora_status_t status_ = HORA_SUCCESS;
};

}  // namespace

// Runs the op's finish. A CUDA op's copies and folds go on a stream of torch's pool for the
// device, not the watcher's default stream (which would wait for whatever the process queued
// there), and are on the device before the work completes or hora frees its output: hora's
// result is visible to every stream once hora_wait has returned. (c10's generic guard and
// synchronize go through libc10_cuda, so that this file calls no CUDA runtime itself.)
std::vector<at::Tensor> ProcessGroupHora::finishOp(const Op &op) {
#if HORA_TORCH_CUDA
  if (op.device.is_cuda()) {
    const c10::Stream stream =
        c10::cuda::getStreamFromPool(false, op.device.index()).unwrap();
    const c10::StreamGuard guard(stream);
    std::vector<at::Tensor> value;
    std::exception_ptr error;
    try {
      value = op.finish(op.request);
    } catch (...) {
      error = std::current_exception();
    }
    stream.synchronize();  // also after a failure: queued copies may still read hora's output
    if (error) std::rethrow_exception(error);
    return value;
  }
#endif
  return op.finish(op.request);
}

bool ProcessGroupHora::Shared::trySubmit(Op &op, bool nameInFlight) {
  if (op.name.empty()) {
    Kind &kind = kinds[op.what];
    if (!kind.nameable(op.k)) return false;
    op.name = "c10d." + groupName + "." + op.what + "." + std::to_string(op.k % kind.modulus(op.k));
    nameInFlight = std::any_of(ops.begin(), ops.end(), [&op](const Op &o) {
      return &o != &op && o.name == op.name;
    });
  }
  if (nameInFlight) return false;
  {
    const SubmitStream stream(op.device, op.stream);
    hora_status_t status = stream.status();
    if (status == HORA_SUCCESS) status = op.submit(op.name.c_str(), &op.request);
    if (status != HORA_SUCCESS) {
      if (!sequenceNames) op.name.clear();
      throw horaError(status, op.what);  // read hora's message before ~SubmitStream calls hora
    }
  }
  op.work->submitted(op.request);
  return true;
}

void ProcessGroupHora::Shared::submitReady() {
  // An op waits for an earlier one of its name, or of its kind (for the key), so only ops
  // behind the first unsubmitted one can go; names are given in order of k within a kind.
  for (auto it = ops.begin(); it != ops.end(); ++it) {
    Op &op = *it;
    if (op.request != nullptr || op.error != nullptr) continue;
    if (brokenStatus != HORA_SUCCESS) {
      op.error = std::make_exception_ptr(
          StatusError(brokenStatus, where(op.what) + "not run: the group failed: " + broken));
      continue;
    }
    const bool inFlight =
        !op.name.empty() && std::any_of(ops.begin(), it, [&op](const Op &o) {
          return o.name == op.name;
        });
    try {
      trySubmit(op, inFlight);
    } catch (...) {
      op.error = std::current_exception();
    }
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHora::enqueue(c10d::OpType type, const char *what,
                                                         c10::Device device,
                                                         const std::vector<at::Tensor> &inputs,
                                                         const std::string &signature,
                                                         uint64_t key, Submit submit,
                                                         Finish finish, bool copies) {
  auto work = c10::make_intrusive<WorkHora>(rank_, type, what, inputs, device, !copies);
  Op op;
  op.what = what;
  op.device = device;
#if HORA_TORCH_CUDA
  // What the op waits for on the device: the work queued so far on the caller's current stream.
  if (device.is_cuda()) op.stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
#endif
  op.key = key;
  op.signature = signature;
  op.work = work;
  op.submit = std::move(submit);
  op.finish = std::move(finish);
  op.deadline = timeout_.count() > 0 ? Clock::now() + timeout_ : Clock::time_point::max();
  Shared &s = *shared_;
  std::unique_lock<std::mutex> lock(s.mutex);
  if (s.brokenStatus != HORA_SUCCESS) {
    throw StatusError(s.brokenStatus, where(what) + "not run: the group failed: " + s.broken);
  }
  // The op takes its numbers. One that hora refuses below gives its number of its kind back,
  // so that ranks that all refuse it stay in step (its place in the group's sequence stays
  // taken, on every rank alike).
  const uint64_t seq = s.seq++;
  Kind &kind = s.kinds[what];
  op.k = kind.count++;
  // Names by sequence are unique and need no key; otherwise an earlier op of its kind not yet
  // submitted goes first (names are given in order of k).
  if (s.sequenceNames) op.name = "c10d." + groupName_ + "." + std::to_string(seq);
  const bool waits =
      !s.sequenceNames && std::any_of(s.ops.begin(), s.ops.end(), [what](const Op &o) {
        return std::strcmp(o.what, what) == 0 && o.request == nullptr && o.error == nullptr;
      });
  if (!waits) {
    try {
      s.trySubmit(op, false);
    } catch (...) {
      --kind.count;
      throw;
    }
  }
  s.ops.push_back(std::move(op));
  const bool wakeTimer = s.timerIdle;
  s.timerIdle = false;
  lock.unlock();
  s.queued.notify_one();
  if (wakeTimer) s.changed.notify_all();
  return work;
}

uint64_t ProcessGroupHora::getSequenceNumberForGroup() {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  return shared_->seq;
}

// ------------------------------------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupHora::reduceTensors(c10d::OpType type, const char *what,
                                                               std::vector<at::Tensor> tensors,
                                                               const c10d::ReduceOp &op,
                                                               bool write) {
  if (tensors.empty()) fail(HORA_ERR_INVALID_ARGUMENT, where(what) + "no tensors");
  const at::ScalarType dtype = tensors[0].scalar_type();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string role = "tensor " + std::to_string(i);
    checkTensor(tensors[i], what, role);
    checkLike(tensors[i], tensors[0], what, role, "tensor 0");
  }
  const Reduction red = reductionFor(op, dtype, what);
  const int32_t set = processSet_;
  const std::string signature = signatureOf(tensors);

  if (red.bitwise) {
    const at::Tensor row = concatenated(tensors).reshape({1, -1});
    const int64_t size = size_;
    return enqueue(
        type, what, tensors[0].device(), tensors, signature, agreedKey({row}, "bitwise"),
        allgatherOf(row, set),
        [tensors, row, dtype, size, red, write, what](hora_request_t request) mutable {
          const at::Tensor all = expectNumel(horaOutput(request, dtype, what), size * row.numel(),
                                             what);
          const at::Tensor folded = foldBitwise(all.view({size, row.numel()}), red.kind);
          if (write) {
            int64_t offset = 0;
            for (auto &t : tensors) {
              copyChunk(t, folded, offset);
              offset += t.numel();
            }
          }
          return tensors;
        });
  }

  // hora reduces contiguous tensors: the tensors themselves, or copies written back at the end.
  // Without `write` the result goes to scratch tensors.
  std::vector<at::Tensor> inputs, outputs;
  bool copies = false;
  for (const auto &t : tensors) {
    inputs.push_back(t.contiguous());
    outputs.push_back(write ? inputs.back() : at::empty_like(inputs.back()));
    copies = copies || (write && !inputs.back().is_same(t));
  }
  return enqueue(
      type, what, tensors[0].device(), tensors, signature, agreedKey(inputs, opName(red.kind)),
      [inputs, outputs, red, set](const char *name, hora_request_t *request) {
        std::vector<DLTensor> in, out;
        for (size_t i = 0; i < inputs.size(); ++i) {
          in.push_back(toDl(inputs[i]));
          out.push_back(toDl(outputs[i]));
        }
        if (in.size() == 1) {
          return hora_allreduce_async(name, &in[0], &out[0], red.op, red.prescale, 1.0, set,
                                      request);
        }
        return hora_grouped_allreduce_async(name, static_cast<int>(in.size()), in.data(),
                                            out.data(), red.op, red.prescale, 1.0, set, request);
      },
      [tensors, inputs, write](hora_request_t) mutable {
        if (write) {
          for (size_t i = 0; i < tensors.size(); ++i) {
            if (!inputs[i].is_same(tensors[i])) tensors[i].copy_(inputs[i]);
          }
        }
        return tensors;
      },
      copies);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHora::allreduce(std::vector<at::Tensor> &tensors,
                                                           const c10d::AllreduceOptions &opts) {
  single(tensors, "allreduce", "input");
  return reduceTensors(c10d::OpType::ALLREDUCE, "allreduce", tensors, opts.reduceOp, true);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHora::allreduce_coalesced(
    std::vector<at::Tensor> &tensors, const c10d::AllreduceCoalescedOptions &opts) {
  return reduceTensors(c10d::OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", tensors,
                       opts.reduceOp, true);
}

// Every rank reduces (hora has no rooted reduce); only the root keeps the result, the others'
// tensors stay as they were.
c10::intrusive_ptr<c10d::Work> ProcessGroupHora::reduce(std::vector<at::Tensor> &tensors,
                                                        const c10d::ReduceOptions &opts) {
  single(tensors, "reduce", "input");
  if (opts.rootTensor != 0) {
    fail(HORA_ERR_INVALID_ARGUMENT, where("reduce") + "rootTensor must be 0 (one tensor per rank)");
  }
  checkRoot(opts.rootRank, size_, "reduce");
  return reduceTensors(c10d::OpType::REDUCE, "reduce", tensors, opts.reduceOp,
                       opts.rootRank == rank_);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHora::broadcast(std::vector<at::Tensor> &tensors,
                                                           const c10d::BroadcastOptions &opts) {
  const char *what = "broadcast";
  at::Tensor t = single(tensors, what, "tensor");
  if (opts.rootTensor != 0) {
    fail(HORA_ERR_INVALID_ARGUMENT, where(what) + "rootTensor must be 0 (one tensor per rank)");
  }
  checkRoot(opts.rootRank, size_, what);
  // hora broadcasts in place into a contiguous tensor: `t` itself or a copy written back.
  const at::Tensor buf = t.contiguous();
  const int root = static_cast<int>(opts.rootRank);
  const int32_t set = processSet_;
  return enqueue(
      c10d::OpType::BROADCAST, what, t.device(), tensors, signatureOf(tensors),
      agreedKey({buf}, "root " + std::to_string(root)),
      [buf, root, set](const char *name, hora_request_t *request) {
        DLTensor d = toDl(buf);
        return hora_broadcast_async(name, &d, root, set, request);
      },
      [t, buf](hora_request_t) mutable {
        if (!buf.is_same(t)) t.copy_(buf);
        return std::vector<at::Tensor>{t};
      },
      !buf.is_same(t));
}

// ------------------------------------------------------------------------------------------------
// Gathers: each rank's tensor travels as one row [1, n], so hora's allgather returns [size, n]
// (and ranks whose n differs fail with hora's mismatch error).

c10::intrusive_ptr<c10d::Work> ProcessGroupHora::allgather(
    std::vector<std::vector<at::Tensor>> &outputs, std::vector<at::Tensor> &inputs,
    const c10d::AllgatherOptions &) {
  const char *what = "allgather";
  const at::Tensor input = single(inputs, what, "input");
  if (outputs.size() != 1 || outputs[0].size() != static_cast<size_t>(size_)) {
    fail(HORA_ERR_INVALID_ARGUMENT,
         where(what) + "expected one list of " + std::to_string(size_) + " output tensors, got " +
             (outputs.size() == 1 ? std::to_string(outputs[0].size()) + " tensors"
                                  : std::to_string(outputs.size()) + " lists"));
  }
  std::vector<at::Tensor> outs = outputs[0];
  for (size_t i = 0; i < outs.size(); ++i) {
    const std::string role = "output " + std::to_string(i);
    checkTensor(outs[i], what, role);
    checkLike(outs[i], input, what, role, "the input");
    if (outs[i].numel() != input.numel()) {
      fail(HORA_ERR_INVALID_ARGUMENT, where(what) + role + " has " +
                                          std::to_string(outs[i].numel()) +
                                          " elements, the input " + std::to_string(input.numel()));
    }
  }
  const int64_t n = input.numel();
  const at::ScalarType dtype = input.scalar_type();
  return enqueue(
      c10d::OpType::ALLGATHER, what, input.device(), inputs, signatureOf(inputs),
      agreedKey({asRow(input)}, ""),
      allgatherOf(asRow(input), processSet_),
      [outs, n, dtype, what](hora_request_t request) mutable {
        const at::Tensor all = expectNumel(horaOutput(request, dtype, what),
                                           n * static_cast<int64_t>(outs.size()), what);
        for (size_t i = 0; i < outs.size(); ++i) copyChunk(outs[i], all, n * static_cast<int64_t>(i));
        return outs;
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHora::_allgather_base(at::Tensor &output,
                                                                 at::Tensor &input,
                                                                 const c10d::AllgatherOptions &) {
  const char *what = "_allgather_base";
  checkTensor(input, what, "input");
  checkTensor(output, what, "output");
  checkLike(output, input, what, "output", "the input");
  if (output.numel() != input.numel() * size_) {
    fail(HORA_ERR_INVALID_ARGUMENT,
         where(what) + "the output has " + std::to_string(output.numel()) +
             " elements; it must hold the group's " + std::to_string(size_) + " inputs of " +
             std::to_string(input.numel()));
  }
  const at::ScalarType dtype = input.scalar_type();
  at::Tensor out = output;
  return enqueue(
      c10d::OpType::_ALLGATHER_BASE, what, input.device(), {input}, signatureOf({input}),
      agreedKey({asRow(input)}, ""), allgatherOf(asRow(input), processSet_),
      [out, dtype, what](hora_request_t request) mutable {
        copyChunk(out, expectNumel(horaOutput(request, dtype, what), out.numel(), what), 0);
        return std::vector<at::Tensor>{out};
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHora::allgather_coalesced(
    std::vector<std::vector<at::Tensor>> &outputLists, std::vector<at::Tensor> &inputs,
    const c10d::AllgatherOptions &) {
  const char *what = "allgather_coalesced";
  if (inputs.empty()) fail(HORA_ERR_INVALID_ARGUMENT, where(what) + "no input tensors");
  const at::ScalarType dtype = inputs[0].scalar_type();
  for (size_t i = 0; i < inputs.size(); ++i) {
    checkTensor(inputs[i], what, "input " + std::to_string(i));
    checkLike(inputs[i], inputs[0], what, "input " + std::to_string(i), "input 0");
  }
  if (outputLists.size() != static_cast<size_t>(size_)) {
    fail(HORA_ERR_INVALID_ARGUMENT, where(what) + "expected " + std::to_string(size_) +
                                        " output lists (one per rank), got " +
                                        std::to_string(outputLists.size()));
  }
  for (size_t r = 0; r < outputLists.size(); ++r) {
    if (outputLists[r].size() != inputs.size()) {
      fail(HORA_ERR_INVALID_ARGUMENT, where(what) + "output list " + std::to_string(r) + " has " +
                                          std::to_string(outputLists[r].size()) +
                                          " tensors for " + std::to_string(inputs.size()) +
                                          " inputs");
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      const std::string role = "output [" + std::to_string(r) + "][" + std::to_string(i) + "]";
      checkTensor(outputLists[r][i], what, role);
      checkLike(outputLists[r][i], inputs[0], what, role, "input 0");
      if (outputLists[r][i].numel() != inputs[i].numel()) {
        fail(HORA_ERR_INVALID_ARGUMENT, where(what) + role + " does not match input " +
                                            std::to_string(i) + "'s size");
      }
    }
  }
  const at::Tensor row = concatenated(inputs).reshape({1, -1});
  const int64_t n = row.numel();
  std::vector<std::vector<at::Tensor>> outs = outputLists;
  return enqueue(
      c10d::OpType::ALLGATHER_COALESCED, what, inputs[0].device(), inputs, signatureOf(inputs),
      agreedKey({row}, ""), allgatherOf(row, processSet_),
      [outs, n, dtype, what](hora_request_t request) mutable {
        const at::Tensor all = expectNumel(horaOutput(request, dtype, what),
                                           n * static_cast<int64_t>(outs.size()), what);
        std::vector<at::Tensor> value;
        int64_t offset = 0;
        for (auto &list : outs) {
          for (auto &t : list) {
            copyChunk(t, all, offset);
            offset += t.numel();
            value.push_back(t);
          }
        }
        return value;
      });
}

// An allgather of which only the root keeps the rows. Its inputs may differ by rank in shape
// (only the number of elements must agree), so its name holds the op alone.
c10::intrusive_ptr<c10d::Work> ProcessGroupHora::gather(
    std::vector<std::vector<at::Tensor>> &outputs, std::vector<at::Tensor> &inputs,
    const c10d::GatherOptions &opts) {
  const char *what = "gather";
  const at::Tensor input = single(inputs, what, "input");
  checkRoot(opts.rootRank, size_, what);
  std::vector<at::Tensor> outs;
  if (opts.rootRank == rank_) {
    if (outputs.size() != 1 || outputs[0].size() != static_cast<size_t>(size_)) {
      fail(HORA_ERR_INVALID_ARGUMENT,
           where(what) + "the root needs one list of " + std::to_string(size_) + " output tensors");
    }
    outs = outputs[0];
    for (size_t i = 0; i < outs.size(); ++i) {
      const std::string role = "output " + std::to_string(i);
      checkTensor(outs[i], what, role);
      checkLike(outs[i], input, what, role, "the input");
      if (outs[i].numel() != input.numel()) {
        fail(HORA_ERR_INVALID_ARGUMENT, where(what) + role + " does not match the input's size");
      }
    }
  } else if (!outputs.empty()) {
    fail(HORA_ERR_INVALID_ARGUMENT,
         where(what) + "only the root (rank " + std::to_string(opts.rootRank) + ") passes outputs");
  }
  const int64_t n = input.numel(), size = size_;
  const at::ScalarType dtype = input.scalar_type();
  return enqueue(
      c10d::OpType::GATHER, what, input.device(), inputs, "", 0,
      allgatherOf(asRow(input), processSet_),
      [outs, n, size, dtype, what](hora_request_t request) mutable {
        const at::Tensor all = expectNumel(horaOutput(request, dtype, what), n * size, what);
        for (size_t i = 0; i < outs.size(); ++i) copyChunk(outs[i], all, n * static_cast<int64_t>(i));
        return outs;
      });
}

// ------------------------------------------------------------------------------------------------
// Exchanges, through hora's alltoall with explicit splits of a 1-D tensor. What each rank sends
// differs by rank, so their names hold the op alone.

namespace {

// The Submit of an alltoall of `input`'s rows: `splits` rows to each rank, or an even split
// when empty.
std::function<hora_status_t(const char *, hora_request_t *)> alltoallOf(
    at::Tensor input, std::vector<int64_t> splits, int32_t set) {
  return [input, splits, set](const char *name, hora_request_t *request) {
    const DLTensor in = toDl(input);
    return hora_alltoall_async(name, &in, splits.empty() ? nullptr : splits.data(), set, request);
  };
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupHora::scatter(
    std::vector<at::Tensor> &outputs, std::vector<std::vector<at::Tensor>> &inputs,
    const c10d::ScatterOptions &opts) {
  const char *what = "scatter";
  at::Tensor output = single(outputs, what, "output");
  checkRoot(opts.rootRank, size_, what);
  const int64_t n = output.numel();
  // The root sends n elements to each rank; the others send nothing.
  at::Tensor flat;
  std::vector<int64_t> splits(static_cast<size_t>(size_), 0);
  if (opts.rootRank == rank_) {
    if (inputs.size() != 1 || inputs[0].size() != static_cast<size_t>(size_)) {
      fail(HORA_ERR_INVALID_ARGUMENT,
           where(what) + "the root needs one list of " + std::to_string(size_) + " input tensors");
    }
    for (size_t i = 0; i < inputs[0].size(); ++i) {
      const std::string role = "input " + std::to_string(i);
      checkTensor(inputs[0][i], what, role);
      checkLike(inputs[0][i], output, what, role, "the output");
      if (inputs[0][i].numel() != n) {
        fail(HORA_ERR_INVALID_ARGUMENT, where(what) + role + " does not match the output's size");
      }
      splits[i] = n;
    }
    flat = concatenated(inputs[0]);
  } else {
    if (!inputs.empty()) {
      fail(HORA_ERR_INVALID_ARGUMENT,
           where(what) + "only the root (rank " + std::to_string(opts.rootRank) + ") passes inputs");
    }
    flat = at::empty({0}, output.options());
  }
  const at::ScalarType dtype = output.scalar_type();
  return enqueue(
      c10d::OpType::SCATTER, what, output.device(),
      inputs.empty() ? std::vector<at::Tensor>{} : inputs[0], "", 0,
      alltoallOf(flat, splits, processSet_),
      [output, n, dtype, what](hora_request_t request) mutable {
        copyChunk(output, expectNumel(horaOutput(request, dtype, what), n, what), 0);
        return std::vector<at::Tensor>{output};
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHora::alltoall_base(
    at::Tensor &output, at::Tensor &input, std::vector<int64_t> &outputSplits,
    std::vector<int64_t> &inputSplits, const c10d::AllToAllOptions &) {
  const char *what = "alltoall_base";
  checkTensor(input, what, "input");
  checkTensor(output, what, "output");
  checkLike(output, input, what, "output", "the input");
  if (input.dim() == 0) {
    fail(HORA_ERR_INVALID_ARGUMENT, where(what) + "the input is a scalar; it is split along dim 0");
  }
  for (const auto *s : {&inputSplits, &outputSplits}) {
    if (!s->empty() && s->size() != static_cast<size_t>(size_)) {
      fail(HORA_ERR_INVALID_ARGUMENT,
           where(what) + (s == &inputSplits ? "input" : "output") + "_split_sizes has " +
               std::to_string(s->size()) + " entries for a group of " + std::to_string(size_));
    }
  }
  const std::vector<int64_t> expect = outputSplits;
  const at::ScalarType dtype = input.scalar_type();
  at::Tensor out = output;
  return enqueue(
      c10d::OpType::ALLTOALL_BASE, what, input.device(), {input}, "", 0,
      alltoallOf(input.contiguous(), inputSplits, processSet_),
      [out, expect, dtype, what](hora_request_t request) mutable {
        const int64_t *got = hora_request_received_splits(request);
        for (size_t r = 0; got != nullptr && r < expect.size(); ++r) {
          if (got[r] != expect[r]) {
            fail(HORA_ERR_MISMATCH, where(what) + "rank " + std::to_string(r) + " sent " +
                                        std::to_string(got[r]) +
                                        " rows but output_split_sizes expects " +
                                        std::to_string(expect[r]));
          }
        }
        copyChunk(out, expectNumel(horaOutput(request, dtype, what), out.numel(), what), 0);
        return std::vector<at::Tensor>{out};
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHora::alltoall(std::vector<at::Tensor> &outputs,
                                                          std::vector<at::Tensor> &inputs,
                                                          const c10d::AllToAllOptions &) {
  const char *what = "alltoall";
  if (inputs.size() != static_cast<size_t>(size_) || outputs.size() != inputs.size()) {
    fail(HORA_ERR_INVALID_ARGUMENT, where(what) + "expected " + std::to_string(size_) +
                                        " input and output tensors (one per rank), got " +
                                        std::to_string(inputs.size()) + " and " +
                                        std::to_string(outputs.size()));
  }
  const at::ScalarType dtype = inputs[0].scalar_type();
  std::vector<int64_t> splits;
  for (size_t i = 0; i < inputs.size(); ++i) {
    checkTensor(inputs[i], what, "input " + std::to_string(i));
    checkTensor(outputs[i], what, "output " + std::to_string(i));
    checkLike(inputs[i], inputs[0], what, "input " + std::to_string(i), "input 0");
    checkLike(outputs[i], inputs[0], what, "output " + std::to_string(i), "input 0");
    splits.push_back(inputs[i].numel());
  }
  std::vector<at::Tensor> outs = outputs;
  return enqueue(
      c10d::OpType::ALLTOALL, what, inputs[0].device(), inputs, "", 0,
      alltoallOf(concatenated(inputs), splits, processSet_),
      [outs, dtype, what](hora_request_t request) mutable {
        const at::Tensor received = horaOutput(request, dtype, what);
        const int64_t *got = hora_request_received_splits(request);
        int64_t offset = 0;
        for (size_t r = 0; r < outs.size(); ++r) {
          if (got == nullptr || got[r] != outs[r].numel()) {
            fail(HORA_ERR_MISMATCH, where(what) + "rank " + std::to_string(r) + " sent " +
                                        (got ? std::to_string(got[r]) : std::string("?")) +
                                        " elements but output " + std::to_string(r) + " holds " +
                                        std::to_string(outs[r].numel()));
          }
          copyChunk(outs[r], received, offset);
          offset += outs[r].numel();
        }
        return outs;
      });
}

// ------------------------------------------------------------------------------------------------
// Reduce-scatter: the inputs as [size, n] rows, so that hora's reducescatter gives rank i row i.

c10::intrusive_ptr<c10d::Work> ProcessGroupHora::reduce_scatter(
    std::vector<at::Tensor> &outputs, std::vector<std::vector<at::Tensor>> &inputs,
    const c10d::ReduceScatterOptions &opts) {
  const char *what = "reduce_scatter";
  const at::Tensor output = single(outputs, what, "output");
  if (inputs.size() != 1 || inputs[0].size() != static_cast<size_t>(size_)) {
    fail(HORA_ERR_INVALID_ARGUMENT,
         where(what) + "expected one list of " + std::to_string(size_) + " input tensors");
  }
  for (size_t i = 0; i < inputs[0].size(); ++i) {
    const std::string role = "input " + std::to_string(i);
    checkTensor(inputs[0][i], what, role);
    checkLike(inputs[0][i], output, what, role, "the output");
    if (inputs[0][i].numel() != output.numel()) {
      fail(HORA_ERR_INVALID_ARGUMENT, where(what) + role + " does not match the output's size");
    }
  }
  at::Tensor rows = concatenated(inputs[0]).reshape({size_, output.numel()});
  return reduceScatterRows(c10d::OpType::REDUCE_SCATTER, what, output, rows, true, inputs[0],
                           opts.reduceOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHora::_reduce_scatter_base(
    at::Tensor &output, at::Tensor &input, const c10d::ReduceScatterOptions &opts) {
  const char *what = "_reduce_scatter_base";
  checkTensor(input, what, "input");
  checkTensor(output, what, "output");
  checkLike(output, input, what, "output", "the input");
  if (input.numel() != output.numel() * size_) {
    fail(HORA_ERR_INVALID_ARGUMENT,
         where(what) + "the input has " + std::to_string(input.numel()) +
             " elements; it must hold " + std::to_string(size_) + " outputs of " +
             std::to_string(output.numel()));
  }
  const at::Tensor rows = input.contiguous().reshape({size_, output.numel()});
  return reduceScatterRows(c10d::OpType::_REDUCE_SCATTER_BASE, what, output, rows,
                           !input.is_contiguous(), {input}, opts.reduceOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHora::reduceScatterRows(
    c10d::OpType type, const char *what, at::Tensor output, at::Tensor rows, bool fresh,
    const std::vector<at::Tensor> &inputs, const c10d::ReduceOp &op) {
  const Reduction red = reductionFor(op, output.scalar_type(), what);
  const int32_t set = processSet_;
  const at::ScalarType dtype = output.scalar_type();
  const int64_t size = size_, rank = rank_, n = output.numel();
  const std::string signature = signatureOf(inputs);
  if (red.bitwise) {
    return enqueue(
        type, what, output.device(), inputs, signature,
        agreedKey({rows.reshape({1, -1})}, "bitwise"),
        allgatherOf(rows.reshape({1, -1}), set),
        [output, size, rank, n, dtype, red, what](hora_request_t request) mutable {
          const at::Tensor all = expectNumel(horaOutput(request, dtype, what), size * size * n, what);
          const at::Tensor folded = foldBitwise(all.view({size, size * n}), red.kind);
          copyChunk(output, folded, rank * n);
          return std::vector<at::Tensor>{output};
        });
  }
  // hora's reducescatter has no prescale: PREMUL_SUM's factor is applied here, in place only to
  // rows that are a copy.
  if (red.prescale != 1.0) rows = fresh ? rows.mul_(red.prescale) : rows.mul(red.prescale);
  return enqueue(
      type, what, output.device(), inputs, signature, agreedKey({rows}, opName(red.kind)),
      [rows, red, set](const char *name, hora_request_t *request) {
        const DLTensor in = toDl(rows);
        return hora_reducescatter_async(name, &in, red.op, set, request);
      },
      [output, n, dtype, what](hora_request_t request) mutable {
        copyChunk(output, expectNumel(horaOutput(request, dtype, what), n, what), 0);
        return std::vector<at::Tensor>{output};
      });
}

// ------------------------------------------------------------------------------------------------

// A one-element allreduce in the group's sequence: it completes on a rank once every member has
// reached it, and its Work after every earlier op of the group.
c10::intrusive_ptr<c10d::Work> ProcessGroupHora::barrier(const c10d::BarrierOptions &) {
  const at::Tensor token = at::zeros({1}, at::kInt);
  const int32_t set = processSet_;
  return enqueue(
      c10d::OpType::BARRIER, "barrier", c10::Device(c10::kCPU), {}, "", 0,
      [token, set](const char *name, hora_request_t *request) {
        DLTensor d = toDl(token);
        return hora_allreduce_async(name, &d, &d, HORA_OP_SUM, 1.0, 1.0, set, request);
      },
      [](hora_request_t) { return std::vector<at::Tensor>{}; });
}

namespace {
[[noreturn]] void noPointToPoint(const char *what) {
  fail(HORA_ERR_UNSUPPORTED,
       where(what) + "hora has collectives only, no point-to-point messages; for send/recv "
                     "use a gloo group next to the hora one (dist.new_group(backend=\"gloo\"))");
}
}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupHora::send(std::vector<at::Tensor> &, int, int) {
  noPointToPoint("send");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHora::recv(std::vector<at::Tensor> &, int, int) {
  noPointToPoint("recv");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHora::recvAnysource(std::vector<at::Tensor> &, int) {
  noPointToPoint("recv (any source)");
}

}  // namespace dist
}  // namespace hora

// SPDX-License-Identifier: Apache-2.0
// The C ABI: converts and checks the arguments and forwards them (to the runtime, api/runtime.h,
// and the engine, core/refusals.h); exceptions in, status codes and a thread-local last error out.
#include <hora/hora.h>

#include <climits>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include "api/runtime.h"
#include "base/error.h"
#include "core/engine.h"
#include "core/op_table.h"
#include "core/refusals.h"

namespace hora {
namespace {

thread_local std::string tLastError;
thread_local void *tlsCudaStream = nullptr;  // hora_cuda_set_stream: this thread's stream

// Every hora_request_t handed out and not yet freed. A handle is a token (RequestHandles), never
// a pointer, so a freed or made-up handle is looked up, not dereferenced. Never destroyed: a
// request may be freed from an exit handler.
RequestHandles &handles() {
  static RequestHandles *table = new RequestHandles;
  return *table;
}

hora_request_t toHandle(uintptr_t token) { return reinterpret_cast<hora_request_t>(token); }

// The live request behind `request`; throws INVALID_ARGUMENT naming `call` otherwise.
RequestPtr liveRequest(hora_request_t request, const char *call) {
  if (request == nullptr) HORA_THROW(HORA_ERR_INVALID_ARGUMENT, call, ": request is NULL");
  RequestPtr r = handles().find(reinterpret_cast<uintptr_t>(request));
  if (!r) {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, call, ": request ", static_cast<const void *>(request),
               " is not a live request (already freed with hora_request_free, or never "
               "returned by hora)");
  }
  return r;
}

std::shared_ptr<Engine> requireEngine(const char *call) {
  std::shared_ptr<Engine> engine = currentRuntime();
  if (!engine) HORA_THROW(HORA_ERR_NOT_INITIALIZED, call, ": hora_init has not been called");
  return engine;
}

template <typename F>
hora_status_t guarded(F &&body) {
  try {
    body();
    return HORA_SUCCESS;
  } catch (const Error &e) {
    tLastError = e.message();
    return e.status();
  } catch (const std::bad_alloc &) {
    tLastError = "out of memory";
    return HORA_ERR_INTERNAL;
  } catch (const std::exception &e) {
    tLastError = std::string("internal error: ") + e.what();
    return HORA_ERR_INTERNAL;
  }
}

constexpr int kMaxNdim = 64;

// Any DLPack dtype by name, for messages: "uint16", "complex64", "float32x4" (lanes), or the raw
// code where DLPack has no name for it.
std::string dlpackTypeName(DLDataType t) {
  const char *kind = nullptr;
  switch (t.code) {
    case kDLInt: kind = "int"; break;
    case kDLUInt: kind = "uint"; break;
    case kDLFloat: kind = "float"; break;
    case kDLBfloat: kind = "bfloat"; break;
    case kDLComplex: kind = "complex"; break;
    case kDLBoolCode: kind = "bool"; break;
    case kDLOpaqueHandle: kind = "opaque handle "; break;
    default: break;
  }
  std::string name = kind ? std::string(kind) + std::to_string(t.bits)
                          : "DLPack type code " + std::to_string(t.code) + " of " + std::to_string(t.bits) + " bits";
  if (t.lanes != 1) name += "x" + std::to_string(t.lanes);
  return name;
}

bool dtypeFromDl(DLDataType t, DType *out) {
  if (t.lanes != 1) return false;
  switch (t.code) {
    case kDLUInt:
      if (t.bits == 8) { *out = DType::kUInt8; return true; }
      return false;
    case kDLInt:
      if (t.bits == 8) { *out = DType::kInt8; return true; }
      if (t.bits == 16) { *out = DType::kInt16; return true; }
      if (t.bits == 32) { *out = DType::kInt32; return true; }
      if (t.bits == 64) { *out = DType::kInt64; return true; }
      return false;
    case kDLFloat:
      if (t.bits == 16) { *out = DType::kFloat16; return true; }
      if (t.bits == 32) { *out = DType::kFloat32; return true; }
      if (t.bits == 64) { *out = DType::kFloat64; return true; }
      return false;
    case kDLBfloat:
      if (t.bits == 16) { *out = DType::kBFloat16; return true; }
      return false;
    case kDLBoolCode:
      if (t.bits == 8) { *out = DType::kBool; return true; }
      return false;
    default: return false;
  }
}

struct Parsed {
  DType dtype;
  Device device;
  Shape shape;
  int64_t numel = 0;
  void *data = nullptr;
};

Parsed parseTensor(const OpCall &call, const char *role, const DLTensor *t) {
  auto bad = [&](auto &&...why) {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, call.where(), ": ", role, ": ", why...);
  };
  if (t == nullptr) bad("is NULL");
  if (t->ndim < 0 || t->ndim > kMaxNdim) bad("ndim ", t->ndim, " is outside [0, ", kMaxNdim, "]");
  if (t->ndim > 0 && t->shape == nullptr) bad("shape is NULL with ndim ", t->ndim);
  Parsed p;
  if (!dtypeFromDl(t->dtype, &p.dtype)) {
    bad("dtype ", dlpackTypeName(t->dtype), " (DLPack code ", int(t->dtype.code), ", bits ",
        int(t->dtype.bits), ", lanes ", t->dtype.lanes,
        ") is not supported; hora supports uint8, int8, int16, int32, int64, float16, "
        "bfloat16, float32, float64 and bool (8 bits) with lanes 1");
  }
  const int64_t esize = static_cast<int64_t>(dtypeSize(p.dtype));
  p.numel = 1;
  p.shape.reserve(static_cast<size_t>(t->ndim));
  for (int d = 0; d < t->ndim; ++d) {
    const int64_t dim = t->shape[d];
    if (dim < 0) bad("dimension ", d, " is negative (", dim, ")");
    int64_t next;
    if (__builtin_mul_overflow(p.numel, dim, &next) || next > (INT64_MAX / 2) / esize) {
      bad("shape overflows: more than ", (INT64_MAX / 2) / esize, " elements");
    }
    p.numel = next;
    p.shape.push_back(dim);
  }
  // A tensor without elements has no layout to get wrong (torch exports an empty (0, k) tensor
  // with strides [1, 1]).
  if (t->strides != nullptr && p.numel > 0) {
    int64_t expected = 1;
    for (int d = t->ndim - 1; d >= 0; --d) {
      // A dimension of extent 1 may carry any stride (frameworks do that); it moves nothing.
      if (t->shape[d] != 1 && t->strides[d] != expected) {
        bad("is not contiguous (stride ", t->strides[d], " in dimension ", d, ", expected ",
            expected, "); pass a compact row-major tensor");
      }
      expected *= t->shape[d];
    }
  }
  switch (t->device.device_type) {
    case kDLCPU:
    case kDLCUDAHost: p.device = Device{1, 0}; break;
    case kDLCUDA: {
      // The device plane's rule (no such device here, or no NCCL in this build).
      const std::string why = devices::whyNotUsable(t->device.device_id);
      if (!why.empty()) {
        HORA_THROW(HORA_ERR_UNSUPPORTED, call.where(), ": ", role, " is on cuda:",
                   t->device.device_id, ", but ", why);
      }
      p.device = Device{2, t->device.device_id};
      break;
    }
    default: bad("device type ", int(t->device.device_type), " is not supported (cpu or cuda)");
  }
  if (p.numel > 0 && t->data == nullptr) bad("data is NULL for ", p.numel, " elements");
  p.data = static_cast<char *>(t->data) + t->byte_offset;
  if (p.numel > 0 && reinterpret_cast<uintptr_t>(p.data) % static_cast<uintptr_t>(esize) != 0) {
    bad("data is not aligned to its ", esize, "-byte elements");
  }
  return p;
}

// An input whose first dimension the op splits or concatenates: it cannot be a scalar.
Parsed parseRowsTensor(const OpCall &call, const DLTensor *input) {
  Parsed t = parseTensor(call, "input", input);
  if (t.shape.empty()) {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, call.where(), ": input is a scalar (ndim 0); ",
               opTypeName(call.op), " works along the first dimension");
  }
  return t;
}

// The caller's op as an int, read without loading it as the enum type: any int may arrive
// through the C ABI, and a value outside the enum's range is undefined behaviour in C++.
int rawOp(const hora_reduce_op_t *op) {
  static_assert(sizeof(hora_reduce_op_t) == sizeof(int), "hora_reduce_op_t is an int-sized enum");
  int v;
  std::memcpy(&v, op, sizeof v);
  return v;
}

void checkOp(const OpCall &call, int op, DType dtype, Device device, double prescale,
             double postscale) {
  if (op < HORA_OP_SUM || op > HORA_OP_PRODUCT) {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, call.where(), ": reduce op ", op,
               " is not one of HORA_OP_SUM..HORA_OP_PRODUCT");
  }
  if (!std::isfinite(prescale) || !std::isfinite(postscale)) {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, call.where(), ": prescale ", prescale, " and postscale ",
               postscale, " must be finite");
  }
  if (dtype == DType::kBool) {
    if (op == HORA_OP_AVERAGE) {
      HORA_THROW(HORA_ERR_UNSUPPORTED, call.where(), ": AVERAGE is not supported on bool (SUM "
                 "and MAX reduce bool as logical OR, MIN and PRODUCT as logical AND)");
    }
    if (prescale != 1.0 || postscale != 1.0) {
      HORA_THROW(HORA_ERR_UNSUPPORTED, call.where(), ": prescale/postscale (", prescale, ", ",
                 postscale, ") are not supported on bool; scale factors apply to "
                 "floating-point tensors only");
    }
  }
  if (!device.isCpu()) {  // the device plane's own rule (int16: NCCL has no such type)
    const std::string why = devices::whyNotReduced(dtype);
    if (!why.empty()) {
      HORA_THROW(HORA_ERR_UNSUPPORTED, call.where(), ": ", dtypeName(dtype), " on ",
                 device.str(), " cannot be reduced: ", why);
    }
  }
  if (!isFloating(dtype)) {
    if (op == HORA_OP_AVERAGE) {
      HORA_THROW(HORA_ERR_UNSUPPORTED, call.where(), ": AVERAGE is not supported on ",
                 dtypeName(dtype), " (an integer average would be truncated); use SUM and divide");
    }
    if (prescale != 1.0 || postscale != 1.0) {
      HORA_THROW(HORA_ERR_UNSUPPORTED, call.where(), ": prescale/postscale (", prescale, ", ",
                 postscale, ") are not supported on ", dtypeName(dtype),
                 "; scale factors apply to floating-point tensors only");
    }
  }
}

// A collective's C entry point: the runtime, then the call's set and name, then `body(engine,
// call)`, whose errors the set's other ranks are told of (tellingRefusals).
template <typename F>
hora_status_t guardedOp(OpType op, const char *name, int32_t processSet, F &&body) {
  return guarded([&] {
    std::shared_ptr<Engine> engine = requireEngine(opTypeName(op));
    OpCall call = makeCall(*engine, op, name, processSet);
    tellingRefusals(*engine, call, [&] { body(*engine, call); });
  });
}

void checkRequestPtr(const OpCall &call, hora_request_t *request_p) {
  if (request_p == nullptr) {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, call.where(), ": request_p is NULL");
  }
}

// Takes the call's name (moved into the request). A failure to enqueue leaves the name taken
// in `call`, for the tombstone that tells the other ranks (tellingRefusals).
void submit(Engine &engine, OpCall &call, RequestMsg msg, std::vector<TensorArg> tensors,
            hora_request_t *request_p) {
  // The device work waits for what this thread had queued on its stream when it submitted.
  std::shared_ptr<void> ready;
  if (!msg.device.isCpu()) ready = devices::recordCallerWork(msg.device.id, tlsCudaStream);
  RequestPtr request = makeRequest(engine, call, std::move(msg), std::move(tensors));
  request->readyEvent = std::move(ready);
  const uintptr_t token = handles().add(request);
  try {
    submitCall(engine, call, request);
  } catch (...) {
    handles().remove(token);
    throw;
  }
  *request_p = toHandle(token);
}

// An allreduce writes every output while it still reads the inputs (a fused response is reduced
// where its tensors lie, in pieces, on every path), so an output may share memory with nothing
// but its own input, and only as that same tensor (in place). Anything else would be a silently
// wrong result on some paths: refused, naming both tensors. O(n log n) in the number of tensors.
void checkAllreduceOverlaps(const OpCall &call, const std::vector<TensorArg> &tensors, DType dtype) {
  const size_t esize = dtypeSize(dtype);
  const int n = static_cast<int>(tensors.size());
  auto span = [&](const void *p, int64_t numel) {
    const auto begin = reinterpret_cast<uintptr_t>(p);
    return std::pair<uintptr_t, uintptr_t>{begin, begin + static_cast<uintptr_t>(numel) * esize};
  };
  auto name = [n](const char *role, int i) {
    return n == 1 ? std::string(role) : detail::concat(role, " ", i);
  };
  struct Out {
    uintptr_t begin, end;
    int index;
  };
  std::vector<Out> outs;
  outs.reserve(tensors.size());
  for (int i = 0; i < n; ++i) {
    const TensorArg &t = tensors[static_cast<size_t>(i)];
    if (t.numel == 0) continue;
    const auto s = span(t.out, t.numel);
    outs.push_back({s.first, s.second, i});
  }
  std::sort(outs.begin(), outs.end(), [](const Out &a, const Out &b) { return a.begin < b.begin; });
  for (size_t k = 1; k < outs.size(); ++k) {
    if (outs[k].begin < outs[k - 1].end) {
      HORA_THROW(HORA_ERR_INVALID_ARGUMENT, call.where(), ": ", name("output", outs[k].index),
                 " overlaps ", name("output", outs[k - 1].index),
                 "; every output needs memory of its own");
    }
  }
  for (int i = 0; i < n; ++i) {
    const TensorArg &t = tensors[static_cast<size_t>(i)];
    if (t.numel == 0) continue;
    const auto in = span(t.in, t.numel);
    // The outputs are disjoint and sorted: the ones that can overlap `in` end just before the
    // first that starts at or after in.second.
    auto it = std::lower_bound(outs.begin(), outs.end(), in.second,
                               [](const Out &o, uintptr_t end) { return o.begin < end; });
    while (it != outs.begin()) {
      --it;
      if (it->end <= in.first) break;
      const bool inPlace = it->index == i && it->begin == in.first;
      if (!inPlace) {
        const uintptr_t lo = std::max(in.first, it->begin);
        HORA_THROW(HORA_ERR_INVALID_ARGUMENT, call.where(), ": ", name("output", it->index),
                   " overlaps ", name("input", i), " (", std::min(in.second, it->end) - lo,
                   " bytes in common, the output starting ",
                   it->begin >= in.first ? detail::concat(it->begin - in.first, " bytes after")
                                         : detail::concat(in.first - it->begin, " bytes before"),
                   " the input); pass the same tensor as input and output for an in-place "
                   "allreduce, or tensors that do not overlap");
      }
    }
  }
}

void allreduceImpl(Engine &engine, OpCall &call, int n, const DLTensor *inputs, DLTensor *outputs,
                   int op, double prescale, double postscale, hora_request_t *request_p) {
  checkRequestPtr(call, request_p);
  if (n < 1) HORA_THROW(HORA_ERR_INVALID_ARGUMENT, call.where(), ": ", n, " tensors");
  if (inputs == nullptr || outputs == nullptr) {
    HORA_THROW(HORA_ERR_INVALID_ARGUMENT, call.where(), ": ", inputs ? "output" : "input", " is NULL");
  }
  RequestMsg msg;
  std::vector<TensorArg> tensors;
  msg.shapes.reserve(static_cast<size_t>(n));
  tensors.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const std::string role = n == 1 ? "input" : detail::concat("input ", i);
    const std::string outRole = n == 1 ? "output" : detail::concat("output ", i);
    Parsed in = parseTensor(call, role.c_str(), &inputs[i]);
    Parsed out = parseTensor(call, outRole.c_str(), &outputs[i]);
    if (out.dtype != in.dtype || out.shape != in.shape || out.device != in.device) {
      HORA_THROW(HORA_ERR_INVALID_ARGUMENT, call.where(), ": ", outRole, " (", dtypeName(out.dtype),
                 shapeString(out.shape), " on ", out.device.str(), ") differs from ", role, " (",
                 dtypeName(in.dtype), shapeString(in.shape), " on ", in.device.str(), ")");
    }
    if (i == 0) {
      msg.dtype = in.dtype;
      msg.device = in.device;
    } else if (in.dtype != msg.dtype || in.device != msg.device) {
      HORA_THROW(HORA_ERR_INVALID_ARGUMENT, call.where(), ": ", role, " is ", dtypeName(in.dtype),
                 " on ", in.device.str(), " but input 0 is ", dtypeName(msg.dtype), " on ",
                 msg.device.str(), "; a group shares one dtype and device");
    }
    tensors.push_back(TensorArg{in.data, out.data, in.numel});
    msg.shapes.push_back(std::move(in.shape));
  }
  checkAllreduceOverlaps(call, tensors, msg.dtype);
  checkOp(call, op, msg.dtype, msg.device, prescale, postscale);
  msg.reduceOp = static_cast<ReduceOp>(op);
  msg.prescale = prescale;
  msg.postscale = postscale;
  submit(engine, call, std::move(msg), std::move(tensors), request_p);
}

}  // namespace
}  // namespace hora

using namespace hora;

extern "C" {

hora_status_t hora_init(void) {
  return guarded([] { initRuntime(); });
}

hora_status_t hora_shutdown(void) {
  return guarded([] {
    if (!shutdownRuntime()) HORA_THROW(HORA_ERR_NOT_INITIALIZED, "hora_shutdown: hora is not initialized");
  });
}

int hora_is_initialized(void) {
  std::shared_ptr<Engine> e = currentRuntime();
  return e && e->running() ? 1 : 0;
}

int hora_elastic_world_changed(void) {
  int changed = 0;
  const hora_status_t status = guarded([&] { changed = runtimeWorldChanged(); });
  return status == HORA_SUCCESS ? changed : -1;
}

#define HORA_TOPOLOGY_GETTER(fn, field)            \
  int fn(void) {                                   \
    std::shared_ptr<Engine> e = currentRuntime();   \
    return e ? e->topology().field : -1;           \
  }
HORA_TOPOLOGY_GETTER(hora_rank, rank)
HORA_TOPOLOGY_GETTER(hora_size, size)
HORA_TOPOLOGY_GETTER(hora_local_rank, localRank)
HORA_TOPOLOGY_GETTER(hora_local_size, localSize)
HORA_TOPOLOGY_GETTER(hora_cross_rank, crossRank)
HORA_TOPOLOGY_GETTER(hora_cross_size, crossSize)
#undef HORA_TOPOLOGY_GETTER

hora_status_t hora_allreduce_async(const char *name, const DLTensor *input, DLTensor *output,
                                   hora_reduce_op_t op, double prescale, double postscale,
                                   int32_t process_set, hora_request_t *request_p) {
  const int opv = rawOp(&op);
  return guardedOp(OpType::kAllreduce, name, process_set, [&](Engine &engine, OpCall &call) {
    allreduceImpl(engine, call, 1, input, output, opv, prescale, postscale, request_p);
  });
}

hora_status_t hora_grouped_allreduce_async(const char *name, int n, const DLTensor *inputs,
                                           DLTensor *outputs, hora_reduce_op_t op, double prescale,
                                           double postscale, int32_t process_set,
                                           hora_request_t *request_p) {
  const int opv = rawOp(&op);
  return guardedOp(OpType::kAllreduce, name, process_set, [&](Engine &engine, OpCall &call) {
    allreduceImpl(engine, call, n, inputs, outputs, opv, prescale, postscale, request_p);
  });
}

hora_status_t hora_broadcast_async(const char *name, DLTensor *tensor, int root,
                                   int32_t process_set, hora_request_t *request_p) {
  return guardedOp(OpType::kBroadcast, name, process_set, [&](Engine &engine, OpCall &call) {
    checkRequestPtr(call, request_p);
    Parsed t = parseTensor(call, "tensor", tensor);
    const int size = engine.processSetSize(process_set);
    if (root < 0 || root >= size) {
      HORA_THROW(HORA_ERR_INVALID_ARGUMENT, call.where(), ": root ", root,
                 " is outside the process set's ranks [0, ", size, ")");
    }
    RequestMsg msg;
    msg.dtype = t.dtype;
    msg.device = t.device;
    msg.root = root;
    msg.shapes.push_back(t.shape);
    submit(engine, call, std::move(msg), {TensorArg{t.data, t.data, t.numel}}, request_p);
  });
}

hora_status_t hora_allgather_async(const char *name, const DLTensor *input, int32_t process_set,
                                   hora_request_t *request_p) {
  return guardedOp(OpType::kAllgather, name, process_set, [&](Engine &engine, OpCall &call) {
    checkRequestPtr(call, request_p);
    Parsed t = parseRowsTensor(call, input);
    RequestMsg msg;
    msg.dtype = t.dtype;
    msg.device = t.device;
    msg.shapes.push_back(t.shape);
    submit(engine, call, std::move(msg), {TensorArg{t.data, nullptr, t.numel}}, request_p);
  });
}

hora_status_t hora_alltoall_async(const char *name, const DLTensor *input, const int64_t *splits,
                                  int32_t process_set, hora_request_t *request_p) {
  return guardedOp(OpType::kAlltoall, name, process_set, [&](Engine &engine, OpCall &call) {
    checkRequestPtr(call, request_p);
    Parsed t = parseRowsTensor(call, input);
    const int size = engine.processSetSize(process_set);
    const int64_t rows = t.shape[0];
    RequestMsg msg;
    msg.dtype = t.dtype;
    msg.device = t.device;
    msg.shapes.push_back(t.shape);
    if (splits == nullptr) {
      if (rows % size != 0) {
        HORA_THROW(HORA_ERR_INVALID_ARGUMENT, call.where(), ": splits is NULL (even split) but ",
                   rows, " rows do not divide among ", size, " ranks");
      }
      msg.splits.assign(static_cast<size_t>(size), rows / size);
    } else {
      int64_t sum = 0;
      for (int r = 0; r < size; ++r) {
        if (splits[r] < 0) {
          HORA_THROW(HORA_ERR_INVALID_ARGUMENT, call.where(), ": splits[", r, "] is negative (",
                     splits[r], ")");
        }
        sum += splits[r];
        msg.splits.push_back(splits[r]);
      }
      if (sum != rows) {
        HORA_THROW(HORA_ERR_INVALID_ARGUMENT, call.where(), ": splits ", shapeString(msg.splits),
                   " sum to ", sum, " but the first dimension is ", rows);
      }
    }
    submit(engine, call, std::move(msg), {TensorArg{t.data, nullptr, t.numel}}, request_p);
  });
}

hora_status_t hora_reducescatter_async(const char *name, const DLTensor *input,
                                       hora_reduce_op_t op, int32_t process_set,
                                       hora_request_t *request_p) {
  const int opv = rawOp(&op);
  return guardedOp(OpType::kReducescatter, name, process_set, [&](Engine &engine, OpCall &call) {
    checkRequestPtr(call, request_p);
    Parsed t = parseRowsTensor(call, input);
    checkOp(call, opv, t.dtype, t.device, 1.0, 1.0);
    RequestMsg msg;
    msg.dtype = t.dtype;
    msg.device = t.device;
    msg.reduceOp = static_cast<ReduceOp>(opv);
    msg.shapes.push_back(t.shape);
    submit(engine, call, std::move(msg), {TensorArg{t.data, nullptr, t.numel}}, request_p);
  });
}

// Submits an op without tensors to `processSet` and waits for it; returns the request.
RequestPtr runBlocking(Engine &engine, OpType op, int32_t processSet, std::vector<int64_t> args) {
  makeCall(engine, op, nullptr, processSet);
  RequestMsg msg;
  msg.name = engine.autoNames().next(processSet, op);
  msg.op = op;
  msg.splits = std::move(args);
  auto request = std::make_shared<Request>(std::move(msg), processSet, std::vector<TensorArg>{});
  engine.submit(request);
  engine.drive(*request);
  Status status = request->wait();
  if (!status.ok()) throw Error(status.code, status.message, __FILE__, __LINE__);
  return request;
}

hora_status_t hora_barrier(int32_t process_set) {
  return guarded([&] {
    auto engine = requireEngine("barrier");
    runBlocking(*engine, OpType::kBarrier, process_set, {});
  });
}

hora_status_t hora_join(int32_t process_set, int *last_joined_rank_p) {
  return guarded([&] {
    auto engine = requireEngine("join");
    RequestPtr r = runBlocking(*engine, OpType::kJoin, process_set, {});
    engine->autoNames().newEpoch(process_set);
    if (last_joined_rank_p != nullptr) *last_joined_rank_p = static_cast<int>(r->result);
  });
}

hora_status_t hora_poll(hora_request_t request, int *done_p) {
  return guarded([&] {
    RequestPtr r = liveRequest(request, "hora_poll");
    if (done_p == nullptr) HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "hora_poll: done_p is NULL");
    *done_p = r->done() ? 1 : 0;
  });
}

hora_status_t hora_wait(hora_request_t request) {
  return guarded([&] {
    RequestPtr r = liveRequest(request, "hora_wait");
    if (!r->done()) {
      if (std::shared_ptr<Engine> engine = currentRuntime()) engine->drive(*r);
    }
    Status status = r->wait();
    if (!status.ok()) throw Error(status.code, status.message, __FILE__, __LINE__);
  });
}

hora_status_t hora_cuda_wait(hora_request_t request, void *stream) {
  return guarded([&] {
    RequestPtr r = liveRequest(request, "hora_cuda_wait");
    if (!r->done()) {
      if (std::shared_ptr<Engine> engine = currentRuntime()) engine->drive(*r);
    }
    Status status = r->waitOnStream(stream);
    if (!status.ok()) throw Error(status.code, status.message, __FILE__, __LINE__);
  });
}

// The request's output, or nullptr (with the last error set for a bad handle). The request
// stays alive while its handle does, so the pointer outlives this call's reference. A CUDA
// request's output is there once its work is queued (a stream-ordered wait returned).
const DLTensor *requestOutput(hora_request_t request, const char *call, RequestPtr *out) {
  RequestPtr r;
  if (guarded([&] { r = liveRequest(request, call); }) != HORA_SUCCESS) return nullptr;
  if (!(r->done() ? r->status().ok() : r->isLaunched())) return nullptr;
  if (out != nullptr) *out = r;
  return r->output();
}

const DLTensor *hora_request_output(hora_request_t request) {
  return requestOutput(request, "hora_request_output", nullptr);
}

const int64_t *hora_request_received_splits(hora_request_t request) {
  RequestPtr r;
  if (requestOutput(request, "hora_request_received_splits", &r) == nullptr ||
      r->msg().op != OpType::kAlltoall) {
    return nullptr;
  }
  return r->receivedSplits.data();
}

void hora_request_free(hora_request_t request) {
  if (request == nullptr) return;  // as free(NULL)
  guarded([&] {
    RequestPtr r = handles().remove(reinterpret_cast<uintptr_t>(request));
    if (!r) {
      HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "hora_request_free: request ",
                 static_cast<const void *>(request),
                 " is not a live request (already freed, or never returned by hora); "
                 "nothing was freed");
    }
  });
}

hora_status_t hora_process_set_create(const int *ranks, int nranks, int32_t *id_p) {
  return guarded([&] {
    auto engine = requireEngine("hora_process_set_create");
    // Collective over the world, named by call order: a refusal takes its name (tellingRefusals).
    OpCall call = makeCall(*engine, OpType::kProcessSetCreate, nullptr, 0);
    std::vector<int64_t> sorted;
    tellingRefusals(*engine, call, [&] {
      if (ranks == nullptr || id_p == nullptr) {
        HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "hora_process_set_create: ",
                   ranks ? "id_p" : "ranks", " is NULL");
      }
      const int world = engine->topology().size;
      if (nranks < 1 || nranks > world) {
        HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "hora_process_set_create: nranks ", nranks,
                   " is outside [1, ", world, "]");
      }
      sorted.assign(ranks, ranks + nranks);
      std::sort(sorted.begin(), sorted.end());
      for (size_t i = 0; i < sorted.size(); ++i) {
        if (sorted[i] < 0 || sorted[i] >= world) {
          HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "hora_process_set_create: rank ", sorted[i],
                     " is outside the world [0, ", world, ")");
        }
        if (i > 0 && sorted[i] == sorted[i - 1]) {
          HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "hora_process_set_create: rank ", sorted[i],
                     " is listed twice");
        }
      }
    });
    RequestPtr r = runBlocking(*engine, OpType::kProcessSetCreate, 0, std::move(sorted));
    *id_p = static_cast<int32_t>(r->result);
  });
}

hora_status_t hora_process_set_destroy(int32_t id) {
  return guarded([&] {
    auto engine = requireEngine("hora_process_set_destroy");
    OpCall call = makeCall(*engine, OpType::kProcessSetDestroy, nullptr, 0);
    tellingRefusals(*engine, call, [&] {
      if (id == 0) {
        HORA_THROW(HORA_ERR_INVALID_ARGUMENT,
                   "hora_process_set_destroy: set 0 (all ranks) cannot be destroyed");
      }
      if (engine->processSetSize(id) < 0) {
        HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "hora_process_set_destroy: unknown process set ", id);
      }
    });
    runBlocking(*engine, OpType::kProcessSetDestroy, 0, {id});
  });
}

hora_status_t hora_process_set_abort(int32_t id, hora_status_t status, const char *reason) {
  return guarded([&] {
    auto engine = requireEngine("hora_process_set_abort");
    if (status == HORA_SUCCESS || status < HORA_ERR_INVALID_ARGUMENT || status > HORA_ERR_INTERNAL) {
      HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "hora_process_set_abort: status ",
                 static_cast<int>(status), " is not an error status");
    }
    std::string why = reason != nullptr ? std::string(reason, strnlen(reason, kMaxReasonBytes))
                                        : std::string("(no reason given)");
    if (why.empty()) why = "(no reason given)";
    engine->abortSet(id, Status{status, detail::concat("rank ", engine->processSetRank(id),
                                                       " aborted process set ", id, ": ", why)});
  });
}

int hora_process_set_rank(int32_t id) {
  std::shared_ptr<Engine> e = currentRuntime();
  return e ? e->processSetRank(id) : -1;
}

int hora_process_set_size(int32_t id) {
  std::shared_ptr<Engine> e = currentRuntime();
  return e ? e->processSetSize(id) : -1;
}

hora_status_t hora_cuda_set_stream(void *stream) {
  return guarded([stream] {
    if (!devices::available()) {
      HORA_THROW(HORA_ERR_UNSUPPORTED, "hora_cuda_set_stream: this build has no NCCL backend");
    }
    tlsCudaStream = stream;
  });
}

hora_status_t hora_timeline_start(const char *path) {
  return guarded([path] {
    if (path == nullptr) HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "hora_timeline_start: path is NULL");
    requireEngine("hora_timeline_start")->timeline().start(path);
  });
}

hora_status_t hora_timeline_stop(void) {
  return guarded([] { requireEngine("hora_timeline_stop")->timeline().stop(); });
}

hora_status_t hora_reject(const char *op, const char *name, int32_t process_set,
                          const char *reason) {
  return guarded([&] {
    auto engine = requireEngine("hora_reject");
    if (op == nullptr) HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "hora_reject: op is NULL");
    // The names the ops' own error messages use: the op table's, of the ops with tensors; a
    // grouped allreduce negotiates as an allreduce.
    std::optional<OpType> found;
    if (std::strcmp(op, "grouped_allreduce") == 0) found = OpType::kAllreduce;
    for (int i = 0; i < kNumOpTypes && !found; ++i) {
      const OpSpec &spec = opSpec(static_cast<OpType>(i));
      if (spec.carriesTensors && std::strcmp(spec.name, op) == 0) found = spec.op;
    }
    if (!found) {
      std::string names;
      for (int i = 0; i < kNumOpTypes; ++i) {
        const OpSpec &spec = opSpec(static_cast<OpType>(i));
        if (spec.carriesTensors) names += detail::concat(spec.name, ", ");
      }
      HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "hora_reject: op '", std::string(op, strnlen(op, 64)),
                 "' is not one of ", names, "grouped_allreduce");
    }
    OpCall call = makeCall(*engine, *found,
                         name != nullptr && name[0] == '\0' ? nullptr : name, process_set);
    enqueueTombstone(*engine, call, reason != nullptr ? reason : "");
  });
}

hora_status_t hora_set_join_mode(int mode) {
  return guarded([mode] {
    if (mode != HORA_JOIN_ZERO_FILL && mode != HORA_JOIN_ALLREDUCE_ONLY) {
      HORA_THROW(HORA_ERR_INVALID_ARGUMENT, "hora_set_join_mode: mode ", mode,
                 " is neither HORA_JOIN_ZERO_FILL (0) nor HORA_JOIN_ALLREDUCE_ONLY (1)");
    }
    setProcessJoinMode(static_cast<uint8_t>(mode));
  });
}

const char *hora_status_string(hora_status_t status) { return statusString(status); }

const char *hora_last_error(void) { return tLastError.c_str(); }

}  // extern "C"

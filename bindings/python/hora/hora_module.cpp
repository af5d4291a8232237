// SPDX-License-Identifier: Apache-2.0
// hora._hora: the C API for Python. Tensors come in as DLPack capsules (numpy arrays, torch
// tensors, anything with __dlpack__) and go out as objects with __dlpack__; every collective is
// asynchronous and returns a Request. The pure-Python package `hora` builds the user API on it.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <hora/hora.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

// Raises hora's exception for `status` (hora.errors picks the class), with hora's message.
[[noreturn]] void raiseStatus(hora_status_t status, const std::string &why,
                              const char *what) {
  std::string message = why.empty() ? std::string(what) + ": " + hora_status_string(status)
                                    : why;
  py::object cls = py::module_::import("hora.errors").attr("error_class")(static_cast<int>(status));
  py::object error = cls(message, static_cast<int>(status));
  PyErr_SetObject(cls.ptr(), error.ptr());
  throw py::error_already_set();
}

// hora_last_error is thread-local and valid until the next hora call: read it at once.
void check(hora_status_t status, const char *what) {
  if (status != HORA_SUCCESS) raiseStatus(status, hora_last_error(), what);
}

// One DLPack export of a caller's tensor. The capsule owns the exporter's DLManagedTensor and is
// kept unconsumed: when the request is done with the memory the capsule dies and its destructor
// releases the tensor, exactly as if nobody had imported it.
struct Exported {
  py::object capsule;
  DLTensor *tensor;
};

Exported exportTensor(const py::handle &obj, const char *role) {
  py::object capsule;
  if (PyCapsule_CheckExact(obj.ptr())) {
    capsule = py::reinterpret_borrow<py::object>(obj);
  } else if (py::hasattr(obj, "__dlpack__")) {
    capsule = obj.attr("__dlpack__")();
  } else {
    throw py::type_error(std::string("hora: the ") + role + " (a " +
                         std::string(py::str(obj.get_type().attr("__name__"))) +
                         ") has no __dlpack__: pass a numpy array, a torch tensor or another "
                         "DLPack producer");
  }
  if (PyCapsule_IsValid(capsule.ptr(), "dltensor") == 0) {
    throw py::value_error(std::string("hora: the ") + role +
                          "'s __dlpack__ gave no unconsumed \"dltensor\" capsule");
  }
  auto *managed =
      static_cast<DLManagedTensor *>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  return {std::move(capsule), &managed->dl_tensor};
}

// Threads of this process inside a blocking hora call (a wait, a barrier, hora_init...): what
// hora.run's parent reads, through each rank's watcher thread, to tell a rank that hung in its
// own code from the ranks that wait in hora for it.
std::atomic<int> gBlocked{0};

struct Blocked {
  Blocked() { gBlocked.fetch_add(1, std::memory_order_relaxed); }
  ~Blocked() { gBlocked.fetch_sub(1, std::memory_order_relaxed); }
};

// Runs a blocking C call with the GIL released (other Python threads, a framework's data loaders
// and hooks, run meanwhile) and raises its error.
template <typename Call>
void callBlocking(const char *what, Call &&call) {
  hora_status_t status;
  std::string why;
  {
    Blocked blocked;
    py::gil_scoped_release unlocked;
    status = call();
    if (status != HORA_SUCCESS) why = hora_last_error();
  }
  if (status != HORA_SUCCESS) raiseStatus(status, why, what);
}

const char *cName(const std::string &name) { return name.empty() ? nullptr : name.c_str(); }

// The C request, freed when the last of its Python holders (the Request and any output arrays
// made from it) goes away.
struct RequestBox {
  explicit RequestBox(hora_request_t r) : request(r) {}
  ~RequestBox() { hora_request_free(request); }
  RequestBox(const RequestBox &) = delete;
  RequestBox &operator=(const RequestBox &) = delete;
  hora_request_t request;
};

// Requests whose Python object died while hora still worked on their tensors: hora frees the C
// request once it completes, but the tensors (their capsules here) must stay alive until then.
// Swept, with the GIL held, at every submission.
struct Orphan {
  std::shared_ptr<RequestBox> box;
  std::vector<py::object> keepAlive;
};
std::vector<Orphan> &orphans() {
  static auto *list = new std::vector<Orphan>();  // never destroyed: holds Python objects
  return *list;
}
void sweepOrphans() {
  auto &list = orphans();
  for (size_t i = 0; i < list.size();) {
    int done = 0;
    if (hora_poll(list[i].box->request, &done) != HORA_SUCCESS || done != 0) {
      list[i] = std::move(list.back());
      list.pop_back();
    } else {
      ++i;
    }
  }
}

// What an output array holds on to: the C request, which owns the memory.
struct OutputContext {
  std::shared_ptr<RequestBox> box;
  std::vector<int64_t> strides;
  DLManagedTensor managed{};
};

void deleteOutputContext(DLManagedTensor *managed) {
  delete static_cast<OutputContext *>(managed->manager_ctx);
}

void destroyUnconsumedCapsule(PyObject *capsule) {
  // An importer renames the capsule "used_dltensor" and then owns the tensor.
  if (PyCapsule_IsValid(capsule, "dltensor") == 0) return;
  auto *managed = static_cast<DLManagedTensor *>(PyCapsule_GetPointer(capsule, "dltensor"));
  managed->deleter(managed);
}

// The struct-module format of a DLPack dtype; nullptr where numpy has none (bfloat16).
const char *bufferFormat(DLDataType t) {
  if (t.lanes != 1) return nullptr;
  switch (t.code) {
    case kDLFloat:
      return t.bits == 16 ? "e" : t.bits == 32 ? "f" : t.bits == 64 ? "d" : nullptr;
    case kDLInt:
      return t.bits == 8 ? "b" : t.bits == 16 ? "h" : t.bits == 32 ? "i" : t.bits == 64 ? "q"
                                                                                      : nullptr;
    case kDLUInt:
      return t.bits == 8 ? "B" : t.bits == 16 ? "H" : t.bits == 32 ? "I" : t.bits == 64 ? "Q"
                                                                                       : nullptr;
    default:
      return nullptr;
  }
}

// A tensor hora allocated (allgather, alltoall, reducescatter): numpy.from_dlpack and
// torch.utils.dlpack.from_dlpack take it without a copy.
class Output {
 public:
  Output(std::shared_ptr<RequestBox> box, const DLTensor &tensor)
      : box_(std::move(box)), tensor_(tensor) {}

  py::object dlpack(const py::object & /*stream*/) const {
    auto *ctx = new OutputContext{box_, {}, {}};
    ctx->strides.resize(static_cast<size_t>(tensor_.ndim));
    int64_t stride = 1;
    for (int d = tensor_.ndim - 1; d >= 0; --d) {
      ctx->strides[static_cast<size_t>(d)] = stride;
      stride *= tensor_.shape[d];
    }
    ctx->managed.dl_tensor = tensor_;
    ctx->managed.dl_tensor.strides = ctx->strides.empty() ? nullptr : ctx->strides.data();
    ctx->managed.manager_ctx = ctx;
    ctx->managed.deleter = &deleteOutputContext;
    PyObject *capsule = PyCapsule_New(&ctx->managed, "dltensor", &destroyUnconsumedCapsule);
    if (capsule == nullptr) {
      delete ctx;
      throw py::error_already_set();
    }
    return py::reinterpret_steal<py::object>(capsule);
  }

  py::tuple device() const {
    return py::make_tuple(static_cast<int>(tensor_.device.device_type),
                          tensor_.device.device_id);
  }

  // numpy takes CPU outputs through the buffer protocol, writable (its DLPack import makes
  // read-only arrays).
  py::buffer_info buffer() const {
    if (tensor_.device.device_type != kDLCPU) {
      throw py::buffer_error("hora: a device tensor has no buffer; use DLPack");
    }
    const char *format = bufferFormat(tensor_.dtype);
    if (format == nullptr) {
      // bfloat16 in practice: numpy has none.
      const std::string name = tensor_.dtype.code == kDLBfloat ? "bfloat" : "DLPack code " + std::to_string(tensor_.dtype.code) + ", ";
      throw py::buffer_error("hora: numpy has no type for " + name + std::to_string(tensor_.dtype.bits) +
                             (tensor_.dtype.code == kDLBfloat ? "" : " bits") + "; use DLPack (torch.from_dlpack)");
    }
    const auto itemsize = static_cast<py::ssize_t>(tensor_.dtype.bits / 8);
    std::vector<py::ssize_t> shape(tensor_.shape, tensor_.shape + tensor_.ndim);
    std::vector<py::ssize_t> strides(shape.size());
    py::ssize_t stride = itemsize;
    for (size_t d = shape.size(); d-- > 0;) {
      strides[d] = stride;
      stride *= shape[d];
    }
    return py::buffer_info(static_cast<char *>(tensor_.data) + tensor_.byte_offset, itemsize,
                           format, static_cast<py::ssize_t>(shape.size()), shape, strides);
  }

  std::vector<int64_t> shape() const {
    return std::vector<int64_t>(tensor_.shape, tensor_.shape + tensor_.ndim);
  }

 private:
  std::shared_ptr<RequestBox> box_;
  DLTensor tensor_;
};

// One submitted collective. Holds its tensors' capsules until it completes.
class Request {
 public:
  Request(hora_request_t request, std::vector<py::object> keepAlive, const char *what)
      : box_(std::make_shared<RequestBox>(request)),
        keepAlive_(std::move(keepAlive)),
        what_(what) {}

  ~Request() {
    if (!finished_ && !keepAlive_.empty()) {
      int done = 0;
      if (hora_poll(box_->request, &done) == HORA_SUCCESS && done == 0) {
        orphans().push_back({box_, std::move(keepAlive_)});
      }
    }
  }
  Request(const Request &) = delete;
  Request &operator=(const Request &) = delete;

  bool poll() {
    if (finished_) return true;
    int done = 0;
    check(hora_poll(box_->request, &done), "hora_poll");
    return done != 0;
  }

  // Blocks with the GIL released; raises the op's error, every time it is called.
  void wait() {
    if (!finished_) {
      Blocked blocked;
      py::gil_scoped_release unlocked;
      status_ = hora_wait(box_->request);
      if (status_ != HORA_SUCCESS) why_ = hora_last_error();
      finished_ = true;
    }
    keepAlive_.clear();
    if (status_ != HORA_SUCCESS) raiseStatus(status_, why_, what_);
  }

  // Stream-ordered (hora_cuda_wait): returns once the op's device work is queued, `stream` (a
  // cudaStream_t as an int) waiting for its end; raises the op's error if it failed before.
  // The tensors stay held until the op completes (or the orphans keep them).
  void waitOnStream(uintptr_t stream) {
    if (finished_ || streamWaited_) {
      if (finished_ && status_ != HORA_SUCCESS) raiseStatus(status_, why_, what_);
      return;
    }
    hora_status_t status;
    {
      Blocked blocked;
      py::gil_scoped_release unlocked;
      status = hora_cuda_wait(box_->request, reinterpret_cast<void *>(stream));
    }
    if (status != HORA_SUCCESS) {
      status_ = status;
      why_ = hora_last_error();
      finished_ = true;
      keepAlive_.clear();
      raiseStatus(status_, why_, what_);
    }
    streamWaited_ = true;
  }

  py::object output() {
    if (!streamWaited_) wait();
    const DLTensor *tensor = hora_request_output(box_->request);
    if (tensor == nullptr) return py::none();
    return py::cast(Output(box_, *tensor));
  }

  std::vector<int64_t> receivedSplitsOf(int parts) {
    if (!streamWaited_) wait();
    const int64_t *splits = hora_request_received_splits(box_->request);
    if (splits == nullptr) return {};
    return std::vector<int64_t>(splits, splits + parts);
  }

 private:
  std::shared_ptr<RequestBox> box_;
  std::vector<py::object> keepAlive_;
  const char *what_;
  bool finished_ = false;
  bool streamWaited_ = false;  // waitOnStream returned: outputs are there, tensors still held
  hora_status_t status_ = HORA_SUCCESS;
  std::string why_;
};

hora_reduce_op_t reduceOp(int op) {
  if (op < HORA_OP_SUM || op > HORA_OP_PRODUCT) {
    throw py::value_error("hora: unknown reduce op " + std::to_string(op) +
                          " (Sum=0, Average=1, Min=2, Max=3, Product=4)");
  }
  return static_cast<hora_reduce_op_t>(op);
}

std::unique_ptr<Request> allreduce(const py::object &input, const py::object &output, int op,
                                   double prescale, double postscale, int32_t processSet,
                                   const std::string &name) {
  sweepOrphans();
  Exported in = exportTensor(input, "input");
  std::vector<py::object> keep{in.capsule};
  DLTensor *out = in.tensor;
  if (!output.is_none() && !output.is(input)) {
    Exported o = exportTensor(output, "output");
    out = o.tensor;
    keep.push_back(o.capsule);
  }
  hora_request_t request = nullptr;
  check(hora_allreduce_async(cName(name), in.tensor, out, reduceOp(op), prescale, postscale,
                             processSet, &request),
        "allreduce");
  return std::make_unique<Request>(request, std::move(keep), "allreduce");
}

std::unique_ptr<Request> groupedAllreduce(const std::vector<py::object> &inputs,
                                          const std::vector<py::object> &outputs, int op,
                                          double prescale, double postscale,
                                          int32_t processSet, const std::string &name) {
  sweepOrphans();
  if (!outputs.empty() && outputs.size() != inputs.size()) {
    throw py::value_error("hora: grouped_allreduce got " + std::to_string(inputs.size()) +
                          " inputs but " + std::to_string(outputs.size()) + " outputs");
  }
  std::vector<py::object> keep;
  std::vector<DLTensor> in, out;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Exported e = exportTensor(inputs[i], "input");
    in.push_back(*e.tensor);
    keep.push_back(e.capsule);
    if (outputs.empty() || outputs[i].is(inputs[i])) {
      out.push_back(*e.tensor);
    } else {
      Exported o = exportTensor(outputs[i], "output");
      out.push_back(*o.tensor);
      keep.push_back(o.capsule);
    }
  }
  hora_request_t request = nullptr;
  check(hora_grouped_allreduce_async(cName(name), static_cast<int>(in.size()), in.data(),
                                     out.data(), reduceOp(op), prescale, postscale, processSet,
                                     &request),
        "grouped_allreduce");
  return std::make_unique<Request>(request, std::move(keep), "grouped_allreduce");
}

std::unique_ptr<Request> broadcast(const py::object &tensor, int root, int32_t processSet,
                                   const std::string &name) {
  sweepOrphans();
  Exported t = exportTensor(tensor, "tensor");
  hora_request_t request = nullptr;
  check(hora_broadcast_async(cName(name), t.tensor, root, processSet, &request), "broadcast");
  return std::make_unique<Request>(request, std::vector<py::object>{t.capsule}, "broadcast");
}

std::unique_ptr<Request> allgather(const py::object &input, int32_t processSet,
                                   const std::string &name) {
  sweepOrphans();
  Exported in = exportTensor(input, "input");
  hora_request_t request = nullptr;
  check(hora_allgather_async(cName(name), in.tensor, processSet, &request), "allgather");
  return std::make_unique<Request>(request, std::vector<py::object>{in.capsule}, "allgather");
}

std::unique_ptr<Request> alltoall(const py::object &input, const py::object &splits,
                                  int32_t processSet, const std::string &name) {
  sweepOrphans();
  Exported in = exportTensor(input, "input");
  std::vector<int64_t> counts;
  if (!splits.is_none()) counts = splits.cast<std::vector<int64_t>>();
  hora_request_t request = nullptr;
  check(hora_alltoall_async(cName(name), in.tensor, splits.is_none() ? nullptr : counts.data(),
                            processSet, &request),
        "alltoall");
  return std::make_unique<Request>(request, std::vector<py::object>{in.capsule}, "alltoall");
}

std::unique_ptr<Request> reducescatter(const py::object &input, int op, int32_t processSet,
                                       const std::string &name) {
  sweepOrphans();
  Exported in = exportTensor(input, "input");
  hora_request_t request = nullptr;
  check(hora_reducescatter_async(cName(name), in.tensor, reduceOp(op), processSet, &request),
        "reducescatter");
  return std::make_unique<Request>(request, std::vector<py::object>{in.capsule},
                                   "reducescatter");
}

}  // namespace

PYBIND11_MODULE(_hora, m) {
  m.doc() = "hora's C API for Python; use the `hora` package, which is built on it.";

  m.def("init", [] { callBlocking("hora_init", [] { return hora_init(); }); });
  m.def("shutdown", [] { callBlocking("hora_shutdown", [] { return hora_shutdown(); }); });
  m.def("is_initialized", [] { return hora_is_initialized() != 0; });
  m.def("_blocked_calls", [] { return gBlocked.load(std::memory_order_relaxed); },
        "threads of this process inside a blocking hora call (for hora.run's timeout message)");
  m.def("elastic_world_changed", [] {
    const int changed = hora_elastic_world_changed();
    if (changed < 0) raiseStatus(HORA_ERR_PEER_LOST, hora_last_error(), "hora_elastic_world_changed");
    return changed == 1;
  });
  m.def("rank", &hora_rank);
  m.def("size", &hora_size);
  m.def("local_rank", &hora_local_rank);
  m.def("local_size", &hora_local_size);
  m.def("cross_rank", &hora_cross_rank);
  m.def("cross_size", &hora_cross_size);

  py::class_<Output>(m, "Output", py::buffer_protocol(),
                     "A tensor hora allocated; import it with numpy.asarray or "
                     "torch.utils.dlpack.from_dlpack (no copy).")
      .def_buffer(&Output::buffer)
      .def("__dlpack__", &Output::dlpack, py::arg("stream") = py::none())
      .def("__dlpack_device__", &Output::device)
      .def_property_readonly("shape", &Output::shape);

  py::class_<Request>(m, "Request", "One collective in flight.")
      .def("poll", &Request::poll, "True once the op completed (never blocks).")
      .def("wait", &Request::wait,
           "Blocks (GIL released) until the op completes; raises its error.")
      .def("wait_on_stream", &Request::waitOnStream, py::arg("stream"),
           "Stream-ordered: returns once the op's device work is queued, the CUDA stream "
           "`stream` (a cudaStream_t as an int) waiting for its end; raises the op's error if "
           "it failed before.")
      .def("output", &Request::output,
           "After wait: the tensor hora allocated (allgather, alltoall, reducescatter), or None.")
      .def("received_splits", &Request::receivedSplitsOf, py::arg("parts"),
           "alltoall: rows received from each of the set's `parts` ranks.");

  m.def("allreduce", &allreduce, py::arg("input"), py::arg("output"), py::arg("op"),
        py::arg("prescale"), py::arg("postscale"), py::arg("process_set"), py::arg("name"));
  m.def("grouped_allreduce", &groupedAllreduce, py::arg("inputs"), py::arg("outputs"),
        py::arg("op"), py::arg("prescale"), py::arg("postscale"), py::arg("process_set"),
        py::arg("name"));
  m.def("broadcast", &broadcast, py::arg("tensor"), py::arg("root"), py::arg("process_set"),
        py::arg("name"));
  m.def("allgather", &allgather, py::arg("input"), py::arg("process_set"), py::arg("name"));
  m.def("alltoall", &alltoall, py::arg("input"), py::arg("splits"), py::arg("process_set"),
        py::arg("name"));
  m.def("reducescatter", &reducescatter, py::arg("input"), py::arg("op"),
        py::arg("process_set"), py::arg("name"));

  m.def("barrier", [](int32_t processSet) {
    callBlocking("barrier", [processSet] { return hora_barrier(processSet); });
  });
  m.def("join", [](int32_t processSet) {
    int last = -1;
    callBlocking("join", [processSet, &last] { return hora_join(processSet, &last); });
    return last;
  });
  m.def("process_set_create", [](const std::vector<int> &ranks) {
    int32_t id = -1;
    callBlocking("process_set_create", [&ranks, &id] {
      return hora_process_set_create(ranks.data(), static_cast<int>(ranks.size()), &id);
    });
    return id;
  });
  m.def("process_set_destroy", [](int32_t id) {
    callBlocking("process_set_destroy", [id] { return hora_process_set_destroy(id); });
  });
  m.def("process_set_rank", &hora_process_set_rank);
  m.def("process_set_size", &hora_process_set_size);

  m.def("cuda_set_stream", [](uintptr_t stream) {
    check(hora_cuda_set_stream(reinterpret_cast<void *>(stream)), "cuda_set_stream");
  });
  // A refusal of the caller's own (a check in Python before reaching hora) told to the set's
  // other ranks, whose op of that name then fails instead of waiting (hora_reject). Never raises:
  // it runs while the caller's own error is on its way, and does nothing when hora is not running
  // or the set is unknown.
  m.def(
      "reject",
      [](const py::object &op, const py::object &name, const py::object &processSet,
         const py::object &reason) {
        try {
          const std::string opName = py::str(op);
          const bool unnamed = name.is_none();
          const std::string tensor = unnamed ? std::string() : std::string(py::str(name));
          const int32_t set = processSet.is_none() ? 0 : processSet.cast<int32_t>();
          const std::string why = reason.is_none() ? std::string() : std::string(py::str(reason));
          hora_reject(opName.c_str(), unnamed ? nullptr : tensor.c_str(), set, why.c_str());
        } catch (...) {  // a conversion's Python error is dropped with it
        }
      },
      py::arg("op"), py::arg("name"), py::arg("process_set"), py::arg("reason"));
  m.def(
      "set_join_mode", [](int mode) { check(hora_set_join_mode(mode), "set_join_mode"); },
      py::arg("mode"));
  m.def("timeline_start",
        [](const std::string &path) { check(hora_timeline_start(path.c_str()), "timeline_start"); });
  m.def("timeline_stop", [] { check(hora_timeline_stop(), "timeline_stop"); });
  // What this build has, for hora.torch's mpi_built() and friends.
  m.def("built", [] {
    py::dict d;
    d["mpi"] = HORA_PY_HAVE_MPI != 0;
    d["gloo"] = HORA_PY_HAVE_GLOO != 0;
    d["nccl"] = HORA_PY_HAVE_NCCL != 0;
    d["nccl_version"] = HORA_PY_NCCL_VERSION;  // NCCL_VERSION_CODE built against; 0 without NCCL
    return d;
  });
  m.def("status_string", [](int status) {
    return std::string(hora_status_string(static_cast<hora_status_t>(status)));
  });
}

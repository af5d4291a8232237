// SPDX-License-Identifier: Apache-2.0
// hora.distributed._c10d: ProcessGroupHora for Python. hora.distributed starts hora and makes
// its process sets through the hora package; this module only adds the ProcessGroup.
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

#include "process_group_hora.h"

namespace py = pybind11;
using hora::dist::ProcessGroupHora;
using hora::dist::StatusError;

PYBIND11_MODULE(_c10d, m) {
  m.doc() = "hora's torch.distributed backend (a c10d ProcessGroup on torch 1.13, a c10d "
            "Backend on torch 2); use `import hora.distributed`, then "
            "torch.distributed.init_process_group(\"hora\")";
#if HORA_TORCH_CUDA
  m.attr("CUDA") = true;  // CUDA tensors go to hora's NCCL backend
#else
  m.attr("CUDA") = false;  // torch without CUDA, or hora without NCCL: CPU tensors only
#endif

  // ProcessGroup's (Backend's) Python type comes from torch; it must be registered before ours
  // derives it.
  py::module_::import("torch.distributed");

  // hora's failures become hora's exception classes (hora.MismatchError, ..., all RuntimeErrors)
  // wherever torch lets them out: the op's call, Work.wait(), a future's wait() or value().
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError &e) {
      const int status = static_cast<int>(e.status());
      py::object cls = py::module_::import("hora.errors").attr("error_class")(status);
      PyErr_SetObject(cls.ptr(), cls(e.what(), status).ptr());
    }
  });

  // Its base: c10d::ProcessGroup on torch 1.13, c10d::Backend on torch 2 (type-checked only here).
  py::class_<ProcessGroupHora, hora::dist::ProcessGroupBase, c10::intrusive_ptr<ProcessGroupHora>>(
      m, "ProcessGroupHora",
      "A torch.distributed ProcessGroup whose collectives run on hora. Made by "
      "init_process_group(\"hora\") and new_group(); `rank`/`size` are torch's, checked against "
      "hora's process set.")
      .def(py::init([](int rank, int size, int32_t processSet, std::string groupName,
                       double timeoutS) {
             // at least 1 ms when there is one: 0 means none
             const int64_t ms =
                 timeoutS > 0 ? std::max<int64_t>(1, static_cast<int64_t>(timeoutS * 1000.0 + 0.5))
                              : 0;
             return c10::make_intrusive<ProcessGroupHora>(rank, size, processSet,
                                                          std::move(groupName),
                                                          std::chrono::milliseconds(ms));
           }),
           py::arg("rank"), py::arg("size"), py::arg("process_set"), py::arg("group_name"),
           py::arg("timeout") = 0.0,
           "`timeout`: the group's timeout in seconds (torch's init_process_group/new_group "
           "timeout); an op not complete that long after its call fails, and the group with it. "
           "0: none (hora's own HORA_TIMEOUT_S and HORA_STALL_SHUTDOWN_S still apply).")
      .def_static("_stop_all", [] {
            py::gil_scoped_release release;
            ProcessGroupHora::stopAll();
          },
          "At interpreter exit (hora.distributed registers it): hora shuts down and every "
          "group's threads are joined while Python is still whole.")
      .def_property_readonly("process_set", &ProcessGroupHora::processSet)
      .def_property_readonly("group_name", &ProcessGroupHora::groupName)
      .def_property_readonly(
          "timeout", [](const ProcessGroupHora &pg) { return pg.timeout().count() / 1000.0; },
          "the group's timeout in seconds (0: none)");
}

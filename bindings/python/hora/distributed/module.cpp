// SPDX-License-Identifier: Apache-2.0
// hora.distributed._c10d: ProcessGroupHora for Python. hora.distributed starts hora and makes
// its process sets through the hora package; this module only adds the ProcessGroup.
#include <torch/csrc/utils/pybind.h>

#include <string>
#include <utility>

#include "process_group_hora.h"

namespace py = pybind11;
using hora::dist::ProcessGroupHora;
using hora::dist::StatusError;

PYBIND11_MODULE(_c10d, m) {
  m.doc() = "hora's torch.distributed backend (a c10d ProcessGroup for torch 1.13); use "
            "`import hora.distributed`, then torch.distributed.init_process_group(\"hora\")";

  // ProcessGroup's Python type comes from torch; it must be registered before ours derives it.
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

  py::class_<ProcessGroupHora, c10d::ProcessGroup, c10::intrusive_ptr<ProcessGroupHora>>(
      m, "ProcessGroupHora",
      "A torch.distributed ProcessGroup whose collectives run on hora. Made by "
      "init_process_group(\"hora\") and new_group(); `rank`/`size` are torch's, checked against "
      "hora's process set.")
      .def(py::init([](int rank, int size, int32_t processSet, std::string groupName) {
             return c10::make_intrusive<ProcessGroupHora>(rank, size, processSet,
                                                          std::move(groupName));
           }),
           py::arg("rank"), py::arg("size"), py::arg("process_set"), py::arg("group_name"))
      .def_property_readonly("process_set", &ProcessGroupHora::processSet)
      .def_property_readonly("group_name", &ProcessGroupHora::groupName);
}

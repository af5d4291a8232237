// SPDX-License-Identifier: Apache-2.0
// hora.distributed._c10d: ProcessGroupHora for Python, and the hora calls its creator makes.
#include <torch/csrc/utils/pybind.h>

#include <string>
#include <vector>

#include "process_group_hora.h"

namespace py = pybind11;
using hora::dist::ProcessGroupHora;
using hora::dist::StatusError;

namespace {

void check(hora_status_t status, const char *what) {
  if (status != HORA_SUCCESS) {
    const char *why = hora_last_error();
    throw StatusError(status, std::string("hora backend: ") + what + ": " +
                                  (why != nullptr && why[0] != '\0' ? why
                                                                    : hora_status_string(status)));
  }
}

// A ProcessGroupHora dies when its last reference goes, often in Python with the GIL held; its
// destructor waits for the watcher thread, which may be running a Python callback of a future.
void joinWithoutGil(const std::function<void()> &join) {
  if (Py_IsInitialized() != 0 && PyGILState_Check() != 0) {
    py::gil_scoped_release release;
    join();
  } else {
    join();
  }
}

}  // namespace

PYBIND11_MODULE(_c10d, m) {
  m.doc() = "hora's torch.distributed backend (a c10d ProcessGroup for torch 1.13); use "
            "`import hora.distributed`, then torch.distributed.init_process_group(\"hora\")";

  // ProcessGroup's Python type comes from torch; it must be registered before ours derives it.
  py::module_::import("torch.distributed");

  ProcessGroupHora::setBlockingWrapper(&joinWithoutGil);

  // hora's failures become hora's exception classes (all RuntimeErrors), wherever torch lets
  // them out: the op's call, Work.wait(), a future's wait() or value().
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError &e) {
      try {
        py::object error = py::module_::import("hora.distributed")
                               .attr("_make_error")(static_cast<int>(e.status()), e.what());
        PyErr_SetObject(reinterpret_cast<PyObject *>(Py_TYPE(error.ptr())), error.ptr());
      } catch (py::error_already_set &) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
      }
    }
  });

  m.def("init", [] { check(hora_init(), "hora_init"); }, py::call_guard<py::gil_scoped_release>(),
        "hora_init(): forms hora's world (MPI, env:// variables, ...). Blocks.");
  m.def("shutdown", [] { check(hora_shutdown(), "hora_shutdown"); },
        py::call_guard<py::gil_scoped_release>());
  m.def("is_initialized", [] { return hora_is_initialized() != 0; });
  m.def("world", [] { return py::make_tuple(hora_rank(), hora_size()); },
        "(rank, size) of hora's world; (-1, -1) before init");
  m.def(
      "process_set",
      [](const std::vector<int> &ranks) {
        int32_t id = -1;
        check(hora_process_set_create(ranks.data(), static_cast<int>(ranks.size()), &id),
              "hora_process_set_create");
        return id;
      },
      py::arg("ranks"), py::call_guard<py::gil_scoped_release>(),
      "The hora process set of these world ranks, made if new. Collective over hora's world.");

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

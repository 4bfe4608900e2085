#include "errors.h"

#include <string>

#include "kiln/error.h"
#include "kiln/session.h"

namespace kiln::python {

namespace py = pybind11;

namespace {

// The classes, made once at import; never freed (the module lives as long as the interpreter).
struct ErrorClasses {
  PyObject* base = nullptr;  // KilnError
  PyObject* invalid_model = nullptr;
  PyObject* unsupported = nullptr;
  PyObject* invalid_argument = nullptr;
  PyObject* runtime = nullptr;
  PyObject* io = nullptr;
  PyObject* memory = nullptr;
  PyObject* cancelled = nullptr;
};

ErrorClasses classes;

PyObject* make_class(py::module_& module, const char* name, PyObject* base, PyObject* also,
                     const char* doc) {
  const std::string qualified = std::string("kiln.") + name;
  py::object bases = also ? py::object(py::make_tuple(py::handle(base), py::handle(also)))
                          : py::reinterpret_borrow<py::object>(base);
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases.ptr(), /*dict=*/nullptr);
  if (!cls) throw py::error_already_set();
  module.add_object(name, py::handle(cls));
  return cls;
}

PyObject* class_for(const Error& e) {
  if (dynamic_cast<const RunCancelled*>(&e)) return classes.cancelled;
  switch (e.kind()) {
    case ErrorKind::InvalidModel:
      return classes.invalid_model;
    case ErrorKind::Unsupported:
      return classes.unsupported;
    case ErrorKind::InvalidArgument:
      return classes.invalid_argument;
    case ErrorKind::Runtime:
      return classes.runtime;
    case ErrorKind::Io:
      return classes.io;
    case ErrorKind::Memory:
      return classes.memory;
  }
  return classes.base;
}

// Raises `e` as its class, with the message kiln formats and the parts as attributes.
void raise(const Error& e) {
  PyObject* cls = class_for(e);
  py::object instance = py::reinterpret_borrow<py::object>(cls)(e.what());
  instance.attr("message") = e.message();
  instance.attr("file") = e.file();
  instance.attr("node") = e.node();
  instance.attr("op") = e.op();
  PyErr_SetObject(cls, instance.ptr());
}

}  // namespace

void register_errors(py::module_& module) {
  classes.base = make_class(module, "KilnError", PyExc_RuntimeError, nullptr,
                            "An error kiln reported. str() is kiln's one-line message; the "
                            "attributes message, file, node and op hold its parts.");
  classes.invalid_model = make_class(module, "InvalidModelError", classes.base, nullptr,
                                     "A malformed or truncated model, or bad external data.");
  classes.unsupported = make_class(module, "UnsupportedError", classes.base, nullptr,
                                   "An op, opset, attribute or element type kiln lacks.");
  classes.invalid_argument =
      make_class(module, "InvalidArgumentError", classes.base, PyExc_ValueError,
                 "Bad arguments to a call: unknown or missing inputs, wrong element type or shape. "
                 "Also a ValueError.");
  classes.runtime = make_class(module, "RunError", classes.base, nullptr,
                               "A kernel found its inputs inconsistent while running.");
  classes.io = make_class(module, "FileError", classes.base, PyExc_OSError,
                          "A file could not be opened or read. Also an OSError.");
  classes.memory = make_class(module, "OutOfMemoryError", classes.base, PyExc_MemoryError,
                              "A tensor over the memory limit or beyond what the machine can "
                              "allocate. Also a MemoryError.");
  classes.cancelled = make_class(module, "RunCancelledError", classes.runtime, nullptr,
                                 "A run stopped through its RunOptions (terminate or timeout); "
                                 "the session stays usable.");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      raise(e);
    }
  });
}

}  // namespace kiln::python

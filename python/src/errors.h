// kiln::Error as Python exceptions: kiln.KilnError (a RuntimeError) and one subclass per
// ErrorKind, carrying kiln's message and its file, node and op as attributes.
#pragma once

#include <pybind11/pybind11.h>

namespace kiln::python {

// Creates the exception classes in `module` and registers the translation of kiln::Error.
void register_errors(pybind11::module_& module);

}  // namespace kiln::python

// The generate layer's Python bindings (audio, tokenizer, Whisper, causal LM).
#pragma once

#include <pybind11/pybind11.h>

namespace kiln::python {

void bind_generate(pybind11::module_& m);

}  // namespace kiln::python

// NumPy .npy files (format versions 1-3, little-endian, C order) <-> tensors.
#pragma once

#include <string>

#include "kiln/tensor.h"

namespace kiln::tooling {

// Throws kiln::Error (InvalidArgument) naming the file for anything it cannot read.
Tensor read_npy(const std::string& path);
void write_npy(const std::string& path, const Tensor& tensor);

}  // namespace kiln::tooling

// docs/ops.md, generated from the op registry.
#pragma once

#include <string>

namespace kiln::tooling {

// The whole markdown document: one row per registered (domain, op, opset range).
std::string ops_markdown();

}  // namespace kiln::tooling

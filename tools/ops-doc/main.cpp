// Writes docs/ops.md (or the path given) from the op registry.
#include <fstream>
#include <iostream>

#include "tools/common/ops_table.h"

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : "docs/ops.md";
  std::ofstream out(path);
  out << kiln::tooling::ops_markdown();
  if (!out) {
    std::cerr << "ops-doc: cannot write " << path << "\n";
    return 2;
  }
  return 0;
}

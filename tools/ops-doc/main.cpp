// Writes docs/ops.md (or the path given) from the op registry.
#include <fstream>
#include <iostream>

#include "tools/common/cli.h"
#include "tools/common/ops_table.h"

int main(int argc, char** argv) {
  std::string path = "docs/ops.md";
  CLI::App app("Writes the table of supported ops from the op registry.", "kiln-ops-doc");
  kiln::tooling::configure(app);
  app.add_option("PATH", path, "the Markdown file to write (default docs/ops.md)")->type_name("");
  if (const auto status = kiln::tooling::parse_command_line(app, argc, argv)) return *status;
  std::ofstream out(path);
  out << kiln::tooling::ops_markdown();
  if (!out) {
    std::cerr << "kiln-ops-doc: cannot write " << path << "\n";
    return 2;
  }
  return 0;
}

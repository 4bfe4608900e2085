// Documents generated from the code must match the code.
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "test/unit/op_test.h"
#include "tools/common/ops_table.h"

TEST_CASE("docs/ops.md matches the op registry (run `make ops-doc`)", "[docs]") {
  std::ifstream in(std::string(KILN_SOURCE_DIR) + "/docs/ops.md");
  REQUIRE(in);
  std::stringstream ss;
  ss << in.rdbuf();
  const bool up_to_date = ss.str() == kiln::tooling::ops_markdown();
  INFO("docs/ops.md is stale: run `make ops-doc` and commit it");
  CHECK(up_to_date);
}

// Every repository path a document names in backquotes (`ops/linalg/det.cpp`) exists: files
// move, and the map must move with them.
TEST_CASE("the files the documents name exist", "[docs]") {
  namespace fs = std::filesystem;
  const fs::path root(KILN_SOURCE_DIR);
  const std::regex quoted(
      "`((?:engine|ops|proto|tools|test|python|docs|cmake|\\.ci)/"
      "[A-Za-z0-9_./-]+\\.(?:h|cpp|py|md|txt|json|cmake|sh))`");
  std::vector<std::string> missing;
  int named = 0;
  std::vector<fs::path> docs{root / "README.md"};
  for (const auto& e : fs::directory_iterator(root / "docs"))
    if (e.path().extension() == ".md") docs.push_back(e.path());
  for (const fs::path& doc : docs) {
    std::ifstream in(doc);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    for (std::sregex_iterator it(text.begin(), text.end(), quoted), end; it != end; ++it) {
      ++named;
      const std::string path = (*it)[1].str();
      if (!fs::exists(root / path)) missing.push_back(doc.filename().string() + ": " + path);
    }
  }
  std::string list;
  for (const std::string& m : missing) list += m + "\n";
  INFO(missing.size() << " of " << named << " named files missing:\n" << list);
  CHECK(missing.empty());
  CHECK(named >= 100);
}

// Documents generated from the code must match the code.
#include <fstream>
#include <sstream>

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

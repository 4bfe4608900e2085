#include "tools/common/ops_table.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <vector>

#include "kiln/ops.h"

namespace kiln::tooling {

std::string ops_markdown() {
  std::vector<OpSupport> regs = supported_ops();
  // Ops the unit tests register for themselves (domain kiln.test) are not kiln's.
  std::erase_if(regs, [](const OpSupport& r) { return r.domain == "kiln.test"; });
  std::sort(regs.begin(), regs.end(), [](const OpSupport& a, const OpSupport& b) {
    if (a.domain != b.domain) return a.domain < b.domain;
    if (a.op != b.op) return a.op < b.op;
    return a.since < b.since;
  });
  std::map<std::string, int> per_domain;
  for (const OpSupport& r : regs) ++per_domain[r.domain.empty() ? "ai.onnx" : r.domain];
  std::ostringstream out;
  out << "# Supported operators\n\n"
      << "Generated from kiln's op registry by `make ops-doc`; a unit test fails when this file\n"
      << "is out of date. An op used at an opset outside its range, or with an element type not\n"
      << "listed, is reported as unsupported when the model is loaded or run.\n\n";
  for (const auto& [domain, n] : per_domain) out << "- " << domain << ": " << n << " ops\n";
  out << "\n| domain | op | opsets | element types | writes in place | strided inputs |\n"
      << "|---|---|---|---|---|---|\n";
  for (const OpSupport& r : regs) {
    std::string range = std::to_string(r.since) +
                        (r.until == OpSupport::kLatestOpset ? "+" : "-" + std::to_string(r.until));
    std::string in_place;
    for (int i = 0; i < 32; ++i) {
      if (r.in_place & (1u << i)) in_place += (in_place.empty() ? "" : ",") + std::to_string(i);
    }
    if (r.in_place == ~0u) in_place = "all";
    if (r.in_place == ~3u) in_place = "2+";
    out << "| " << (r.domain.empty() ? "ai.onnx" : r.domain) << " | " << r.op << " | " << range
        << " | " << r.types << " | " << (in_place.empty() ? "-" : "input " + in_place) << " | "
        << (r.strided_inputs ? "yes" : "-") << " |\n";
  }
  return out.str();
}

}  // namespace kiln::tooling

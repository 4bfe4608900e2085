#include <string>
#include <unordered_map>

#include "kiln/ops.h"
#include "ops/core/kernel.h"

namespace kiln::ops {
namespace {

// The op registry: the one piece of global mutable state, written only by static
// registration before main() and read-only afterwards.
struct Registry {
  std::vector<OpRegistration> all;
  std::unordered_map<std::string, std::vector<size_t>> by_key;  // "domain\x1fop" -> indices
};

Registry& registry() {
  static Registry r;
  return r;
}

std::string key(const std::string& domain, const std::string& op) {
  return domain + '\x1f' + op;
}

}  // namespace

bool register_op(const OpRegistration& reg) {
  Registry& r = registry();
  r.by_key[key(reg.domain, reg.op)].push_back(r.all.size());
  r.all.push_back(reg);
  return true;
}

const OpRegistration* find_op(const std::string& domain, const std::string& op, int64_t opset) {
  const Registry& r = registry();
  auto it = r.by_key.find(key(domain, op));
  if (it == r.by_key.end()) return nullptr;
  for (size_t i : it->second) {
    const OpRegistration& reg = r.all[i];
    if (opset >= reg.since && opset <= reg.until) return &reg;
  }
  return nullptr;
}

const std::vector<OpRegistration>& all_ops() {
  return registry().all;
}

}  // namespace kiln::ops

namespace kiln {

std::vector<OpSupport> supported_ops() {
  std::vector<OpSupport> out;
  for (const ops::OpRegistration& r : ops::all_ops()) {
    out.push_back({.domain = r.domain,
                   .op = r.op,
                   .since = r.since,
                   .until = r.until == ops::kLatestOpset ? OpSupport::kLatestOpset : r.until,
                   .types = r.types,
                   .in_place = r.in_place,
                   .strided_inputs = r.strided_inputs});
  }
  return out;
}

}  // namespace kiln

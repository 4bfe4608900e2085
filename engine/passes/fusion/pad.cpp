#include "engine/passes/fusion/pad.h"

#include <optional>
#include <string>
#include <vector>

namespace kiln::passes::fusion {
namespace {

// The values of a 1-D int64 tensor when the facts know every one, or nullopt.
std::optional<std::vector<int64_t>> constant_ints(Rewriter& r, ir::ValueId v) {
  const ops::ValueFacts& f = r.facts(v);
  if (!f.has_data || f.dtype != DataType::Int64 || f.rank() != 1) return std::nullopt;
  return f.data;
}

// The Pad's pads per axis of a rank-`rank` input as [begin..., end...], when they are known
// and it pads with zeros in constant mode; else nullopt.
std::optional<std::vector<int64_t>> zero_pads(Rewriter& r, const ir::Node& pad, int64_t rank) {
  const ir::Attribute* mode = pad.attr("mode");
  if (mode && mode->s != "constant") return std::nullopt;
  std::vector<int64_t> pads;
  if (pad.opset < 11) {
    const ir::Attribute* p = pad.attr("pads");
    const ir::Attribute* value = pad.attr("value");
    if (!p || (value && value->f != 0.0f)) return std::nullopt;
    pads = p->ints;
  } else {
    const auto given = pad.inputs.size() > 1 ? constant_ints(r, pad.inputs[1]) : std::nullopt;
    if (!given) return std::nullopt;
    pads = *given;
    if (pad.inputs.size() > 2 && pad.inputs[2] != ir::kNoValue) {
      const Tensor* value = r.constant(pad.inputs[2]);
      const std::optional<double> v = r.scalar(pad.inputs[2]);
      if (!value || value->numel() != 1 || !v || *v != 0.0) return std::nullopt;
    }
    if (pad.inputs.size() > 3 && pad.inputs[3] != ir::kNoValue) {
      // Pads for the listed axes only: spread over every axis.
      const auto axes = constant_ints(r, pad.inputs[3]);
      if (!axes || pads.size() != 2 * axes->size()) return std::nullopt;
      std::vector<int64_t> full(static_cast<size_t>(2 * rank), 0);
      std::vector<bool> seen(static_cast<size_t>(rank), false);
      const size_t n = axes->size();
      for (size_t k = 0; k < n; ++k) {
        int64_t a = (*axes)[k];
        if (a < 0) a += rank;
        if (a < 0 || a >= rank || seen[static_cast<size_t>(a)]) return std::nullopt;
        seen[static_cast<size_t>(a)] = true;
        full[static_cast<size_t>(a)] = pads[k];
        full[static_cast<size_t>(a + rank)] = pads[k + n];
      }
      pads = std::move(full);
    }
  }
  if (static_cast<int64_t>(pads.size()) != 2 * rank) return std::nullopt;
  for (int64_t p : pads)
    if (p < 0) return std::nullopt;  // a negative pad crops
  return pads;
}

// Whether `n` takes padding as zeros it reads: a Conv, or an AveragePool that counts them.
bool pads_with_zeros(const ir::Node& n) {
  if (is(n, "Conv")) return true;
  if (!is(n, "AveragePool")) return false;
  const ir::Attribute* count = n.attr("count_include_pad");
  return count && count->i != 0;
}

}  // namespace

int fold_pad_into_window(Rewriter& r) {
  int count = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i) || !is(r.node(i), "Pad") || r.node(i).inputs.empty()) continue;
    ir::Node* pad = &r.node(i);
    const ir::ValueId x = pad->inputs[0];
    const ir::ValueId y = pad->outputs.empty() ? ir::kNoValue : pad->outputs[0];
    ir::Node* window = r.sole_reader(y);
    if (!window || !pads_with_zeros(*window) || window->inputs.empty() || window->inputs[0] != y)
      continue;
    const int64_t rank = r.rank(x);
    if (rank < 3) continue;
    const auto pads = zero_pads(r, *pad, rank);
    if (!pads || (*pads)[0] || (*pads)[1] || (*pads)[static_cast<size_t>(rank)] ||
        (*pads)[static_cast<size_t>(rank + 1)]) {
      continue;  // batch or channels padded
    }
    const ir::Attribute* auto_pad = window->attr("auto_pad");
    if (auto_pad && !auto_pad->s.empty() && auto_pad->s != "NOTSET") continue;
    // The window op's pads: [begin of each spatial axis..., end of each...].
    const auto spatial = static_cast<size_t>(rank - 2);
    std::vector<int64_t> merged(2 * spatial, 0);
    if (const ir::Attribute* own = window->attr("pads")) {
      if (own->ints.size() != 2 * spatial) continue;
      merged = own->ints;
    }
    for (size_t k = 0; k < spatial; ++k) {
      merged[k] += (*pads)[2 + k];
      merged[spatial + k] += (*pads)[static_cast<size_t>(rank) + 2 + k];
    }
    bool found = false;
    for (ir::Attribute& a : window->attributes) {
      if (a.name != "pads") continue;
      a.ints = merged;
      found = true;
    }
    if (!found) {
      ir::Attribute a;
      a.name = "pads";
      a.kind = ir::AttrKind::Ints;
      a.ints = merged;
      window->attributes.push_back(std::move(a));
    }
    window->inputs[0] = x;
    r.remove(pad);
    ++count;
  }
  return count;
}

}  // namespace kiln::passes::fusion

#include "engine/passes/fusion/conv.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/passes/fusion/activations.h"
#include "engine/passes/fusion/channel_transform.h"

namespace kiln::passes::fusion {
namespace {

// A Conv whose filter a fold may rewrite: its constant float filter (rank >= 3, at least one
// output channel), the channel count m, the filter values per channel, and its bias as
// doubles (zeros when it has none).
struct FoldableConv {
  const Tensor* w = nullptr;
  int64_t m = 0, per = 0;
  std::vector<double> bias;
};

std::optional<FoldableConv> foldable_conv(Rewriter& r, const ir::Node& conv) {
  if (conv.inputs.size() < 2) return std::nullopt;
  const Tensor* w = r.constant(conv.inputs[1]);
  if (!w || w->dtype() != DataType::Float || w->rank() < 3 || w->dim(0) == 0) return std::nullopt;
  FoldableConv f{w, w->dim(0), w->numel() / w->dim(0), {}};
  f.bias.assign(static_cast<size_t>(f.m), 0.0);
  if (conv.inputs.size() > 2 && conv.inputs[2] != ir::kNoValue) {
    f.bias = float_values(r, conv.inputs[2], f.m);
    if (f.bias.empty()) return std::nullopt;
  }
  return f;
}

// `conv` and the node `after` reading it replaced by one Conv writing after's output: its
// filter scaled per output channel by `scale` in double (kept as it is when `scale` is
// empty), its bias `bias`; the new constants are named after that output.
void replace_with_folded_conv(Rewriter& r, ir::Node* conv, ir::Node* after, const FoldableConv& f,
                              const std::vector<double>& scale, const std::vector<double>& bias) {
  const std::string base = r.graph().value(after->outputs[0]).name;
  ir::Node folded = *conv;
  ir::ValueId weight = conv->inputs[1];
  if (!scale.empty()) {
    Tensor nw(DataType::Float, f.w->shape(),
              Storage::heap_uninitialized(storage_bytes(DataType::Float, f.w->numel())));
    const Tensor wc = f.w->contiguous();
    const float* src = wc.data<const float>();
    float* dst = nw.data<float>();
    for (int64_t c = 0; c < f.m; ++c) {
      const double s = scale[static_cast<size_t>(c)];
      for (int64_t j = 0; j < f.per; ++j) {
        dst[c * f.per + j] = static_cast<float>(static_cast<double>(src[c * f.per + j]) * s);
      }
    }
    weight = r.new_constant(base + "/conv_weight", std::move(nw));
  }
  folded.inputs = {conv->inputs[0], weight,
                   r.new_constant(base + "/conv_bias", float_vector(bias))};
  folded.outputs = {after->outputs[0]};
  r.remove(conv);
  r.remove(after);
  r.add(std::move(folded));
}

}  // namespace

int fold_conv_batchnorm(Rewriter& r) {
  int count = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i) || !inference_batchnorm(r, r.node(i))) continue;
    ir::Node* bn = &r.node(i);
    ir::Node* conv = r.producer(bn->inputs[0], "Conv");
    if (!conv || !r.single_use(bn->inputs[0])) continue;
    const std::optional<FoldableConv> fc = foldable_conv(r, *conv);
    if (!fc) continue;
    // The convolution's output is 1 * conv + bias before the normalization.
    ChannelTransform t{std::vector<double>(static_cast<size_t>(fc->m), 1.0), fc->bias};
    if (!apply_batchnorm(r, *bn, fc->m, t)) continue;
    replace_with_folded_conv(r, conv, bn, *fc, t.scale, t.shift);
    ++count;
  }
  return count;
}

int fold_conv_scale_shift(Rewriter& r) {
  int count = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i)) continue;
    ir::Node* op = &r.node(i);
    const bool mul = is(*op, "Mul");
    if ((!mul && !is(*op, "Add")) || op->inputs.size() != 2) continue;
    ir::Node* conv = nullptr;
    ir::ValueId y = ir::kNoValue;
    for (ir::ValueId v : op->inputs) {
      ir::Node* p = r.producer(v, "Conv");
      if (p && r.single_use(v) && other_input(*op, v) != v) conv = p, y = v;
    }
    if (!conv) continue;
    const std::optional<FoldableConv> fc = foldable_conv(r, *conv);
    if (!fc) continue;
    const std::vector<double> f =
        per_channel(r, other_input(*op, y), static_cast<int64_t>(fc->w->rank()), fc->m);
    if (f.empty()) continue;
    std::vector<double> bias(fc->bias.size());
    for (size_t k = 0; k < bias.size(); ++k)
      bias[k] = mul ? fc->bias[k] * f[k] : fc->bias[k] + f[k];
    replace_with_folded_conv(r, conv, op, *fc, mul ? f : std::vector<double>{}, bias);
    ++count;
  }
  return count;
}

int fuse_conv_epilogue(Rewriter& r) {
  int count = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i) || !is(r.node(i), "Conv")) continue;
    ir::Node* conv = &r.node(i);
    if (conv->inputs.size() < 2 || r.dtype(conv->inputs[1]) != DataType::Float) continue;
    ir::ValueId y = conv->outputs[0];
    std::vector<ir::Node*> chain{conv};
    ir::ValueId z = ir::kNoValue;
    auto reader = [&](ir::ValueId v) -> ir::Node* {
      if (!r.single_use(v)) return nullptr;
      for (size_t j = 0; j < r.size(); ++j) {
        if (r.removed(j)) continue;
        ir::Node& n = r.node(j);
        if (std::find(n.inputs.begin(), n.inputs.end(), v) != n.inputs.end()) return &n;
      }
      return nullptr;
    };
    ir::Node* next = reader(y);
    // (Add and Sum take one type, so Z is float as the convolution is. Sum of two inputs is
    // Add from opset 8, which broadcasts as Add does; Caffe2's ResNets write residuals so.)
    const bool adds = next && (is(*next, "Add") || (is(*next, "Sum") && next->opset >= 8));
    if (adds && next->inputs.size() == 2 && other_input(*next, y) != y) {
      z = other_input(*next, y);
      chain.push_back(next);
      y = next->outputs[0];
      next = reader(y);
    }
    const char* act = next ? activation_of(*next) : nullptr;
    if (act) {
      chain.push_back(next);
      y = next->outputs[0];
    }
    if (chain.size() == 1) continue;
    ir::Node fused = *conv;
    fused.domain = "kiln";
    fused.op_type = "FusedConv";
    fused.opset = 1;
    fused.inputs.resize(3, ir::kNoValue);
    if (z != ir::kNoValue) fused.inputs.push_back(z);
    if (act) fused.attributes.push_back(activation_attr(act));
    fused.outputs = {y};
    for (ir::Node* n : chain) r.remove(n);
    r.add(std::move(fused));
    ++count;
  }
  return count;
}

}  // namespace kiln::passes::fusion

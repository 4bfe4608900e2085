// Graph rewrites that remove work exporters leave in graphs and fuse chains of ops into one
// kernel, on every graph level (the merged decoder's work sits inside its If). Each rewrite
// is a small pattern match that checks op types, constants, ranks and single consumers
// before it changes anything, and never changes results beyond float rounding. This file is
// their order; each family of patterns has its own file beside it.
#include "engine/passes/fusion/activations.h"
#include "engine/passes/fusion/attention.h"
#include "engine/passes/fusion/channel_affine.h"
#include "engine/passes/fusion/conv.h"
#include "engine/passes/fusion/dynamic_quant_matmul.h"
#include "engine/passes/fusion/identities.h"
#include "engine/passes/fusion/matmul.h"
#include "engine/passes/fusion/norms.h"
#include "engine/passes/fusion/pad.h"
#include "engine/passes/fusion/rewriter.h"
#include "engine/passes/passes.h"

namespace kiln::passes {
namespace {

void optimize_graph(ir::Graph& g, GraphOptimization level, OptimizeStats& stats) {
  using namespace fusion;
  Rewriter r(g);
  // Exact: a Cast chain through a type that holds its input's values, shortened first so
  // that one back to the input's type is an identity.
  stats.identities_removed += fold_cast_chains(r);
  stats.identities_removed += eliminate_identities(r);
  if (level == GraphOptimization::All) {
    // The activations first: the product and convolution epilogues take Gelu and Swish.
    stats.fused += fuse_gelu(r);
    stats.fused += fuse_gelu_tanh(r);
    stats.fused += fuse_swish(r);
    // The skip fusion reads the LayerNormalization the first one writes.
    stats.fused += fuse_layer_norm(r);
    stats.fused += fuse_skip_layer_norm(r);
    stats.fused += fuse_matmul_epilogue(r);
    stats.fused += fuse_dynamic_quant_matmul(r);
    stats.fused += fuse_dynamic_quant_activation(r);
    // Attention matches plain MatMuls, which the folds into products turn into fused ones.
    stats.fused += fuse_attention(r);
    stats.fused += fold_into_matmul(r);
    // The folds match plain Convs, before the epilogue fusion makes them FusedConv (and
    // would take a per-channel Add as a residual).
    stats.fused += fold_pad_into_window(r);
    const int convs = fold_conv_batchnorm(r) + fold_conv_scale_shift(r);
    stats.fused += convs + fuse_conv_epilogue(r);
    // Last: the chains of per-channel ops that no convolution took whole.
    const int affine = fuse_channel_affine(r);
    stats.fused += affine;
    r.commit();
    // the filters, biases and normalization parameters folded
    if (convs + affine > 0) drop_unused_initializers(g);
  }
  r.commit();
  for (ir::Node& node : g.nodes) {
    for (ir::Attribute& a : node.attributes) {
      if (a.g) optimize_graph(*a.g, level, stats);
      for (auto& sub : a.graphs) optimize_graph(*sub, level, stats);
    }
  }
}

}  // namespace

OptimizeStats optimize(ir::Graph& graph, GraphOptimization level) {
  OptimizeStats stats;
  if (level != GraphOptimization::None) optimize_graph(graph, level, stats);
  return stats;
}

}  // namespace kiln::passes

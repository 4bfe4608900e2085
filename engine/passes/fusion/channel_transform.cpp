#include "engine/passes/fusion/channel_transform.h"

#include <cmath>
#include <cstddef>

namespace kiln::passes::fusion {

std::vector<double> float_values(Rewriter& r, ir::ValueId v, int64_t n) {
  const Tensor* t = r.constant(v);
  if (!t || t->dtype() != DataType::Float || t->numel() != n || t->rank() != 1) return {};
  const Tensor c = t->contiguous();
  const float* p = c.data<const float>();
  return std::vector<double>(p, p + n);
}

Tensor float_vector(const std::vector<double>& v) {
  const auto m = static_cast<int64_t>(v.size());
  Tensor t(DataType::Float, Shape{m},
           Storage::heap_uninitialized(storage_bytes(DataType::Float, m)));
  for (int64_t k = 0; k < m; ++k)
    t.data<float>()[k] = static_cast<float>(v[static_cast<size_t>(k)]);
  return t;
}

bool apply_batchnorm(Rewriter& r, const ir::Node& bn, int64_t m, ChannelTransform& t) {
  const std::vector<double> scale = float_values(r, bn.inputs[1], m),
                            bias = float_values(r, bn.inputs[2], m),
                            mean = float_values(r, bn.inputs[3], m),
                            var = float_values(r, bn.inputs[4], m);
  if (scale.empty() || bias.empty() || mean.empty() || var.empty()) return false;
  const ir::Attribute* eps = bn.attr("epsilon");
  const double epsilon = eps ? static_cast<double>(eps->f) : 1e-5;
  for (size_t k = 0; k < static_cast<size_t>(m); ++k) {
    const double a = scale[k] / std::sqrt(var[k] + epsilon);
    t.scale[k] *= a;
    t.shift[k] = (t.shift[k] - mean[k]) * a + bias[k];
  }
  return true;
}

bool inference_batchnorm(Rewriter& r, const ir::Node& bn) {
  if (!is(bn, "BatchNormalization") || bn.inputs.size() != 5 || bn.opset < 7) return false;
  for (size_t o = 1; o < bn.outputs.size(); ++o) {
    if (!r.unused(bn.outputs[o])) return false;
  }
  const ir::Attribute* training = bn.attr("training_mode");
  const ir::Attribute* spatial = bn.attr("spatial");
  return !(training && training->i != 0) && !(spatial && spatial->i == 0);
}

std::vector<double> per_channel(Rewriter& r, ir::ValueId c, int64_t rank, int64_t m) {
  const Tensor* t = r.constant(c);
  if (!t || t->dtype() != DataType::Float) return {};
  const auto t_rank = static_cast<int64_t>(t->rank());
  if (t_rank > rank) return {};
  const Tensor v = t->contiguous();
  const float* p = v.data<const float>();
  if (t->numel() == 1) return std::vector<double>(static_cast<size_t>(m), p[0]);
  const int64_t channel_axis = t_rank - (rank - 1);  // axis 1 of the output, in t
  for (int64_t a = 0; a < t_rank; ++a) {
    if (t->dim(static_cast<size_t>(a)) != (a == channel_axis ? m : 1)) return {};
  }
  if (channel_axis < 0) return {};
  return std::vector<double>(p, p + m);
}

}  // namespace kiln::passes::fusion

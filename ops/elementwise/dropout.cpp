// Dropout. In inference (always before opset 12; from 12 unless training_mode is true or
// when the ratio is 0) the output is the input itself and the optional mask is all true.
// In training mode elements are kept with probability 1 - ratio and scaled by
// 1 / (1 - ratio). Draws follow numpy's legacy generator (MT19937 seeded with `seed`,
// 53-bit doubles from two 32-bit words), so a seeded node reproduces the reference
// outputs exactly; without `seed` every run draws a fresh mask.
#include <atomic>
#include <cstring>
#include <random>
#include <string>

#include "ops/core/common.h"

namespace kiln::ops {
namespace {

class Dropout final : public Kernel {
 public:
  explicit Dropout(const NodeInfo& info)
      : ratio_(info.attr_float("ratio", 0.5f)), has_seed_(info.has_attr("seed")) {
    seed_ = has_seed_ ? static_cast<uint64_t>(info.attr_int("seed")) : std::random_device{}();
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    if (!type_in(FloatTypes{}, x.dtype())) throw_unsupported_type(x.dtype(), "Dropout input");
    double ratio = ratio_;
    bool training = false;
    if (ctx.opset() >= 12) {
      if (ctx.has_input(1)) ratio = scalar_as_double(ctx.input(1));
      if (ctx.has_input(2)) {
        const Tensor& t = ctx.input(2);
        if (t.dtype() != DataType::Bool || t.numel() != 1) {
          ctx.fail("training_mode must be a single bool, got " + t.describe());
        }
        training = t.contiguous().data<const bool>()[0];
      }
    }
    if (!training || ratio == 0) {
      ctx.set_output(0, x);
      if (ctx.has_output(1)) all_kept_mask(ctx, x);
      return;
    }
    if (!(ratio > 0 && ratio < 1))
      ctx.fail("ratio must be in [0, 1), got " + std::to_string(ratio));
    const uint64_t seed = has_seed_ ? seed_ : seed_ + runs_.fetch_add(1);
    std::mt19937 gen(static_cast<std::mt19937::result_type>(seed));
    const Tensor in = x.contiguous();
    Tensor& y = ctx.output(0, x.dtype(), x.shape());
    bool* mask =
        ctx.has_output(1) ? ctx.output(1, DataType::Bool, x.shape()).data<bool>() : nullptr;
    dispatch(FloatTypes{}, x.dtype(), [&]<typename T>() {
      using C = compute_t<T>;
      const C scale = C(1) / (C(1) - static_cast<C>(ratio));
      const T* src = in.data<const T>();
      T* dst = y.data<T>();
      for (int64_t i = 0; i < in.numel(); ++i) {
        const uint32_t a = gen() >> 5, b = gen() >> 6;
        const double u = (a * 67108864.0 + b) / 9007199254740992.0;
        const bool keep = u >= ratio;
        dst[i] = from_compute<T>(keep ? static_cast<C>(src[i]) * scale : C(0));
        if (mask) mask[i] = keep;
      }
    });
  }

 private:
  // Inference mask: bool true from opset 10, ones of the input's type before.
  static void all_kept_mask(OpContext& ctx, const Tensor& x) {
    if (ctx.opset() >= 10) {
      Tensor& m = ctx.output(1, DataType::Bool, x.shape());
      std::memset(m.raw_data(), 1, m.nbytes());
      return;
    }
    Tensor& m = ctx.output(1, x.dtype(), x.shape());
    dispatch(FloatTypes{}, x.dtype(), [&]<typename T>() {
      T* p = m.data<T>();
      for (int64_t i = 0; i < m.numel(); ++i) p[i] = from_compute<T>(compute_t<T>(1));
    });
  }

  float ratio_;
  bool has_seed_;
  uint64_t seed_ = 0;
  std::atomic<uint64_t> runs_{0};
};

// Inference mode: Y is X (a view) and the mask all kept (bool from opset 10, X's type before).
void dropout_shape(ShapeContext& c) {
  if (c.has_input(2)) {
    const std::vector<int64_t>& training = c.data(2);
    if (!training.empty() && training[0] != 0) unknown("training mode");
  }
  c.same(0, 0);
  ValueFacts mask = c.facts(0);
  mask.dtype = c.opset() >= 10 ? DataType::Bool : mask.dtype;
  mask.has_data = false;
  mask.data.clear();
  mask.elems.clear();
  c.set(1, std::move(mask));
}

}  // namespace

KILN_REGISTER_OP({.op = "Dropout",
                  .since = 7,
                  .min_inputs = 1,
                  .max_inputs = 3,
                  .min_outputs = 1,
                  .max_outputs = 2,
                  .strided_inputs = true,
                  .types = "float, double, float16, bfloat16",
                  .shape = dropout_shape,
                  .place = place_alias,
                  .create = make<Dropout>});

}  // namespace kiln::ops

// com.microsoft.EmbedLayerNormalization: BERT's embedding block as onnxruntime's transformer
// optimizer fuses it.
//
//   sum[b, s] = word_embedding[input_ids[b, s]] + position_embedding[position (s, or
//               position_ids[b, s])] (+ segment_embedding[segment_ids[b, s]])
//   output[b, s] = layer norm of sum over the hidden axis, times gamma plus beta
//   mask_index[b] = how many of mask[b, :] are 1 (0 without a mask)
//   embedding_sum = sum (optional)
//
// Inputs input_ids, segment_ids?, word_embedding, position_embedding, segment_embedding?,
// gamma, beta, mask?, position_ids? (ids int32 as onnxruntime has them, or int64). An id out of
// its table's range fails naming the node. Rows go to tasks in parallel, each gathered, summed
// and normalised by the row kernels while in cache.
#include <atomic>
#include <string>

#include "ops/core/common.h"
#include "ops/math/kernels.h"

namespace kiln::ops {
namespace {

constexpr int64_t kTaskElements = 16384;

// An int32 or int64 tensor read as int64.
struct Ids {
  const int32_t* i32 = nullptr;
  const int64_t* i64 = nullptr;
  int64_t at(int64_t i) const { return i32 ? i32[i] : i64[i]; }
  bool present() const { return i32 || i64; }
};

class EmbedLayerNorm final : public Kernel {
 public:
  explicit EmbedLayerNorm(const NodeInfo& info) : epsilon_(info.attr_float("epsilon", 1e-12f)) {
    if (!(epsilon_ >= 0)) info.fail("epsilon must be non-negative");
  }

  void run(OpContext& ctx) override {
    const Tensor& ids = ctx.input(0);
    if (ids.rank() != 2) ctx.fail("input_ids " + ids.describe() + " must be 2-D [batch, sequence]");
    const int64_t batch = ids.dim(0), seq = ids.dim(1);
    const Tensor& word = table(ctx, 2, "word_embedding");
    const Tensor& pos = table(ctx, 3, "position_embedding");
    const int64_t hidden = word.dim(1);
    if (pos.dim(1) != hidden)
      ctx.fail("position_embedding " + pos.describe() + " has another width");
    const Tensor* seg = ctx.has_input(4) ? &table(ctx, 4, "segment_embedding") : nullptr;
    if (seg && seg->dim(1) != hidden)
      ctx.fail("segment_embedding " + seg->describe() + " has another width");
    const Ids word_ids = ids_of(ctx, 0, ids.shape(), "input_ids");
    const Ids seg_ids = ctx.has_input(1) ? ids_of(ctx, 1, ids.shape(), "segment_ids") : Ids{};
    if (seg_ids.present() != (seg != nullptr)) {
      ctx.fail("segment_ids and segment_embedding must be given together");
    }
    const Ids mask = ctx.has_input(7) ? ids_of(ctx, 7, ids.shape(), "mask") : Ids{};
    Ids pos_ids;
    bool pos_per_batch = false;
    if (ctx.has_input(8)) {
      const Tensor& p = ctx.input(8);
      pos_per_batch = p.rank() == 2 && p.dim(0) == batch && batch != 1;
      pos_ids = ids_of(ctx, 8, pos_per_batch ? ids.shape() : Shape{1, seq}, "position_ids");
    }
    const float* gamma = vector(ctx, 5, hidden, "gamma");
    const float* beta = vector(ctx, 6, hidden, "beta");

    Tensor& y = ctx.output(0, DataType::Float, {batch, seq, hidden});
    if (ctx.has_output(1)) {
      Tensor& mi = ctx.output(1, DataType::Int32, {batch});
      int32_t* m = mi.data<int32_t>();
      for (int64_t b = 0; b < batch; ++b) {
        int32_t count = 0;
        for (int64_t s = 0; mask.present() && s < seq; ++s) count += mask.at(b * seq + s) == 1;
        m[b] = count;
      }
    }
    Tensor sum = ctx.has_output(2) ? ctx.output(2, DataType::Float, {batch, seq, hidden}) : y;
    if (batch * seq == 0 || hidden == 0) return;

    const float* pw = word.data<const float>();
    const float* pp = pos.data<const float>();
    const float* pg = seg ? seg->data<const float>() : nullptr;
    float* psum = sum.data<float>();
    float* py = y.data<float>();
    const math::MathKernels& k = math::kernels();
    std::atomic<bool> bad{false};
    parallel_for(batch * seq, grain_for(hidden, kTaskElements), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t s = r % seq;
        const int64_t w = word_ids.at(r);
        const int64_t p = pos_ids.present() ? pos_ids.at(pos_per_batch ? r : s) : s;
        const int64_t g = pg ? seg_ids.at(r) : 0;
        if (w < 0 || w >= word.dim(0) || p < 0 || p >= pos.dim(0) ||
            (pg && (g < 0 || g >= seg->dim(0)))) {
          bad = true;
          continue;
        }
        float* out = psum + r * hidden;
        k.binary.add(pw + w * hidden, 1, pp + p * hidden, 1, out, hidden);
        if (pg) k.binary.add(out, 1, pg + g * hidden, 1, out, hidden);
        k.vec.layer_norm(out, py + r * hidden, hidden, gamma, beta, epsilon_, nullptr, nullptr);
      }
    });
    if (bad)
      ctx.fail("an input, segment or position id is outside its embedding table",
               ErrorKind::InvalidArgument);
  }

 private:
  static const Tensor& table(OpContext& ctx, size_t i, const char* what) {
    const Tensor& t = ctx.input(i);
    if (t.dtype() != DataType::Float || t.rank() != 2) {
      ctx.fail(std::string(what) + " " + t.describe() + " must be a 2-D float table");
    }
    return t;
  }

  static Ids ids_of(OpContext& ctx, size_t i, const Shape& shape, const char* what) {
    const Tensor& t = ctx.input(i);
    if (t.shape() != shape || (t.dtype() != DataType::Int32 && t.dtype() != DataType::Int64)) {
      ctx.fail(std::string(what) + " " + t.describe() + " must be int32 or int64 of shape " +
               shape_to_string(shape));
    }
    Ids out;
    if (t.dtype() == DataType::Int32) {
      out.i32 = t.data<const int32_t>();
    } else {
      out.i64 = t.data<const int64_t>();
    }
    return out;
  }

  static const float* vector(OpContext& ctx, size_t i, int64_t n, const char* what) {
    const Tensor& t = ctx.input(i);
    if (t.dtype() != DataType::Float || t.rank() != 1 || t.dim(0) != n) {
      ctx.fail(std::string(what) + " " + t.describe() + " must be 1-D float of the hidden size " +
               std::to_string(n));
    }
    return t.data<const float>();
  }

  float epsilon_;
};

// output and embedding_sum [batch, sequence, hidden], mask_index int32 [batch].
void embed_layer_norm_shape(ShapeContext& c) {
  const Shape& ids = c.shape(0);
  const Shape& word = c.shape(2);
  if (ids.size() != 2 || word.size() != 2) unknown("input_ids or word_embedding is not 2-D");
  const Shape out{ids[0], ids[1], word[1]};
  c.set(0, c.dtype(2), out);
  c.set(1, DataType::Int32, {ids[0]});
  c.set(2, c.dtype(2), out);
}

}  // namespace

KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "EmbedLayerNormalization",
                  .since = 1,
                  .min_inputs = 7,
                  .max_inputs = 9,
                  .min_outputs = 1,
                  .max_outputs = 3,
                  .types = "float",
                  .shape = embed_layer_norm_shape,
                  .create = make<EmbedLayerNorm>});

}  // namespace kiln::ops

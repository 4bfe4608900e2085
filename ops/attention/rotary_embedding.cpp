// RotaryEmbedding (ai.onnx 23): rotates pairs of features of each head by a position-dependent
// angle (RoPE). Pairs are either the two halves of the rotated part of the head
// (x[i], x[i + d/2]) or adjacent features (x[2i], x[2i + 1]) when `interleaved`; features past
// `rotary_embedding_dim` are passed through. cos/sin come from caches indexed by position_ids
// ([max_pos, d/2]) or are given per (batch, position) ([batch, seq, d/2]).
//
// com.microsoft.RotaryEmbedding is the same rotation with onnxruntime's inputs: (input,
// position_ids, cos_cache, sin_cache), the caches always indexed by position, position_ids
// either [batch, seq] or one start position [1] (position s is start + s).
#include <string>
#include <vector>

#include "ops/attention/rotary.h"
#include "ops/core/common.h"

namespace kiln::ops {
namespace {

class RotaryEmbedding final : public Kernel {
 public:
  explicit RotaryEmbedding(const NodeInfo& info)
      : interleaved_(info.attr_int("interleaved", 0) != 0),
        rotary_dim_(info.attr_int("rotary_embedding_dim", 0)),
        num_heads_(info.attr_int("num_heads", 0)) {
    if (rotary_dim_ < 0 || rotary_dim_ % 2) {
      info.fail("rotary_embedding_dim must be even and non-negative");
    }
    if (num_heads_ < 0) info.fail("num_heads must be positive");
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& cos = ctx.input(1);
    const Tensor& sin = ctx.input(2);
    if (x.rank() != 3 && x.rank() != 4) ctx.fail("input must be 3-D or 4-D, got " + x.describe());
    if (cos.dtype() != x.dtype() || sin.dtype() != x.dtype()) {
      ctx.fail("cos_cache and sin_cache must have the input's element type");
    }
    // Element strides of x as [batch, seq, heads, head_size].
    const int64_t B = x.dim(0);
    int64_t S, H, Dh, sb, ss, sh;
    if (x.rank() == 4) {
      H = x.dim(1), S = x.dim(2), Dh = x.dim(3);
      sb = H * S * Dh, sh = S * Dh, ss = Dh;
    } else {
      H = num_heads_ > 0 ? num_heads_ : 0;
      if (H == 0 || x.dim(2) % H) {
        ctx.fail("3-D input needs a num_heads that divides its hidden size " + x.describe());
      }
      S = x.dim(1), Dh = x.dim(2) / H;
      sb = S * H * Dh, ss = H * Dh, sh = Dh;
    }
    const int64_t rd = rotary_dim_ > 0 ? rotary_dim_ : Dh;
    if (rd > Dh || rd % 2) ctx.fail("rotary_embedding_dim exceeds the head size or is odd");
    const int64_t half = rd / 2;

    // Row (in units of `half` elements) of the caches for each (batch, position).
    std::vector<int64_t> rows(static_cast<size_t>(B * S));
    if (ctx.has_input(3)) {
      const Tensor& pos = ctx.input(3);
      if (pos.dtype() != DataType::Int64 || pos.shape() != Shape{B, S}) {
        ctx.fail("position_ids must be int64 [batch, seq], got " + pos.describe());
      }
      if (cos.rank() != 2 || cos.shape() != sin.shape() || cos.dim(1) != half) {
        ctx.fail("with position_ids the caches must be [max_position, " + std::to_string(half) +
                 "], got " + cos.describe() + " and " + sin.describe());
      }
      const auto ids = pos.to_vector<int64_t>();
      for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || ids[i] >= cos.dim(0)) {
          ctx.fail("position id " + std::to_string(ids[i]) + " is outside the cache of " +
                   std::to_string(cos.dim(0)) + " positions");
        }
        rows[i] = ids[i];
      }
    } else {
      if (cos.rank() != 3 || cos.shape() != sin.shape() || cos.dim(2) != half ||
          (cos.dim(0) != B && cos.dim(0) != 1) || (cos.dim(1) != S && cos.dim(1) != 1)) {
        ctx.fail("without position_ids the caches must be [batch, seq, " + std::to_string(half) +
                 "], got " + cos.describe() + " and " + sin.describe());
      }
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t s = 0; s < S; ++s) {
          rows[static_cast<size_t>(b * S + s)] =
              (cos.dim(0) == 1 ? 0 : b) * cos.dim(1) + (cos.dim(1) == 1 ? 0 : s);
        }
      }
    }

    Tensor& y = ctx.output_reusing(0, 0, x.dtype(), x.shape());
    dispatch(TypeList<float, float16, bfloat16>{}, x.dtype(), [&]<typename T>() {
      const T* src = x.data<const T>();
      T* dst = y.data<T>();
      const T* pc = cos.data<const T>();
      const T* ps = sin.data<const T>();
      const int64_t cost = H * Dh * 4;
      parallel_for(B * S, grain_for(cost), [&](int64_t begin, int64_t end) {
        for (int64_t bs = begin; bs < end; ++bs) {
          const int64_t b = bs / S, s = bs % S;
          const T* c = pc + rows[static_cast<size_t>(bs)] * half;
          const T* n = ps + rows[static_cast<size_t>(bs)] * half;
          for (int64_t h = 0; h < H; ++h) {
            const int64_t off = b * sb + s * ss + h * sh;
            rotate_head(src + off, dst + off, Dh, rd, c, n, interleaved_);
          }
        }
      });
    });
  }

 private:
  bool interleaved_;
  int64_t rotary_dim_, num_heads_;
};

class MsRotaryEmbedding final : public Kernel {
 public:
  explicit MsRotaryEmbedding(const NodeInfo& info)
      : interleaved_(info.attr_int("interleaved", 0) != 0),
        rotary_dim_(info.attr_int("rotary_embedding_dim", 0)),
        num_heads_(info.attr_int("num_heads", 0)) {
    if (rotary_dim_ < 0 || rotary_dim_ % 2) {
      info.fail("rotary_embedding_dim must be even and non-negative");
    }
    if (num_heads_ < 0) info.fail("num_heads must be positive");
    if (rotary_dim_ > 0 && num_heads_ == 0) info.fail("rotary_embedding_dim needs num_heads");
    if (info.attr_int("is_packed_batching", 0) != 0) {
      info.fail("is_packed_batching is not supported", ErrorKind::Unsupported);
    }
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& pos = ctx.input(1);
    const Tensor& cos = ctx.input(2);
    const Tensor& sin = ctx.input(3);
    if (x.rank() != 3 && x.rank() != 4) ctx.fail("input must be 3-D or 4-D, got " + x.describe());
    if (cos.dtype() != x.dtype() || sin.dtype() != x.dtype() || cos.rank() != 2 ||
        cos.shape() != sin.shape() || cos.dim(1) <= 0) {
      ctx.fail("cos_cache and sin_cache must be 2-D [max_position, rotary dim / 2] of the " +
               std::string("input's type, got ") + cos.describe() + " and " + sin.describe());
    }
    // Element strides of x as [batch, seq, heads, head_size]; 4-D input is [B, N, S, H].
    const int64_t B = x.dim(0);
    int64_t S, H, Dh, sb, ss, sh;
    if (x.rank() == 4) {
      H = x.dim(1), S = x.dim(2), Dh = x.dim(3);
      sb = H * S * Dh, sh = S * Dh, ss = Dh;
    } else {
      S = x.dim(1);
      Dh = num_heads_ > 0 ? x.dim(2) / num_heads_ : cos.dim(1) * 2;
      if (Dh <= 0 || x.dim(2) % Dh) {
        ctx.fail("hidden size of " + x.describe() + " does not split into heads of " +
                 std::to_string(Dh));
      }
      H = x.dim(2) / Dh;
      sb = S * H * Dh, ss = H * Dh, sh = Dh;
    }
    const int64_t rd = rotary_dim_ > 0 ? rotary_dim_ : Dh;
    if (rd > Dh || cos.dim(1) * 2 != rd) {
      ctx.fail("caches " + cos.describe() + " do not match rotary dimension " + std::to_string(rd) +
               " of heads of " + std::to_string(Dh));
    }
    const std::vector<int64_t> rows = positions(ctx, pos, B, S, cos.dim(0));
    Tensor& y = ctx.output_reusing(0, 0, x.dtype(), x.shape());
    dispatch(TypeList<float, float16>{}, x.dtype(), [&]<typename T>() {
      const T* src = x.data<const T>();
      T* dst = y.data<T>();
      const int64_t half = rd / 2;
      parallel_for(B * S, grain_for(H * Dh * 4), [&](int64_t begin, int64_t end) {
        for (int64_t bs = begin; bs < end; ++bs) {
          const int64_t b = bs / S, s = bs % S, row = rows[static_cast<size_t>(bs)];
          for (int64_t h = 0; h < H; ++h) {
            const int64_t off = b * sb + s * ss + h * sh;
            rotate_head(src + off, dst + off, Dh, rd, cos.data<const T>() + row * half,
                        sin.data<const T>() + row * half, interleaved_);
          }
        }
      });
    });
  }

 private:
  // The cache row of each (batch, position).
  static std::vector<int64_t> positions(const OpContext& ctx, const Tensor& pos, int64_t B,
                                        int64_t S, int64_t max_pos) {
    std::vector<int64_t> rows(static_cast<size_t>(B * S));
    if (pos.dtype() != DataType::Int64)
      ctx.fail("position_ids must be int64, got " + pos.describe());
    const auto ids = pos.to_vector<int64_t>();
    if (pos.shape() == Shape{B, S}) {
      rows = ids;
    } else if (pos.numel() == 1 && pos.rank() <= 1) {
      for (int64_t i = 0; i < B * S; ++i) rows[static_cast<size_t>(i)] = ids[0] + i % S;
    } else {
      ctx.fail("position_ids must be [1] or [batch, seq], got " + pos.describe());
    }
    for (const int64_t r : rows) {
      if (r < 0 || r >= max_pos) {
        ctx.fail("position " + std::to_string(r) + " is outside the cache of " +
                 std::to_string(max_pos) + " positions");
      }
    }
    return rows;
  }

  bool interleaved_;
  int64_t rotary_dim_, num_heads_;
};

void rotary_embedding_shape(ShapeContext& c) {
  const size_t rank = c.shape(0).size();
  if (rank != 3 && rank != 4) unknown("input must be 3-D or 4-D");
  same_shape(c);
}

}  // namespace

KILN_REGISTER_OP({.op = "RotaryEmbedding",
                  .since = 23,
                  .min_inputs = 3,
                  .max_inputs = 4,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .in_place = inputs(0),
                  .types = "float, float16, bfloat16",
                  .shape = rotary_embedding_shape,
                  .create = make<RotaryEmbedding>});
KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "RotaryEmbedding",
                  .since = 1,
                  .min_inputs = 4,
                  .max_inputs = 4,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .in_place = inputs(0),
                  .types = "float, float16",
                  .shape = rotary_embedding_shape,
                  .create = make<MsRotaryEmbedding>});

}  // namespace kiln::ops

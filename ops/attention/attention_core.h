// The scaled dot-product attention core shared by the attention ops (ai.onnx Attention,
// com.microsoft MultiHeadAttention and GroupQueryAttention): Q, K and V as strided
// [batch, heads, rows, head size] views, grouped KV heads, causal and window limits per
// batch, boolean or additive masks and softcap. solve() splits the work over (batch, head,
// block of query rows); each task multiplies in the GEMM layer straight from the views
// (ops/attention/attention_core.cpp).
#pragma once

#include <cstdint>
#include <type_traits>

#include "kiln/tensor.h"
#include "ops/core/kernel.h"
#include "ops/core/workspace.h"

namespace kiln::ops::sdpa {

// One value converted between the element types the attention ops read (half types through
// float).
template <typename D, typename S>
D convert_value(S v) {
  if constexpr (std::is_same_v<D, float16> || std::is_same_v<D, bfloat16>) {
    return D(static_cast<float>(v));
  } else if constexpr (std::is_same_v<S, float16> || std::is_same_v<S, bfloat16>) {
    return static_cast<D>(static_cast<float>(v));
  } else {
    return static_cast<D>(v);
  }
}

// Bounds for user-controlled positions (nonpad_kv_seqlen, window sizes) so that sums of a
// few of them with real sizes cannot overflow; anything beyond acts the same.
constexpr int64_t kPosLimit = int64_t{1} << 52;

// Element strides of a [batch, heads, rows, cols] tensor whose cols have unit stride.
struct Layout {
  int64_t batch = 0, head = 0, row = 0;
  int64_t at(int64_t b, int64_t h) const { return b * batch + h * head; }
};

inline Layout layout_of(const Tensor& t4) {
  return {t4.strides()[0], t4.strides()[1], t4.strides()[2]};
}

// [B, L, H*d] seen as [B, H, L, d] without moving data.
inline Tensor heads_view(const Tensor& t, int64_t heads) {
  const int64_t d = t.dim(2) / heads;
  const Shape& s = t.strides();
  return t.view({t.dim(0), heads, t.dim(1), d}, {s[0], d * s[2], s[1], s[2]}, t.byte_offset());
}

// dst = src for [B, H, L, d] tensors of one type whose rows are dense (unit stride along d):
// one memcpy per (batch, head) when the rows are back to back, else one per row.
void copy_heads(const Tensor& src, const Tensor& dst);

// present = concat(past, cur) along axis 2 ([B, H, L, d] tensors of one type; present
// contiguous, an output or the op's workspace); counted as a Concat copy.
void append_cache(OpContext& ctx, const Tensor& past, const Tensor& cur, const Tensor& present);

enum class MaskKind { None, Bool, Additive };

// The sizes of a problem: batch, query and KV heads, query rows, keys, head sizes of Q/K
// and V.
struct Dims {
  int64_t B = 0, Hq = 0, Hkv = 0, Sq = 0, T = 0, D = 0, Dv = 0;
};

template <typename C>
struct Problem : Dims {
  const C* q = nullptr;
  const C* k = nullptr;
  const C* v = nullptr;
  C* y = nullptr;
  Layout lq, lk, lv, ly;
  C* qk = nullptr;  // [B, Hq, Sq, T] contiguous, or null
  int mode = 0;
  C scale = 1, softcap = 0;
  bool causal = false;
  int64_t left = -1, right = -1;  // window sizes, -1 = unbounded
  int64_t past = 0;               // causal offset for the internal cache
  const int64_t* nonpad = nullptr;
  // Per batch, the position of query row 0 among the keys when it is not what `past` or
  // `nonpad` imply (com.microsoft.GroupQueryAttention's first prompt of a padded batch).
  const int64_t* first_pos = nullptr;
  MaskKind mask = MaskKind::None;
  const uint8_t* mask_bool = nullptr;
  const C* mask_add = nullptr;
  int64_t ms[4] = {0, 0, 0, 0};  // mask strides aligned to [B, Hq, Sq, len] (0 = broadcast)
  int64_t mask_len = 0;
  // Float with long query blocks: K^T and V of each (batch, KV head) packed once for the
  // GEMM (panels), so no block packs them again.
  const float* kpack = nullptr;
  const float* vpack = nullptr;
  int64_t kpack_size = 0, vpack_size = 0;  // floats per (batch, KV head)
};

// dst = src with element conversion between float types (same shape, any layouts).
void convert_into(const Tensor& src, const Tensor& dst);

// The scratch of solve() for a problem of `d` computed in `ct` (Float or Double) on
// `threads` threads (ShapeContext::threads() in a rule, OpContext::threads() in a kernel),
// added to `layout`: K^T and V packed once for the GEMM when float query blocks are long, and
// per thread slot a task's scores [rows, T] with its softmax sums and key ranges.
struct CoreParts {
  int pack = -1, scores = -1, ranges = -1;
  int threads = 1, slots = 1;    // slots: 1 when the tasks run on the calling thread
  int64_t rows = 0;              // query rows per task
  int64_t kpack = 0, vpack = 0;  // floats of K^T and V packed per (batch, KV head)
};
CoreParts core_parts(WorkspaceLayout& layout, const Dims& d, DataType ct, int threads);

// Computes p.y (and p.qk) with the scratch `parts` of `space` (same dims, compute type and
// threads as core_parts was given).
void solve(Problem<float>& p, const Workspace& space, const CoreParts& parts);
void solve(Problem<double>& p, const Workspace& space, const CoreParts& parts);

}  // namespace kiln::ops::sdpa

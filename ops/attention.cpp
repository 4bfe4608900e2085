// Attention (ai.onnx 23+): multi-head scaled dot-product attention with grouped KV heads
// (GQA/MQA), causal and sliding-window masking, boolean or additive masks, an internal KV
// cache (past_key/past_value -> present_key/present_value), an external one
// (nonpad_kv_seqlen), softcap and the optional qk_matmul_output.
//
// Work is split over (batch, query head, block of query rows). A task computes its block of
// scores with one product in the GEMM layer reading the inputs in place (3-D inputs are read
// as strided 4-D views, K^T as a column-major view, never transposed), applies the bias row
// by row straight from the unbroadcast mask, softmaxes in place (the vector kernels for
// float) and multiplies by V directly into the output. Only the columns a
// block can attend are computed (causal prefill does half the work). Half-precision inputs
// are widened to float once.
#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "ops/attention_core.h"
#include "ops/common.h"
#include "ops/elementwise.h"
#include "ops/math/gemm.h"
#include "ops/math/kernels.h"

#include <tbb/task_arena.h>

namespace kiln::ops {
namespace sdpa {
namespace {

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

// Query rows per task: a multiple of every level's GEMM tile height (12, 6), so no block ends
// in a short tile.
constexpr int64_t kBlockRows = 60;
// Scores a task may hold for a whole head (256 KiB of float: within a core's L2).
constexpr int64_t kWholeHeadScores = int64_t{64} * 1024;
// Bounds for user-controlled positions (nonpad_kv_seqlen, window sizes) so that sums of a
// few of them with real sizes cannot overflow; anything beyond acts the same.
constexpr int64_t kPosLimit = int64_t{1} << 52;

template <typename C>
using RowMat = Eigen::Matrix<C, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename C>
using MutMap = Eigen::Map<RowMat<C>, 0, Eigen::OuterStride<>>;

// Keys [lo, hi) query row i of batch b may attend before the mask is consulted.
template <typename C>
void key_range(const Problem<C>& p, int64_t b, int64_t i, int64_t* lo, int64_t* hi) {
  int64_t l = 0, h = p.T;
  int64_t offset = p.past;
  if (p.nonpad) {
    const int64_t n = std::clamp(p.nonpad[b], -kPosLimit, kPosLimit);
    h = std::min(h, std::max<int64_t>(n, 0));
    offset = n - p.Sq;
  }
  if (p.first_pos) offset = std::clamp(p.first_pos[b], -kPosLimit, kPosLimit);
  const int64_t pos = i + offset;
  if (p.causal) h = std::min(h, pos + 1);
  if (p.right >= 0) h = std::min(h, pos + p.right + 1);
  if (p.left >= 0) l = std::max(l, pos - p.left);
  *lo = l;
  *hi = std::max(h, l);
}

// Rows of one task, all reading the same KV head: either consecutive query positions of one
// head, or (single-position decode with grouped heads) the query heads sharing a KV head,
// so that K and V are read once per group.
struct Block {
  int64_t b = 0, h0 = 0, i0 = 0, rows = 0;
  int64_t head_step = 0, pos_step = 1;  // row r is head h0 + r*head_step, position i0 + r*pos_step
};

// A thread slot's scratch: rows x T scores, the rows' softmax sums, and per row the keys
// [lo, hi) it may attend and whether any of them is live.
template <typename C>
struct Slot {
  C* scores;
  C* sums;
  int64_t* lo;
  int64_t* hi;
  int64_t* live;
};

// One task.
template <typename C>
void attend_block(const Problem<C>& p, const Block& blk, const Slot<C>& slot) {
  constexpr C kNegInf = -std::numeric_limits<C>::infinity();
  const int64_t b = blk.b, rows = blk.rows;
  const int64_t kvh = blk.h0 / (p.Hq / p.Hkv);
  C* s = slot.scores;
  int64_t* lo = slot.lo;
  int64_t* hi = slot.hi;
  int64_t c0 = p.T, c1 = 0;
  for (int64_t r = 0; r < rows; ++r) {
    key_range(p, b, blk.i0 + r * blk.pos_step, &lo[r], &hi[r]);
    if (lo[r] < hi[r]) c0 = std::min(c0, lo[r]), c1 = std::max(c1, hi[r]);
  }
  if (p.qk) c0 = 0, c1 = p.T;  // the debug output needs every column
  const int64_t w = std::max<int64_t>(c1 - c0, 0);
  const int64_t yrow = blk.pos_step * p.ly.row + blk.head_step * p.ly.head;
  C* y = p.y + p.ly.at(b, blk.h0) + blk.i0 * p.ly.row;
  if (w == 0) {
    for (int64_t r = 0; r < rows; ++r) std::fill(y + r * yrow, y + r * yrow + p.Dv, C(0));
    return;
  }
  const int64_t qrow = blk.pos_step * p.lq.row + blk.head_step * p.lq.head;
  const C* q = p.q + p.lq.at(b, blk.h0) + blk.i0 * p.lq.row;
  const C* k = p.k + p.lk.at(b, kvh) + c0 * p.lk.row;
  const C* v = p.v + p.lv.at(b, kvh) + c0 * p.lv.row;
  // scores = scale * q k^T: k^T read in place as a column-major matrix. One thread: tasks
  // already run in parallel.
  math::GemmOptions one_thread;
  one_thread.max_threads = 1;
  math::GemmOptions scaled = one_thread;
  scaled.alpha = static_cast<float>(p.scale);
  const math::GemmKernels& gk = math::kernels().gemm;
  const int nr = gk.nr;
  const bool packed = p.kpack && c0 % nr == 0;
  // One query row (a decode step): its scores are dot products with K's rows and its output
  // a weighted sum of V's rows, each read once.
  const bool single = rows == 1;
  if constexpr (std::is_same_v<C, float>) {
    if (single) {
      gk.dots(q, k, p.lk.row, p.D, w, s);
      const C sc = p.scale;
      for (int64_t j = 0; j < w; ++j) s[j] *= sc;
    }
  }
  if constexpr (std::is_same_v<C, float>) {
    if (packed) {
      const int64_t kv = b * p.Hkv + kvh;
      const math::PackedB kp(p.kpack + kv * p.kpack_size, p.D, p.T, nr);
      math::sgemm({q, rows, p.D, qrow, 1}, kp.block(0, p.D, c0, w), s, w, scaled);
    }
  }
  if (!packed && !(single && std::is_same_v<C, float>)) {
    math::gemm<C>(q, rows, p.D, qrow, 1, k, w, 1, p.lk.row, s, w, scaled);
  }
  MutMap<C> sc(s, rows, w, Eigen::OuterStride<>(w));

  // qk rows of a block are consecutive either way: [.., head, position, key] with either the
  // position or (when there is one position) the head advancing.
  C* qk = p.qk ? p.qk + ((b * p.Hq + blk.h0) * p.Sq + blk.i0) * p.T : nullptr;
  auto save = [&](int mode) {
    if (qk && p.mode == mode) std::memcpy(qk, s, static_cast<size_t>(rows * w) * sizeof(C));
  };
  save(0);
  if (p.softcap > 0) {
    if constexpr (std::is_same_v<C, float>) {
      // The rows x w scores are contiguous (row stride w).
      sc.array() /= p.softcap;
      math::kernels().vec.tanh(s, s, rows * w);
      sc.array() *= p.softcap;
    } else {
      sc = (sc.array() / p.softcap).tanh() * p.softcap;
    }
  }
  save(1);

  // Float without the scores output: each row keeps softmax's numerators, and the division
  // by their sum is done on the row of the product with V (Dv values instead of w).
  constexpr bool kFloat = std::is_same_v<C, float>;
  const bool deferred = kFloat && !qk;
  int64_t* live = slot.live;
  C* sums = slot.sums;
  for (int64_t r = 0; r < rows; ++r) {
    C* row = s + r * w;
    const int64_t l = lo[r] - c0, e = hi[r] - c0;  // local attendable range
    for (int64_t j = 0; j < std::min(l, w); ++j) row[j] = kNegInf;
    for (int64_t j = std::max<int64_t>(e, 0); j < w; ++j) row[j] = kNegInf;
    bool any = l < e;
    const int64_t m = b * p.ms[0] + (blk.h0 + r * blk.head_step) * p.ms[1] +
                      (blk.i0 + r * blk.pos_step) * p.ms[2];
    const C* bias = nullptr;  // added by the numerators' kernel
    if (p.mask == MaskKind::Additive && p.ms[3] == 1 && l < e) {
      // Biases along contiguous keys: one vector add (in the numerators' kernel when they
      // cover the whole row). A row all of whose biases are -inf is -inf throughout and
      // found by its maximum below.
      const int64_t e_in = std::clamp<int64_t>(p.mask_len - c0, l, e);
      if (deferred && l == 0 && e_in == w) {
        bias = p.mask_add + m + c0;
      } else {
        Eigen::Map<Eigen::Array<C, Eigen::Dynamic, 1>>(row + l, e_in - l) +=
            Eigen::Map<const Eigen::Array<C, Eigen::Dynamic, 1>>(p.mask_add + m + c0 + l, e_in - l);
        std::fill(row + e_in, row + e, kNegInf);
      }
    } else if (p.mask != MaskKind::None && l < e) {
      any = false;
      for (int64_t j = l; j < e; ++j) {
        const int64_t key = j + c0;
        if (key >= p.mask_len) {
          row[j] = kNegInf;
        } else if (p.mask == MaskKind::Bool) {
          if (p.mask_bool[m + key * p.ms[3]]) {
            any = true;
          } else {
            row[j] = kNegInf;
          }
        } else {
          const C bias = p.mask_add[m + key * p.ms[3]];
          row[j] += bias;
          if (bias != kNegInf) any = true;
        }
      }
    }
    live[r] = any;
    if constexpr (kFloat) {
      if (deferred) {
        // Keys outside [l, e) are -inf: their numerators are 0.
        if (any) {
          sums[r] = math::kernels().vec.softmax_numerators(row, bias, w);
        } else {
          std::fill(row, row + w, C(0));
          sums[r] = 0;
        }
      }
    }
  }
  // Output row r divided by its sum; a fully masked row (sum 0) attends nothing: zeros.
  auto divide_rows = [&] {
    for (int64_t r = 0; r < rows; ++r) {
      C* out = y + r * yrow;
      const C inv = sums[r] != 0 ? C(1) / sums[r] : C(0);
      if (inv == 0) {
        std::fill(out, out + p.Dv, C(0));
      } else {
        Eigen::Map<Eigen::Array<C, Eigen::Dynamic, 1>>(out, p.Dv) *= inv;
      }
    }
  };
  if (deferred) {
    if constexpr (kFloat) {
      if (single) {
        gk.gemv_rows(s, v, p.lv.row, w, p.Dv, y);
      } else if (packed) {
        const int64_t kv = b * p.Hkv + kvh;
        const math::PackedB vp(p.vpack + kv * p.vpack_size, p.T, p.Dv, nr);
        math::sgemm({s, rows, w, w, 1}, vp.block(c0, w, 0, p.Dv), y, yrow, one_thread);
      } else {
        math::gemm<C>(s, rows, w, w, 1, v, p.Dv, p.lv.row, 1, y, yrow, one_thread);
      }
      divide_rows();
    }
    return;
  }
  save(2);

  for (int64_t r = 0; r < rows; ++r) {
    C* row = s + r * w;
    const int64_t l = std::clamp<int64_t>(lo[r] - c0, 0, w);
    const int64_t e = std::clamp<int64_t>(hi[r] - c0, l, w);
    std::fill(row, row + l, C(0));
    std::fill(row + e, row + w, C(0));
    Eigen::Map<Eigen::Array<C, Eigen::Dynamic, 1>> seg(row + l, e - l);
    if constexpr (std::is_same_v<C, float>) {
      const math::VecMathKernels& vm = math::kernels().vec;
      const C mx = live[r] && e > l ? vm.max(row + l, e - l) : kNegInf;
      if (mx == kNegInf) {  // a fully masked row attends nothing: zeros, not NaN
        seg.setZero();
        continue;
      }
      vm.softmax(row + l, row + l, e - l);
    } else {
      const C mx = live[r] && e > l ? seg.maxCoeff() : kNegInf;
      if (mx == kNegInf) {  // a fully masked row attends nothing: zeros, not NaN
        seg.setZero();
        continue;
      }
      seg = (seg - mx).exp();
      seg *= C(1) / seg.sum();
    }
  }
  save(3);
  if constexpr (std::is_same_v<C, float>) {
    if (single) {
      gk.gemv_rows(s, v, p.lv.row, w, p.Dv, y);
      return;
    }
    if (packed) {
      const int64_t kv = b * p.Hkv + kvh;
      const math::PackedB vp(p.vpack + kv * p.vpack_size, p.T, p.Dv, nr);
      math::sgemm({s, rows, w, w, 1}, vp.block(c0, w, 0, p.Dv), y, yrow, one_thread);
      return;
    }
  }
  math::gemm<C>(s, rows, w, w, 1, v, p.Dv, p.lv.row, 1, y, yrow, one_thread);
}

// Query rows per task for a problem (decode steps with grouped heads aside). Short
// sequences take all of a head's rows in one task when its scores fit in a scratch that
// stays in the core's L2 and there are enough (batch, head) pairs for the threads: two
// products per head instead of a few per block, and K and V read once.
int64_t rows_per_task(const Dims& p, int threads) {
  const int64_t T = std::max<int64_t>(p.T, 1);
  if (p.Sq <= kBlockRows) return std::max<int64_t>(p.Sq, 1);
  if (p.Sq * T <= kWholeHeadScores && p.B * p.Hq >= threads) return p.Sq;
  return kBlockRows;
}

// How run_problem cuts a problem into tasks: `n` tasks of at most `rows` query rows, each
// (batch, head) in `blocks` blocks, or (single-position decode with grouped heads) one task
// per (batch, KV head) over its group of query heads.
struct Tasks {
  bool by_group = false;
  int64_t group = 1, per_task = 1, rows = 1, blocks = 1, heads = 1, n = 0, grain = 1;
};

Tasks tasks_of(const Dims& p, int threads) {
  Tasks t;
  t.group = p.Hq / p.Hkv;
  t.by_group = p.Sq == 1 && t.group > 1;
  t.per_task = rows_per_task(p, threads);
  t.rows = t.by_group ? t.group : t.per_task;
  t.blocks = t.by_group ? 1 : (p.Sq + t.per_task - 1) / t.per_task;
  t.heads = t.by_group ? p.Hkv : p.Hq;
  t.n = p.B * t.heads * t.blocks;
  t.grain = grain_for(t.rows * std::max<int64_t>(p.T, 1) * (p.D + p.Dv + 8));
  return t;
}

}  // namespace

CoreParts core_parts(WorkspaceLayout& layout, const Dims& d, DataType ct, int threads) {
  CoreParts c;
  c.threads = std::max(threads, 1);
  if (d.Hkv <= 0 || d.Hq % d.Hkv != 0) return c;
  const Tasks t = tasks_of(d, c.threads);
  c.rows = t.rows;
  // Tasks on the calling thread when they are too few to split (parallel_for's rule), else
  // a slot per thread of the arena, found by its thread index.
  c.slots = t.n <= t.grain || c.threads == 1 ? 1 : c.threads;
  // Float with long query blocks: K^T and V of every (batch, KV head) packed once for the
  // blocks to share, where each block's products would pack them anyway (one task per head,
  // no grouped heads, reads them once in its own products).
  const math::GemmKernels& g = math::kernels().gemm;
  const bool pack = ct == DataType::Float && t.n > 0 && !(t.rows <= 4 * g.mr) &&
                    !(t.rows >= d.Sq && d.Hq == d.Hkv) && d.T > 0 && d.D > 0 && d.Dv > 0;
  if (pack) {
    c.kpack = math::PackedB::packed_floats(d.D, d.T, g.nr);
    c.vpack = math::PackedB::packed_floats(d.T, d.Dv, g.nr);
  }
  c.pack = layout.add(DataType::Float, d.B * d.Hkv * (c.kpack + c.vpack));
  const int64_t per_slot = t.n > 0 ? t.rows * (std::max<int64_t>(d.T, 1) + 1) : 0;
  c.scores = layout.add(ct, c.slots * per_slot);
  c.ranges = layout.add(DataType::Int64, t.n > 0 ? c.slots * 3 * t.rows : 0);
  return c;
}

namespace {

// Packs K^T and V of every (batch, KV head) into the workspace's part for the blocks to share.
void pack_kv(Problem<float>& p, const Workspace& space, const CoreParts& c) {
  if (c.kpack == 0) return;
  const math::GemmKernels& g = math::kernels().gemm;
  p.kpack_size = c.kpack;
  p.vpack_size = c.vpack;
  const int64_t pairs = p.B * p.Hkv;
  float* kdst = space.data<float>(c.pack);
  float* vdst = kdst + pairs * p.kpack_size;
  parallel_for(pairs, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t kv = lo; kv < hi; ++kv) {
      const int64_t b = kv / p.Hkv, h = kv % p.Hkv;
      // K^T: column j is key j, read through K's row stride.
      g.pack_b(p.k + p.lk.at(b, h), 1, p.lk.row, p.D, p.T, kdst + kv * p.kpack_size);
      g.pack_b(p.v + p.lv.at(b, h), p.lv.row, 1, p.T, p.Dv, vdst + kv * p.vpack_size);
    }
  });
  p.kpack = kdst;
  p.vpack = vdst;
}

template <typename C>
void run_problem(const Problem<C>& p, const Workspace& space, const CoreParts& c) {
  const Tasks t = tasks_of(p, c.threads);
  if (t.n == 0) return;
  const int64_t per_slot = t.rows * (std::max<int64_t>(p.T, 1) + 1);
  C* scores = space.data<C>(c.scores);
  int64_t* ranges = space.data<int64_t>(c.ranges);
  auto body = [&](int64_t begin, int64_t end) {
    int slot = c.slots == 1 ? 0 : tbb::this_task_arena::current_thread_index();
    if (slot < 0 || slot >= c.slots) slot = 0;
    // Uninitialised: every score is written before it is read.
    C* s = scores + slot * per_slot;
    int64_t* r = ranges + slot * 3 * t.rows;
    const Slot<C> mine{s, s + t.rows * std::max<int64_t>(p.T, 1), r, r + t.rows, r + 2 * t.rows};
    for (int64_t it = begin; it < end; ++it) {
      Block blk;
      blk.b = it / (t.heads * t.blocks);
      const int64_t h = (it / t.blocks) % t.heads;
      if (t.by_group) {
        blk.h0 = h * t.group, blk.rows = t.group, blk.head_step = 1, blk.pos_step = 0;
      } else {
        blk.h0 = h, blk.i0 = (it % t.blocks) * t.per_task;
        blk.rows = std::min(t.per_task, p.Sq - blk.i0);
      }
      attend_block(p, blk, mine);
    }
  };
  if (c.slots == 1) {
    body(0, t.n);
  } else {
    parallel_for(t.n, t.grain, body);
  }
}
}  // namespace

// One memcpy per (batch, head) when the rows are back to back, else one per row.
void copy_heads(const Tensor& src, const Tensor& dst) {
  const Shape& ss = src.strides();
  const Shape& ds = dst.strides();
  const int64_t H = src.dim(1), L = src.dim(2), d = src.dim(3);
  if (d > 1 && (ss[3] != 1 || ds[3] != 1)) {
    copy_elements(src, dst);
    return;
  }
  const auto es = static_cast<int64_t>(bits_per_element(src.dtype()) / 8);
  const std::byte* sp = src.raw_data();
  std::byte* dp = dst.raw_data();
  parallel_for(src.dim(0) * H, grain_for(L * d * es, 1 << 16), [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const std::byte* from = sp + (b * ss[0] + h * ss[1]) * es;
      std::byte* to = dp + (b * ds[0] + h * ds[1]) * es;
      if (L <= 1 || (ss[2] == d && ds[2] == d)) {
        std::memcpy(to, from, static_cast<size_t>(L * d * es));
        continue;
      }
      for (int64_t l = 0; l < L; ++l) {
        std::memcpy(to + l * ds[2] * es, from + l * ss[2] * es, static_cast<size_t>(d * es));
      }
    }
  });
}

// present = concat(past, cur) along axis 2.
void append_cache(OpContext& ctx, const Tensor& past, const Tensor& cur, const Tensor& present) {
  const auto es = static_cast<size_t>(bits_per_element(present.dtype()) / 8);
  const size_t split = static_cast<size_t>(past.dim(2) * present.strides()[2]) * es;
  copy_heads(past, present.view(past.shape(), present.strides(), present.byte_offset()));
  copy_heads(cur, present.view(cur.shape(), present.strides(), present.byte_offset() + split));
  ctx.count_copy(present.nbytes(), CopyCause::Concat);
}

void solve(Problem<float>& p, const Workspace& space, const CoreParts& parts) {
  pack_kv(p, space, parts);
  run_problem(p, space, parts);
}

void solve(Problem<double>& p, const Workspace& space, const CoreParts& parts) {
  run_problem(p, space, parts);
}

void convert_into(const Tensor& src, const Tensor& dst) {
  dispatch(FloatTypes{}, src.dtype(), [&]<typename S>() {
    dispatch(FloatTypes{}, dst.dtype(), [&]<typename D>() {
      unary_loop<S, D>(src, dst, [](S v) { return convert_value<D>(v); });
    });
  });
}

}  // namespace sdpa

namespace {

using sdpa::append_cache;
using sdpa::convert_into;
using sdpa::convert_value;
using sdpa::heads_view;
using sdpa::kPosLimit;
using sdpa::Layout;
using sdpa::layout_of;
using sdpa::MaskKind;
using sdpa::Problem;

// A 4-D tensor the GEMMs can map: element type `want`, unit stride along the last axis and a
// positive row stride. Returns `t` itself when it already is one, else converted into its
// workspace part `part` (attention_parts), or for a layout the GEMMs cannot read (a last axis
// that is not the innermost, broadcast or reversed rows) a dense copy, as the executor makes
// for an op without strided inputs.
Tensor mappable(OpContext& ctx, const Tensor& t, DataType want, const Workspace& space, int part) {
  const Shape& s = t.strides();
  const bool layout_ok = (t.dim(3) <= 1 || s[3] == 1) && (t.dim(2) <= 1 || s[2] > 0);
  if (t.dtype() == want && layout_ok) return t;
  if (t.dtype() == want) {
    Tensor c = t.contiguous();
    ctx.count_copy(c.nbytes(), CopyCause::Contiguous);
    return c;
  }
  Tensor c = space.tensor(part, t.shape());
  convert_into(t, c);
  return c;
}

// What the workspace of one run holds beside the core's scratch, from the node's sizes and
// types.
struct Request {
  sdpa::Dims d;                                                            // T counts the past
  DataType q = DataType::Float, k = DataType::Float, v = DataType::Float;  // after the cache
  bool present_k = false, present_v = false;  // a past given without output 1 / 2
  bool qk = false;                            // output 3
  DataType mask = DataType::Undefined;        // attn_mask's type (Undefined: none)
  int64_t mask_elements = 0;
  bool nonpad = false;
  int threads = 1;
};

// The workspace, as both the kernel and attention_workspace lay it out: present K and V
// when they are not outputs; Q, K and V, the output, the scores output and an additive mask
// converted to the compute type when they are of another; nonpad_kv_seqlen; the core's
// scratch (packed K/V, each thread's scores). Parts not taken are empty.
struct Parts {
  WorkspaceLayout layout;
  int present_k = -1, present_v = -1, q = -1, k = -1, v = -1, y = -1, qk = -1, mask = -1;
  int nonpad = -1;
  sdpa::CoreParts core;
};

Parts attention_parts(const Request& r) {
  Parts p;
  WorkspaceLayout& l = p.layout;
  const sdpa::Dims& d = r.d;
  const DataType ct = r.q == DataType::Double ? DataType::Double : DataType::Float;
  auto in_ct = [&](DataType t, int64_t n) { return t == ct ? 0 : n; };
  p.present_k = l.add(r.k, r.present_k ? d.B * d.Hkv * d.T * d.D : 0);
  p.present_v = l.add(r.v, r.present_v ? d.B * d.Hkv * d.T * d.Dv : 0);
  p.q = l.add(ct, in_ct(r.q, d.B * d.Hq * d.Sq * d.D));
  p.k = l.add(ct, in_ct(r.k, d.B * d.Hkv * d.T * d.D));
  p.v = l.add(ct, in_ct(r.v, d.B * d.Hkv * d.T * d.Dv));
  p.y = l.add(ct, in_ct(r.q, d.B * d.Hq * d.Sq * d.Dv));
  p.qk = l.add(ct, r.qk ? in_ct(r.q, d.B * d.Hq * d.Sq * d.T) : 0);
  const bool convert_mask = r.mask != DataType::Undefined && r.mask != DataType::Bool;
  p.mask = l.add(ct, convert_mask ? in_ct(r.mask, r.mask_elements) : 0);
  p.nonpad = l.add(DataType::Int64, r.nonpad ? d.B : 0);
  p.core = sdpa::core_parts(l, d, ct, r.threads);
  return p;
}

class Attention final : public Kernel {
 public:
  explicit Attention(const NodeInfo& info)
      : causal_(info.attr_int("is_causal", 0) != 0),
        q_heads_(info.attr_int("q_num_heads", 0)),
        kv_heads_(info.attr_int("kv_num_heads", 0)),
        mode_(info.attr_int("qk_matmul_output_mode", 0)),
        has_scale_(info.has_attr("scale")),
        scale_(info.attr_float("scale", 1.0f)),
        softcap_(info.attr_float("softcap", 0.0f)) {
    if (mode_ < 0 || mode_ > 3) info.fail("qk_matmul_output_mode must be 0, 1, 2 or 3");
    if (q_heads_ < 0 || kv_heads_ < 0) info.fail("head counts must be positive");
    if (info.has_attr("softmax_precision")) {
      const int64_t sp = info.attr_int("softmax_precision");
      if (sp != 1 && sp != 10 && sp != 11 && sp != 16) {
        info.fail("softmax_precision must be FLOAT, FLOAT16, DOUBLE or BFLOAT16");
      }
    }
    if (info.opset() < 24 && info.num_inputs() > 6) {
      info.fail("nonpad_kv_seqlen needs opset 24");
    }
    if (info.opset() >= 25) {
      left_ = info.attr_int("left_window_size", -1);
      right_ = info.attr_int("right_window_size", -1);
      if (left_ < -1 || right_ < -1) info.fail("window sizes must be -1 or non-negative");
      left_ = std::min(left_, kPosLimit);
      right_ = std::min(right_, kPosLimit);
    }
  }

  void run(OpContext& ctx) override {
    const Tensor& q_in = ctx.input(0);
    const Tensor& k_in = ctx.input(1);
    const Tensor& v_in = ctx.input(2);
    const size_t rank = q_in.rank();
    if ((rank != 3 && rank != 4) || k_in.rank() != rank || v_in.rank() != rank) {
      ctx.fail("Q, K and V must all be 3-D or all 4-D, got " + q_in.describe() + ", " +
               k_in.describe() + ", " + v_in.describe());
    }
    if (k_in.dtype() != q_in.dtype() || !type_in(FloatTypes{}, q_in.dtype()) ||
        !type_in(FloatTypes{}, v_in.dtype())) {
      ctx.fail("Q and K must share a float type and V must be a float type");
    }
    Tensor q = q_in, k = k_in, v = v_in;
    if (rank == 3) {
      if (q_heads_ <= 0 || kv_heads_ <= 0) {
        ctx.fail("3-D inputs need positive q_num_heads and kv_num_heads");
      }
      if (q.dim(2) % q_heads_ || k.dim(2) % kv_heads_ || v.dim(2) % kv_heads_) {
        ctx.fail("hidden sizes " + q.describe() + ", " + k.describe() + ", " + v.describe() +
                 " are not divisible by the head counts");
      }
      q = heads_view(q, q_heads_);
      k = heads_view(k, kv_heads_);
      v = heads_view(v, kv_heads_);
    } else if ((q_heads_ && q_heads_ != q.dim(1)) || (kv_heads_ && kv_heads_ != k.dim(1))) {
      ctx.fail("q_num_heads/kv_num_heads disagree with the 4-D input shapes");
    }
    const int64_t B = q.dim(0), Hq = q.dim(1), Sq = q.dim(2), D = q.dim(3);
    const int64_t Hkv = k.dim(1), S = k.dim(2), Dv = v.dim(3);
    if (k.dim(0) != B || v.dim(0) != B || v.dim(1) != Hkv || v.dim(2) != S || k.dim(3) != D) {
      ctx.fail("Q, K and V shapes disagree: " + q_in.describe() + ", " + k_in.describe() + ", " +
               v_in.describe());
    }
    if (Hkv <= 0 || Hq % Hkv != 0) {
      ctx.fail("q_num_heads " + std::to_string(Hq) + " is not a multiple of kv_num_heads " +
               std::to_string(Hkv));
    }

    // KV cache: present = concat(past, new) along the sequence, written once, into outputs
    // 1 and 2 or the workspace.
    const bool has_past = ctx.has_input(4) || ctx.has_input(5);
    if (has_past && !(ctx.has_input(4) && ctx.has_input(5))) {
      ctx.fail("past_key and past_value must be given together");
    }
    int64_t past = 0;
    Tensor present_k, present_v;
    if (has_past) {
      const Tensor& pk = ctx.input(4);
      const Tensor& pv = ctx.input(5);
      past = pk.rank() == 4 ? pk.dim(2) : -1;
      if (pk.rank() != 4 || pv.rank() != 4 || pk.dtype() != k.dtype() || pv.dtype() != v.dtype() ||
          pk.shape() != Shape{B, Hkv, past, D} || pv.shape() != Shape{B, Hkv, past, Dv}) {
        ctx.fail("past_key " + pk.describe() + " / past_value " + pv.describe() +
                 " do not match K and V");
      }
      if (ctx.has_output(1)) present_k = ctx.output(1, k.dtype(), {B, Hkv, past + S, D});
      if (ctx.has_output(2)) present_v = ctx.output(2, v.dtype(), {B, Hkv, past + S, Dv});
    } else {
      if (ctx.has_output(1)) ctx.set_output(1, k);
      if (ctx.has_output(2)) ctx.set_output(2, v);
    }
    const int64_t T = past + S;
    if (ctx.has_input(6) && has_past) {
      ctx.fail("nonpad_kv_seqlen cannot be combined with past_key/past_value");
    }

    const DataType ct = q.dtype() == DataType::Double ? DataType::Double : DataType::Float;
    Shape y_shape = rank == 3 ? Shape{B, Sq, Hq * Dv} : Shape{B, Hq, Sq, Dv};
    Tensor y_out = ctx.output(0, q_in.dtype(), y_shape);
    Tensor qk_out;
    if (ctx.has_output(3)) qk_out = ctx.output(3, q_in.dtype(), {B, Hq, Sq, T});

    // The workspace, after the outputs (attention_parts).
    Request r;
    r.d = {B, Hq, Hkv, Sq, T, D, Dv};
    r.q = q.dtype(), r.k = k.dtype(), r.v = v.dtype();
    r.present_k = has_past && !ctx.has_output(1);
    r.present_v = has_past && !ctx.has_output(2);
    r.qk = ctx.has_output(3);
    if (ctx.has_input(3)) r.mask = ctx.input(3).dtype(), r.mask_elements = ctx.input(3).numel();
    r.nonpad = ctx.has_input(6);
    r.threads = ctx.threads();
    const Parts parts = attention_parts(r);
    const Workspace space(ctx, parts.layout);

    if (has_past) {
      if (!present_k.defined()) present_k = space.tensor(parts.present_k, {B, Hkv, T, D});
      if (!present_v.defined()) present_v = space.tensor(parts.present_v, {B, Hkv, T, Dv});
      append_cache(ctx, ctx.input(4), k, present_k);
      append_cache(ctx, ctx.input(5), v, present_v);
      k = present_k;
      v = present_v;
    }
    const int64_t* nonpad = nullptr;
    if (ctx.has_input(6)) {
      const Tensor& n = ctx.input(6);
      if (n.dtype() != DataType::Int64 || n.shape() != Shape{B}) {
        ctx.fail("nonpad_kv_seqlen must be int64 of shape [batch], got " + n.describe());
      }
      const Tensor copy = space.tensor(parts.nonpad, {B});
      copy_elements(n, copy);
      nonpad = copy.data<const int64_t>();
    }

    Tensor y = y_out.dtype() == ct ? y_out : space.tensor(parts.y, y_shape);
    Tensor qk;
    if (qk_out.defined()) {
      qk = qk_out.dtype() == ct ? qk_out : space.tensor(parts.qk, qk_out.shape());
    }
    const Tensor qc = mappable(ctx, q, ct, space, parts.q);
    const Tensor kc = mappable(ctx, k, ct, space, parts.k);
    const Tensor vc = mappable(ctx, v, ct, space, parts.v);
    const Tensor y4 = rank == 3 ? heads_view(y, Hq) : y;

    auto solve = [&]<typename C>() {
      Problem<C> p;
      static_cast<sdpa::Dims&>(p) = r.d;
      p.q = qc.data<const C>(), p.lq = layout_of(qc);
      p.k = kc.data<const C>(), p.lk = layout_of(kc);
      p.v = vc.data<const C>(), p.lv = layout_of(vc);
      p.y = y4.data<C>(), p.ly = layout_of(y4);
      p.qk = qk.defined() ? qk.data<C>() : nullptr;
      p.mode = static_cast<int>(mode_);
      const double scale = has_scale_ ? scale_ : (D > 0 ? 1.0 / std::sqrt(double(D)) : 1.0);
      p.scale = static_cast<C>(scale);
      p.softcap = static_cast<C>(softcap_);
      p.causal = causal_, p.left = left_, p.right = right_;
      p.past = past, p.nonpad = nonpad;
      if (ctx.has_input(3)) setup_mask(ctx, ctx.input(3), ct, space, parts.mask, &p);
      sdpa::solve(p, space, parts.core);
    };
    if (ct == DataType::Double) {
      solve.template operator()<double>();
    } else {
      solve.template operator()<float>();
    }
    if (y.storage() != y_out.storage()) convert_into(y, y_out);
    if (qk.defined() && qk.storage() != qk_out.storage()) convert_into(qk, qk_out);
  }

 private:
  template <typename C>
  static void setup_mask(OpContext& ctx, const Tensor& m, DataType ct, const Workspace& space,
                         int part, Problem<C>* p) {
    if (m.rank() < 1 || m.rank() > 4)
      ctx.fail("attn_mask must have rank 1 to 4, got " + m.describe());
    const int64_t want[3] = {p->B, p->Hq, p->Sq};
    const size_t pad = 4 - m.rank();
    const int64_t len = m.dim(m.rank() - 1);
    if (len > p->T) {
      ctx.fail("attn_mask " + m.describe() + " is longer than the " + std::to_string(p->T) +
               " keys");
    }
    for (size_t d = pad; d < 3; ++d) {
      const int64_t dim = m.dim(d - pad);
      if (dim != 1 && dim != want[d]) {
        ctx.fail("attn_mask " + m.describe() +
                 " does not broadcast to [batch, heads, q_len, keys]");
      }
    }
    Tensor t = m;
    if (m.dtype() == DataType::Bool) {
      p->mask = MaskKind::Bool;
      p->mask_bool = reinterpret_cast<const uint8_t*>(t.raw_data());
    } else {
      if (m.dtype() != ct) {
        if (!type_in(NumericTypes{}, m.dtype())) throw_unsupported_type(m.dtype(), "attn_mask");
        t = space.tensor(part, m.shape());
        dispatch(NumericTypes{}, m.dtype(), [&]<typename M>() {
          unary_loop<M, C>(m, t, [](M x) { return convert_value<C>(x); });
        });
      }
      p->mask = MaskKind::Additive;
      p->mask_add = t.data<const C>();
    }
    for (size_t d = pad; d < 4; ++d) {
      p->ms[d] = t.dim(d - pad) == 1 && d < 3 ? 0 : t.strides()[d - pad];
    }
    p->mask_len = len;
  }

  bool causal_;
  int64_t q_heads_, kv_heads_, mode_;
  bool has_scale_;
  float scale_, softcap_;
  int64_t left_ = -1, right_ = -1;
};

// The sizes the kernel reads off Q, K and V ([B, Hq, Sq, D], [B, Hkv, S, D], [B, Hkv, S, Dv]),
// 3-D inputs split into heads by q_num_heads/kv_num_heads; unknown() when they are not
// known or disagree (the kernel then fails the node).
struct AttentionSizes {
  int64_t B = 0, Hq = 0, Hkv = 0, Sq = 0, S = 0, D = 0, Dv = 0, past = 0;
  size_t rank = 0;
};

AttentionSizes attention_sizes(const ShapeContext& c) {
  const Shape& q = c.shape(0);
  const Shape& k = c.shape(1);
  const Shape& v = c.shape(2);
  AttentionSizes z;
  z.rank = q.size();
  if ((z.rank != 3 && z.rank != 4) || k.size() != z.rank || v.size() != z.rank) {
    unknown("Q, K and V of another rank");
  }
  for (const Shape* s : {&q, &k, &v})
    for (int64_t d : *s)
      if (d < 0) unknown("sizes");
  if (z.rank == 3) {
    const int64_t qh = c.attr_i("q_num_heads", 0), kvh = c.attr_i("kv_num_heads", 0);
    if (qh <= 0 || kvh <= 0 || q[2] % qh || k[2] % kvh || v[2] % kvh) unknown("head counts");
    z = {q[0], qh, kvh, q[1], k[1], q[2] / qh, v[2] / kvh, 0, 3};
  } else {
    z = {q[0], q[1], k[1], q[2], k[2], q[3], v[3], 0, 4};
  }
  if (k[0] != z.B || v[0] != z.B || (z.rank == 4 && (v[1] != z.Hkv || v[2] != z.S)) ||
      (z.rank == 3 && v[1] != z.S) || (z.rank == 4 && k[3] != z.D) ||
      (z.rank == 3 && k[2] / z.Hkv != z.D) || z.Hkv <= 0 || z.Hq % z.Hkv) {
    unknown("Q, K and V disagree");
  }
  if (c.has(4) != c.has(5)) unknown("past_key without past_value");
  if (c.has(4)) {
    const Shape& pk = c.shape(4);
    if (pk.size() != 4 || pk[2] < 0) unknown("past of another rank");
    z.past = pk[2];
  }
  return z;
}

// Y ([B, Sq, Hq*Dv] for 3-D inputs, else [B, Hq, Sq, Dv]), present_key/value (the past
// extended by K and V, or K and V themselves in heads without a past) and the scores.
void attention_shape(ShapeContext& c) {
  const AttentionSizes z = attention_sizes(c);
  const int64_t T = z.past + z.S;
  c.set(0, c.dtype(0), z.rank == 3 ? Shape{z.B, z.Sq, z.Hq * z.Dv} : Shape{z.B, z.Hq, z.Sq, z.Dv});
  c.set(1, c.dtype(1), {z.B, z.Hkv, T, z.D});
  c.set(2, c.dtype(2), {z.B, z.Hkv, T, z.Dv});
  c.set(3, c.dtype(0), {z.B, z.Hq, z.Sq, T});
}

// In the kernel's order: present_key/value made for a past, else K and V viewed in heads
// (heads_view's strides); then Y and the scores.
void place_attention(Placement& p) {
  const ir::Node& node = p.node();
  const bool has_past = node.inputs.size() > 4 && node.inputs[4] != ir::kNoValue;
  const auto produced = [&](size_t o) {
    return o < node.outputs.size() && node.outputs[o] != ir::kNoValue;
  };
  for (size_t o : {size_t{1}, size_t{2}}) {
    if (!produced(o)) continue;
    if (has_past) {
      p.allocate(o);
      continue;
    }
    Shape s = p.strides(o);
    if (s.size() == 3) {
      const int64_t d = p.output(o).shape[3];
      s = {s[0], d * s[2], s[1], s[2]};
    }
    p.view(o, o, std::move(s));
  }
  p.allocate(0);
  if (produced(3)) p.allocate(3);
}

// The kernel's workspace (attention_parts) for these shapes on c.threads() threads.
uint64_t attention_workspace(const ShapeContext& c) {
  const AttentionSizes z = attention_sizes(c);
  Request r;
  r.d = {z.B, z.Hq, z.Hkv, z.Sq, z.past + z.S, z.D, z.Dv};
  r.q = c.dtype(0), r.k = c.dtype(1), r.v = c.dtype(2);
  r.present_k = c.has(4) && !c.has_out(1);
  r.present_v = c.has(4) && !c.has_out(2);
  r.qk = c.has_out(3);
  if (c.has(3)) r.mask = c.dtype(3), r.mask_elements = numel_or_unknown(c.shape(3));
  r.nonpad = c.has(6);
  r.threads = c.threads();
  return attention_parts(r).layout.bytes();
}

}  // namespace

KILN_REGISTER_OP({.op = "Attention",
                  .since = 23,
                  .min_inputs = 3,
                  .max_inputs = 7,
                  .min_outputs = 1,
                  .max_outputs = 4,
                  .strided_inputs = true,
                  .types = "float, double, float16, bfloat16",
                  .shape = attention_shape,
                  .place = place_attention,
                  .workspace = attention_workspace,
                  .create = make<Attention>});

}  // namespace kiln::ops

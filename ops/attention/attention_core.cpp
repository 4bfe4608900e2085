// The scaled dot-product attention core (ops/attention/attention_core.h): key ranges, one block of
// query rows at a time in the GEMM layer, the workspace it takes, and the KV cache helpers.
//
// Work is split over (batch, query head, block of query rows). A task computes its block of
// scores with one product in the GEMM layer reading the inputs in place (3-D inputs are read
// as strided 4-D views, K^T as a column-major view, never transposed), applies the bias row
// by row straight from the unbroadcast mask, softmaxes in place (the vector kernels for
// float) and multiplies by V directly into the output. Only the columns a
// block can attend are computed (causal prefill does half the work).
#include "ops/attention/attention_core.h"

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "ops/core/common.h"
#include "ops/core/elementwise.h"
#include "ops/math/gemm.h"
#include "ops/math/kernels.h"

#include <tbb/task_arena.h>

namespace kiln::ops {
namespace sdpa {
namespace {

// Query rows per task: a multiple of every level's GEMM tile height (12, 6), so no block ends
// in a short tile.
constexpr int64_t kBlockRows = 60;
// Scores a task may hold for a whole head (256 KiB of float: within a core's L2).
constexpr int64_t kWholeHeadScores = int64_t{64} * 1024;

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

}  // namespace kiln::ops

// com.microsoft.MatMulNBits: Y = A * dequantize(B) (+ bias), B block-quantized to 4 or 8 bits
// along K, as onnxruntime's weight-only quantizers (MatMulNBitsQuantizer, the int4 model
// builders) write it:
//
//   A [..., K] float; B uint8 [N, ceil(K / block_size), block_size * bits / 8];
//   scales float [N * blocks]; zero_points (optional) uint8 packed like B
//   [N * ceil(blocks * bits / 8)] or float [N * blocks] (default 2^(bits - 1));
//   g_idx (optional, not supported); bias (optional) float [N]; Y [..., N].
//
// The weights are never widened to a float copy. Up to kGemvRows rows (a decode step) stream
// the packed blocks once through the dispatched NBitsKernels::gemv, columns split across
// threads. More rows dequantize one panel of columns at a time into each task's part of the
// workspace and hand it to the float GEMM. accuracy_level follows the model, as onnxruntime does:
// at 4, few rows of A are quantized to int8 per block and each block of 4-bit weights is an
// integer dot product (NBitsKernels::gemv_int8, onnxruntime's CompInt8); levels 0-3, 8-bit
// weights and many rows compute in float.
#include <algorithm>
#include <string>

#include "ops/core/common.h"
#include "ops/core/workspace.h"
#include "ops/math/gemm.h"
#include "ops/math/kernels.h"
#include "ops/math/threading.h"

namespace kiln::ops {
namespace {

constexpr size_t kGIdx = 4, kBias = 5;
// Rows of A up to which the weights are streamed once per kernels().nbits.max_rows rows
// rather than dequantized for the GEMM: beyond it, dequantizing panels once costs less than
// streaming them again (measured: docs/performance.md, "Figures cited in code comments").
constexpr int64_t kGemvRows = 8;
// Floats of one dequantized panel: columns of K values that stay in L2 while the GEMM packs
// them.
constexpr int64_t kPanelFloats = 64 * 1024;

// The workspace, as the kernel and nbits_workspace lay it out for m rows of A on `threads`
// threads: A prepared for the kernels (quantized to int8 with its scales at accuracy_level 4,
// else permuted in float) and its block sums; for many rows also A^T packed for the GEMM and
// each task's dequantized panel of nc columns and its product.
struct NBitsParts {
  WorkspaceLayout layout;
  int prepared = -1, quantized = -1, scales = -1, sums = -1, packed = -1, panel = -1, yt = -1;
  int tasks = 1;
  int64_t nc = 0;
};

NBitsParts nbits_parts(int64_t m, int64_t k, int64_t n, int64_t block, int64_t bits,
                       int64_t accuracy_level, int threads) {
  NBitsParts p;
  if (m == 0) return p;
  const int64_t blocks = (k + block - 1) / block, padded = blocks * block;
  WorkspaceLayout& l = p.layout;
  if (m <= kGemvRows && accuracy_level == 4 && bits == 4) {
    p.quantized = l.add(DataType::Int8, m * padded);
    p.scales = l.add(DataType::Float, m * blocks);
    p.sums = l.add(DataType::Float, m * blocks);
    return p;
  }
  p.prepared = l.add(DataType::Float, m * padded);
  p.sums = l.add(DataType::Float, m * blocks);
  if (m <= kGemvRows) return p;
  p.packed =
      l.add(DataType::Float, math::PackedB::packed_floats(padded, m, math::kernels().gemm.nr));
  const double work = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  p.tasks = math::tasks_for(work, threads);
  // Columns per panel: what fits kPanelFloats, and no more than a task's share.
  p.nc = std::max<int64_t>(16, kPanelFloats / padded / 16 * 16);
  p.nc = std::min(p.nc, (n + p.tasks - 1) / p.tasks);
  p.panel = l.add(DataType::Float, p.tasks * p.nc * padded);
  p.yt = l.add(DataType::Float, p.tasks * p.nc * m);
  return p;
}

class MatMulNBits final : public Kernel {
 public:
  explicit MatMulNBits(const NodeInfo& info)
      : k_(info.attr_int("K")),
        n_(info.attr_int("N")),
        bits_(info.attr_int("bits", 4)),
        block_(info.attr_int("block_size")) {
    if (bits_ != 4 && bits_ != 8) {
      info.fail("bits " + std::to_string(bits_) + " is not supported (4 or 8)",
                ErrorKind::Unsupported);
    }
    if (block_ < 16 || (block_ & (block_ - 1)) != 0) {
      info.fail("block_size " + std::to_string(block_) + " must be a power of two >= 16");
    }
    if (k_ <= 0 || n_ <= 0) info.fail("K and N must be positive");
    if (info.has_input(kGIdx)) {
      info.fail("g_idx (act-order quantization) is not supported", ErrorKind::Unsupported);
    }
    accuracy_level_ = info.attr_int("accuracy_level", 0);
  }

  void run(OpContext& ctx) override {
    const Tensor& a = ctx.input(0);
    if (a.dtype() != DataType::Float) {
      ctx.fail("A must be float, got " + a.describe(), ErrorKind::Unsupported);
    }
    if (a.rank() == 0 || a.dim(a.rank() - 1) != k_) {
      ctx.fail("A " + a.describe() + " must end in K = " + std::to_string(k_));
    }
    const math::NBitsMatrix b = matrix(ctx);
    const float* bias = bias_of(ctx);
    Shape out = a.shape();
    out.back() = n_;
    Tensor& y = ctx.output(0, DataType::Float, out);
    const int64_t m = a.numel() / k_;
    if (m == 0) return;
    const NBitsParts parts = nbits_parts(m, k_, n_, block_, bits_, accuracy_level_, ctx.threads());
    const Workspace space(ctx, parts.layout);
    if (m <= kGemvRows && accuracy_level_ == 4 && bits_ == 4) {
      stream_int8(b, a.data<const float>(), m, y.data<float>(), space, parts);
      if (bias) add_bias(bias, m, y.data<float>());
    } else if (m <= kGemvRows) {
      stream(b, a.data<const float>(), m, y.data<float>(), space, parts);
      if (bias) add_bias(bias, m, y.data<float>());
    } else {
      panels(b, a.data<const float>(), m, bias, y.data<float>(), space, parts);
    }
  }

 private:
  // B, scales and zero points checked against K, N, bits and block_size.
  math::NBitsMatrix matrix(OpContext& ctx) const {
    math::NBitsMatrix b;
    b.bits = static_cast<int>(bits_);
    b.k = k_;
    b.n = n_;
    b.block = block_;
    b.blocks = (k_ + block_ - 1) / block_;
    const Tensor& q = ctx.input(1);
    if (q.dtype() != DataType::UInt8 || q.numel() != n_ * b.blocks * b.block_bytes()) {
      ctx.fail("B " + q.describe() + " must be uint8 [N, blocks, blob] = [" + std::to_string(n_) +
               ", " + std::to_string(b.blocks) + ", " + std::to_string(b.block_bytes()) + "]");
    }
    b.data = q.data<const uint8_t>();
    const Tensor& s = ctx.input(2);
    if (s.dtype() != DataType::Float || s.numel() != n_ * b.blocks) {
      ctx.fail("scales " + s.describe() +
               " must be float with N * blocks = " + std::to_string(n_ * b.blocks) + " values");
    }
    b.scales = s.data<const float>();
    if (ctx.has_input(3)) {
      const Tensor& z = ctx.input(3);
      if (z.dtype() == DataType::UInt8 && z.numel() == n_ * b.zp_bytes()) {
        b.zero_points = z.data<const uint8_t>();
      } else if (z.dtype() == DataType::Float && z.numel() == n_ * b.blocks) {
        b.float_zero_points = z.data<const float>();
      } else {
        ctx.fail("zero_points " + z.describe() + " must be uint8 with " +
                 std::to_string(n_ * b.zp_bytes()) + " bytes (packed) or float with " +
                 std::to_string(n_ * b.blocks) + " values");
      }
    }
    return b;
  }

  const float* bias_of(OpContext& ctx) const {
    if (!ctx.has_input(kBias)) return nullptr;
    const Tensor& bias = ctx.input(kBias);
    if (bias.dtype() != DataType::Float || bias.numel() != n_) {
      ctx.fail("bias " + bias.describe() + " must be float with N = " + std::to_string(n_) +
               " values");
    }
    return bias.data<const float>();
  }

  // Few rows: the packed weights streamed once per nbits.max_rows rows, columns split
  // across threads.
  void stream(const math::NBitsMatrix& b, const float* a, int64_t m, float* y,
              const Workspace& space, const NBitsParts& parts) const {
    const math::NBitsKernels& nk = math::kernels().nbits;
    const int64_t padded = b.blocks * b.block;
    float* prepared = space.data<float>(parts.prepared);
    float* sums = space.data<float>(parts.sums);
    nk.prepare_a(a, k_, static_cast<int>(m), b, prepared, sums);
    over_columns(m, nk.max_rows, [&](int64_t r, int rows, int64_t j0, int64_t j1) {
      nk.gemv(prepared + r * padded, sums + r * b.blocks, rows, b, j0, j1, y + r * n_, n_);
    });
  }

  // stream() with A quantized to int8 per block (accuracy_level 4).
  void stream_int8(const math::NBitsMatrix& b, const float* a, int64_t m, float* y,
                   const Workspace& space, const NBitsParts& parts) const {
    const math::NBitsKernels& nk = math::kernels().nbits;
    const int64_t padded = b.blocks * b.block;
    int8_t* quantized = space.data<int8_t>(parts.quantized);
    float* scales = space.data<float>(parts.scales);
    float* sums = space.data<float>(parts.sums);
    nk.quantize_a(a, k_, static_cast<int>(m), b, quantized, scales, sums);
    over_columns(m, nk.max_rows, [&](int64_t r, int rows, int64_t j0, int64_t j1) {
      nk.gemv_int8(quantized + r * padded, scales + r * b.blocks, sums + r * b.blocks, rows, b, j0,
                   j1, y + r * n_, n_);
    });
  }

  // rows(r, count, j0, j1) for the m rows of A in groups of at most max_rows, over column
  // ranges [j0, j1) split across the tasks the product's work pays for.
  template <typename Rows>
  void over_columns(int64_t m, int max_rows, Rows&& rows) const {
    const double work = static_cast<double>(m) * static_cast<double>(n_) * static_cast<double>(k_);
    const int tasks = static_cast<int>(std::min<int64_t>(math::task_count(work), n_));
    math::run_tasks(tasks, [&](int t) {
      const int64_t j0 = n_ * t / tasks, j1 = n_ * (t + 1) / tasks;
      for (int64_t r = 0; r < m; r += max_rows) {
        rows(r, static_cast<int>(std::min<int64_t>(max_rows, m - r)), j0, j1);
      }
    });
  }

  void add_bias(const float* bias, int64_t m, float* y) const {
    const math::BinaryKernels& bk = math::kernels().binary;
    for (int64_t r = 0; r < m; ++r) bk.add(y + r * n_, 1, bias, 1, y + r * n_, n_);
  }

  // Many rows: panels of columns dequantized into each task's part of the workspace, each
  // multiplied by the float GEMM on the thread that made it. The panel's rows and A's are in
  // prepare_a's order (K permuted within each block the same way on both sides, which leaves the
  // product as it is) so that dequantizing stays a few vector instructions per value. The GEMM
  // computes each panel's Y^T = W_panel A^T: the panel is its left operand, read in rows as it was
  // written, and A^T is packed once for all panels.
  void panels(const math::NBitsMatrix& b, const float* a, int64_t m, const float* bias, float* y,
              const Workspace& space, const NBitsParts& parts) const {
    const math::MathKernels& t = math::kernels();
    const math::NBitsKernels& nk = t.nbits;
    const int64_t padded = b.blocks * b.block;
    float* prepared = space.data<float>(parts.prepared);
    nk.prepare_a(a, k_, static_cast<int>(m), b, prepared, space.data<float>(parts.sums));
    float* packed = space.data<float>(parts.packed);
    math::PackedB::pack_into(math::MatrixView::col_major(prepared, padded, m, padded), packed, t,
                             math::PackedType::Float32);
    const math::PackedB at(packed, padded, m, t.gemm.nr);
    const int tasks = parts.tasks;
    const int64_t nc = parts.nc, count = (n_ + nc - 1) / nc;
    math::run_tasks(tasks, [&](int task) {
      float* panel = space.data<float>(parts.panel) + task * nc * padded;
      float* yt = space.data<float>(parts.yt) + task * nc * m;
      for (int64_t c = task; c < count; c += tasks) {
        const int64_t j0 = c * nc, cols = std::min(nc, n_ - j0);
        nk.dequantize_rows(b, j0, j0 + cols, panel);
        math::GemmOptions o;
        o.max_threads = 1;
        o.row_bias = bias ? bias + j0 : nullptr;
        math::sgemm(math::MatrixView::row_major(panel, cols, padded, padded), at, yt, m, o);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t jj = 0; jj < cols; ++jj) y[i * n_ + j0 + jj] = yt[jj * m + i];
        }
      }
    });
  }

  int64_t k_, n_, bits_, block_;
  int64_t accuracy_level_ = 0;
};

// Y: A's shape with its last dimension N.
void nbits_shape(ShapeContext& c) {
  Shape s = c.shape(0);
  if (s.empty()) unknown("a scalar A");
  s.back() = c.attr_int("N", -1);
  c.set(0, c.dtype(0), s);
}

// The kernel's workspace (nbits_parts) for these shapes on c.threads() threads.
uint64_t nbits_workspace(const ShapeContext& c) {
  const int64_t k = c.attr_int("K", 0), block = c.attr_int("block_size", 0);
  if (k <= 0 || block < 16) unknown("bad K or block_size");
  const int64_t m = shape_numel(c.shape(0)) / k;
  return nbits_parts(m, k, c.attr_int("N", 0), block, c.attr_int("bits", 4),
                     c.attr_int("accuracy_level", 0), c.threads())
      .layout.bytes();
}

}  // namespace

KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "MatMulNBits",
                  .min_inputs = 3,
                  .max_inputs = 6,
                  .types = "float (B: uint8, 4 or 8 bits)",
                  .shape = nbits_shape,
                  .workspace = nbits_workspace,
                  .create = make<MatMulNBits>});

}  // namespace kiln::ops

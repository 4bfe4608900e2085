#include "ops/rnn/rnn_weights.h"

#include "ops/quant/quantize.h"

namespace kiln::ops::rnn {

WeightLayout layout_of(const Tensor& w, bool split) {
  return {w.dim(0), w.dim(1), w.dim(2), split, math::kernels().gemm.nr};
}

Tensor pack_weight(const Tensor& w, bool split) {
  Tensor f = w.contiguous();
  if (f.dtype() != DataType::Float) {
    Tensor wide(DataType::Float, f.shape(),
                Storage::heap_uninitialized(storage_bytes(DataType::Float, f.numel())));
    const math::ConvertKernels& cv = math::kernels().convert;
    (f.dtype() == DataType::Float16 ? cv.f16_to_f32 : cv.bf16_to_f32)(
        reinterpret_cast<const uint16_t*>(f.raw_data()), wide.data<float>(), f.numel());
    f = wide;
  }
  const WeightLayout l = layout_of(f, split);
  const int64_t floats = l.dirs * l.direction_floats();
  Tensor packed(DataType::Float, Shape{floats},
                Storage::heap_uninitialized(storage_bytes(DataType::Float, floats)));
  const math::MathKernels& t = math::kernels();
  for (int64_t d = 0; d < l.dirs; ++d) {
    for (int i = 0; i < l.segments(); ++i) {
      // Rows [begin, end) of the direction's [rows x k] weight, transposed: column-major.
      const float* src = f.data<const float>() + (d * l.rows + l.begin(i)) * l.k;
      math::PackedB::pack_into(
          math::MatrixView::col_major(src, l.k, l.end(i) - l.begin(i), l.k),
          packed.data<float>() + d * l.direction_floats() + (i == 1 ? l.segment_floats(0) : 0), t);
    }
  }
  packed.storage()->set_read_only();
  return packed;
}

std::string packing_name(bool split) {
  const math::MathKernels& t = math::kernels();
  return std::string(split ? "recurrent-wt-split-" : "recurrent-wt-") + math::isa_name(t.isa) +
         "-nr" + std::to_string(t.gemm.nr);
}

int64_t qweight_bytes(const Tensor& w) {
  return math::QPackedB::packed_bytes(w.dim(1), w.dim(2), math::kernels().int8_gemm);
}

Tensor pack_qweight(const Tensor& w) {
  const Tensor c = w.contiguous();
  const int64_t k = c.dim(1), n = c.dim(2), bytes = qweight_bytes(c);
  Tensor packed(DataType::UInt8, Shape{c.dim(0) * bytes},
                Storage::heap_uninitialized(static_cast<size_t>(c.dim(0) * bytes)));
  for (int64_t d = 0; d < c.dim(0); ++d) {
    math::QPackedB::pack_into(
        math::QMatrixView::row_major(reinterpret_cast<const uint8_t*>(c.raw_data()) + d * k * n, k,
                                     n, n, c.dtype() == DataType::Int8),
        packed.data<uint8_t>() + d * bytes, math::kernels());
  }
  packed.storage()->set_read_only();
  return packed;
}

std::string qpacking_name() {
  const math::MathKernels& t = math::kernels();
  return std::string("recurrent-q-") + math::isa_name(t.isa) + "-" + t.int8_gemm.layout + "-nr" +
         std::to_string(t.int8_gemm.nr);
}

void quantized_product(const float* src, int64_t rows, int64_t k, const QuantWeight& w, float* dst,
                       int64_t ld, const float* bias, bool accumulate, int max_threads) {
  std::vector<uint8_t> q(static_cast<size_t>(rows * k));
  const DynamicQuant dq = dynamic_quantize_u8(src, rows * k, q.data());
  const int64_t n = w.packed.n();
  std::vector<float> mult(w.per_column ? static_cast<size_t>(n) : 1);
  for (size_t j = 0; j < mult.size(); ++j) mult[j] = dq.scale * w.scales[j];
  math::QGemmOptions o;
  o.a_zero = dq.zero_point;
  o.max_threads = max_threads;
  if (w.zeros.size() > 1) {
    o.b_zeros = w.zeros.data();
  } else {
    o.b_zero = w.zeros[0];
  }
  math::qgemm(math::QMatrixView::row_major(q.data(), rows, k, k, false), w.packed,
              math::QGemmOutput::to_float(dst, ld, mult.data(), w.per_column, bias, accumulate), o);
}

}  // namespace kiln::ops::rnn

#include "ops/linalg/packed_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "ops/core/common.h"

namespace kiln::ops {
namespace {

math::PackedType packed_type(WeightPrecision p) {
  switch (p) {
    case WeightPrecision::BFloat16:
      return math::PackedType::BFloat16;
    case WeightPrecision::Float16:
      return math::PackedType::Float16;
    case WeightPrecision::Float32:
    case WeightPrecision::Int8:
      break;
  }
  return math::PackedType::Float32;
}

// `w` as contiguous float (a half type widened).
Tensor as_float(const Tensor& w) {
  const Tensor c = w.contiguous();
  if (c.dtype() == DataType::Float) return c;
  Tensor f(DataType::Float, c.shape(),
           Storage::heap_uninitialized(storage_bytes(DataType::Float, c.numel())));
  const math::ConvertKernels& cv = math::kernels().convert;
  (c.dtype() == DataType::Float16 ? cv.f16_to_f32 : cv.bf16_to_f32)(
      reinterpret_cast<const uint16_t*>(c.raw_data()), f.data<float>(), c.numel());
  return f;
}

}  // namespace

bool packs_constant_b(const Tensor* b) {
  return b && b->rank() == 2 && b->dim(0) > 0 && b->dim(1) > 0 &&
         (b->dtype() == DataType::Float || b->dtype() == DataType::Float16 ||
          b->dtype() == DataType::BFloat16);
}

bool packed_from_initializer(const NodeInfo& info, size_t i, const PackedWeight& packed) {
  if (!packed || !info.has_input(i)) return false;
  const ir::ValueInfo& v = info.graph().value(info.node().inputs[i]);
  return v.origin == ir::ValueOrigin::Initializer && v.constant.defined();
}

namespace {

// Constant input i (op(B): k x n) quantized per column to int8 and packed for qgemm, the
// column scales after the panels (see pack_constant_b).
PackedWeight pack_int8(const NodeInfo& info, size_t i, bool transpose, int64_t k, int64_t n) {
  const math::MathKernels& t = math::kernels();
  // The name says everything the layout depends on: the weights cache shares by it.
  const std::string packing = std::string("qgemm-b") + (transpose ? "t" : "") + "-int8w-" +
                              math::isa_name(t.isa) + "-" + t.int8_gemm.layout + "-nr" +
                              std::to_string(t.int8_gemm.nr);
  const int64_t panel_bytes = math::QPackedB::packed_bytes(k, n, t.int8_gemm);
  PackedWeight out;
  out.storage = info.prepared_input(i, packing, [&](const Tensor& w) {
    const Tensor f = as_float(w);
    math::MatrixView v{f.data<const float>(), f.dim(0), f.dim(1), f.strides()[0], f.strides()[1]};
    if (transpose) v = v.transposed();
    const auto at = [&](int64_t p, int64_t j) { return v.data[p * v.rs + j * v.cs]; };
    std::vector<float> scales(static_cast<size_t>(n));
    std::vector<int8_t> q(static_cast<size_t>(k * n));
    for (int64_t j = 0; j < n; ++j) {
      float amax = 0.0f;
      for (int64_t p = 0; p < k; ++p) amax = std::max(amax, std::abs(at(p, j)));
      const float s = amax > 0.0f && std::isfinite(amax) ? amax / 127.0f : 1.0f;
      scales[static_cast<size_t>(j)] = s;
      for (int64_t p = 0; p < k; ++p) {
        const float r = std::nearbyint(at(p, j) / s);
        q[static_cast<size_t>(p * n + j)] =
            std::isnan(r) ? int8_t{0} : static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
      }
    }
    const int64_t bytes = panel_bytes + n * static_cast<int64_t>(sizeof(float));
    Tensor packed(DataType::UInt8, Shape{bytes},
                  Storage::heap_uninitialized(static_cast<size_t>(bytes)));
    math::QPackedB::pack_into(math::QMatrixView::row_major(q.data(), k, n, n, true),
                              packed.raw_data(), t);
    std::memcpy(reinterpret_cast<uint8_t*>(packed.raw_data()) + panel_bytes, scales.data(),
                scales.size() * sizeof(float));
    packed.storage()->set_read_only();
    return packed;
  });
  const auto* raw = reinterpret_cast<const uint8_t*>(out.storage->raw_data());
  out.qview = math::QPackedB(raw, k, n, true);
  out.col_scales = reinterpret_cast<const float*>(raw + panel_bytes);
  return out;
}

}  // namespace

PackedWeight pack_constant_b(const NodeInfo& info, size_t i, bool transpose) {
  const Tensor* b = info.constant_input(i);
  if (!packs_constant_b(b)) return {};
  if (info.gemm_weights() == WeightPrecision::Int8) {
    return pack_int8(info, i, transpose, transpose ? b->dim(1) : b->dim(0),
                     transpose ? b->dim(0) : b->dim(1));
  }
  const math::MathKernels& t = math::kernels();
  const math::PackedType type = packed_type(info.gemm_weights());
  const int64_t k = transpose ? b->dim(1) : b->dim(0), n = transpose ? b->dim(0) : b->dim(1);
  static const char* const kTypeNames[] = {"f32", "bf16", "f16"};
  // The name says everything the layout depends on: the weights cache shares by it.
  const std::string packing = std::string("sgemm-b") + (transpose ? "t" : "") + "-" +
                              math::isa_name(t.isa) + "-nr" + std::to_string(t.gemm.nr) + "-" +
                              kTypeNames[static_cast<int>(type)];
  PackedWeight out;
  out.storage = info.prepared_input(i, packing, [&](const Tensor& w) {
    const Tensor f = as_float(w);
    const math::MatrixView v{f.data<const float>(), f.dim(0), f.dim(1), f.strides()[0],
                             f.strides()[1]};
    const DataType dt = type == math::PackedType::Float32    ? DataType::Float
                        : type == math::PackedType::BFloat16 ? DataType::BFloat16
                                                             : DataType::Float16;
    const int64_t count = math::PackedB::packed_floats(k, n, t.gemm.nr);
    Tensor packed(dt, Shape{count}, Storage::heap_uninitialized(storage_bytes(dt, count)));
    math::PackedB::pack_into(transpose ? v.transposed() : v, packed.raw_data(), t, type);
    packed.storage()->set_read_only();
    return packed;
  });
  out.view = math::PackedB(out.storage->raw_data(), k, n, t.gemm.nr, type);
  return out;
}

QPackedWeight pack_constant_qb(const NodeInfo& info, size_t i, bool transpose) {
  const Tensor* b = info.constant_input(i);
  if (!b || b->rank() != 2 || b->numel() == 0 ||
      (b->dtype() != DataType::UInt8 && b->dtype() != DataType::Int8)) {
    return {};
  }
  const math::MathKernels& t = math::kernels();
  const bool is_signed = b->dtype() == DataType::Int8;
  const int64_t k = transpose ? b->dim(1) : b->dim(0), n = transpose ? b->dim(0) : b->dim(1);
  // The same name as MatMulInteger's packing when not transposed: the layouts are the same.
  const std::string packing = std::string("qgemm-b") + (transpose ? "t-" : "-") +
                              math::isa_name(t.isa) + "-" + t.int8_gemm.layout + "-nr" +
                              std::to_string(t.int8_gemm.nr);
  QPackedWeight out;
  out.storage = info.prepared_input(i, packing, [&](const Tensor& w) {
    const Tensor c = w.contiguous();
    const int64_t bytes = math::QPackedB::packed_bytes(k, n, t.int8_gemm);
    Tensor packed(DataType::UInt8, Shape{bytes},
                  Storage::heap_uninitialized(static_cast<size_t>(bytes)));
    const int64_t ld = c.dim(1);
    const math::QMatrixView v =
        transpose ? math::QMatrixView{c.raw_data(), k, n, 1, ld, is_signed}
                  : math::QMatrixView::row_major(c.raw_data(), k, n, ld, is_signed);
    math::QPackedB::pack_into(v, packed.raw_data(), t);
    packed.storage()->set_read_only();
    return packed;
  });
  out.view = math::QPackedB(out.storage->raw_data(), k, n, is_signed);
  return out;
}

void packed_product(const math::MatrixView& a, const PackedWeight& b, float* y, int64_t ldc,
                    const math::GemmOptions& o) {
  if (!b.is_int8()) {
    math::sgemm(a, b.view, y, ldc, o);
    return;
  }
  // The per-row quantizer reads each row as one contiguous run.
  std::vector<float> copy;
  const float* data = a.data;
  int64_t ld = a.rs;
  if (a.cs != 1 && a.cols > 1) {
    copy.resize(static_cast<size_t>(a.rows * a.cols));
    for (int64_t i = 0; i < a.rows; ++i) {
      for (int64_t p = 0; p < a.cols; ++p) {
        copy[static_cast<size_t>(i * a.cols + p)] = a.data[i * a.rs + p * a.cs];
      }
    }
    data = copy.data();
    ld = a.cols;
  }
  math::QGemmOutput out =
      math::QGemmOutput::to_float(y, ldc, b.col_scales, true, o.bias, o.accumulate);
  out.f_row_bias = o.row_bias;
  out.f_activation = o.activation;
  math::QGemmOptions qo;
  qo.max_threads = o.max_threads;
  math::qgemm(math::QRowFloatA{data, a.rows, a.cols, ld, o.alpha}, b.qview, out, qo);
}

}  // namespace kiln::ops

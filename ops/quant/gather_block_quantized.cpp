// com.microsoft.GatherBlockQuantized: Gather(dequantize(data), indices, gather_axis), the
// embedding lookup of int4 language models. data is block-quantized along quantize_axis in
// blocks of block_size (a power of two >= 16), one scale per block:
//
//   data  int4 / uint4 (ONNX's packed 4-bit types), or uint8 holding two 4-bit values per
//         byte (bits 4, low nibble first; the logical last axis is twice the stored one) or
//         one 8-bit value (bits 8). uint8 data needs gather_axis 0 and quantize_axis last,
//         as in onnxruntime;
//   scales  float or float16: data's logical shape with quantize_axis cut to ceil(d / block);
//   zero_points (optional) of data's type in the scales' shape (uint8 4-bit: each row of
//         the last axis packed two to a byte); without them 0 for int4, 8 for uint4 and
//         2^(bits - 1) for uint8;
//   output  the scales' type: data's logical shape with gather_axis replaced by indices'.
//
// Only the gathered rows are dequantized: each output element reads its value, its block's
// scale and zero point.
#include <string>
#include <vector>

#include "ops/core/common.h"

namespace kiln::ops {
namespace {

class GatherBlockQuantized final : public Kernel {
 public:
  explicit GatherBlockQuantized(const NodeInfo& info)
      : gather_axis_(info.attr_int("gather_axis", 0)),
        quantize_axis_(info.attr_int("quantize_axis", 1)),
        block_(info.attr_int("block_size", 128)),
        bits_(info.attr_int("bits", 4)) {
    if (bits_ != 4 && bits_ != 8) {
      info.fail("bits " + std::to_string(bits_) + " is not supported (4 or 8)",
                ErrorKind::Unsupported);
    }
    if (block_ < 16 || (block_ & (block_ - 1)) != 0) {
      info.fail("block_size " + std::to_string(block_) + " must be a power of two >= 16");
    }
  }

  void run(OpContext& ctx) override {
    const Tensor& data = ctx.input(0);
    const Tensor& indices = ctx.input(1);
    const Tensor& scales = ctx.input(2);
    const Source src = source(ctx, data);
    const int64_t rank = static_cast<int64_t>(src.shape.size());
    const int64_t g = axis(ctx, gather_axis_, rank, "gather_axis");
    const int64_t qa = axis(ctx, quantize_axis_, rank, "quantize_axis");
    if (data.dtype() == DataType::UInt8 && (g != 0 || qa != rank - 1)) {
      ctx.fail("uint8 data needs gather_axis 0 and quantize_axis last", ErrorKind::Unsupported);
    }
    Shape scale_shape = src.shape;
    scale_shape[static_cast<size_t>(qa)] =
        (src.shape[static_cast<size_t>(qa)] + block_ - 1) / block_;
    if (scales.shape() != scale_shape ||
        (scales.dtype() != DataType::Float && scales.dtype() != DataType::Float16)) {
      ctx.fail("scales " + scales.describe() + " must be float or float16 of shape " +
               shape_to_string(scale_shape));
    }
    const Zeros zeros = zero_points(ctx, data, scale_shape);
    if (indices.dtype() != DataType::Int32 && indices.dtype() != DataType::Int64) {
      ctx.fail("indices " + indices.describe() + " must be int32 or int64");
    }
    const std::vector<int64_t> idx = to_int64s(indices);
    const int64_t count = src.shape[static_cast<size_t>(g)];
    Shape out_shape(src.shape.begin(), src.shape.begin() + g);
    out_shape.insert(out_shape.end(), indices.shape().begin(), indices.shape().end());
    out_shape.insert(out_shape.end(), src.shape.begin() + g + 1, src.shape.end());
    Tensor& y = ctx.output(0, scales.dtype(), out_shape);

    // data (logical) as [outer, count, inner]; the quantized axis as [.., qdim, qstride].
    int64_t outer = 1, inner = 1, qstride = 1;
    for (int64_t i = 0; i < g; ++i) outer *= src.shape[static_cast<size_t>(i)];
    for (int64_t i = g + 1; i < rank; ++i) inner *= src.shape[static_cast<size_t>(i)];
    for (int64_t i = qa + 1; i < rank; ++i) qstride *= src.shape[static_cast<size_t>(i)];
    const int64_t qdim = src.shape[static_cast<size_t>(qa)];
    const int64_t qblocks = scale_shape[static_cast<size_t>(qa)];
    // Only the gathered rows' scales are read (an embedding's are many).
    const auto scale = [&scales](int64_t i) {
      return scales.dtype() == DataType::Float
                 ? scales.data<const float>()[i]
                 : static_cast<float>(scales.data<const float16>()[i]);
    };
    const int64_t n_idx = static_cast<int64_t>(idx.size());
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t t = 0; t < n_idx; ++t) {
        int64_t row = idx[static_cast<size_t>(t)];
        if (row < -count || row >= count) {
          ctx.fail("index " + std::to_string(row) + " is out of range for dimension " +
                   std::to_string(count));
        }
        if (row < 0) row += count;
        const int64_t base = (o * count + row) * inner, out0 = (o * n_idx + t) * inner;
        for (int64_t i = 0; i < inner; ++i) {
          const int64_t f = base + i;
          const int64_t c = f / qstride % qdim, hi = f / (qstride * qdim);
          const int64_t sf = (hi * qblocks + c / block_) * qstride + f % qstride;
          const float v = (static_cast<float>(src.value(f)) - zeros.value(sf)) * scale(sf);
          store(y, out0 + i, v);
        }
      }
    }
  }

 private:
  // The quantized values, read by their logical flat index.
  struct Source {
    const uint8_t* bytes = nullptr;
    Shape shape;           // logical (uint8 4-bit: the last axis doubled)
    bool nibbles = false;  // two values to a byte, low nibble first
    bool is_signed = false;
    int32_t value(int64_t f) const {
      if (!nibbles) return is_signed ? static_cast<int8_t>(bytes[f]) : bytes[f];
      const int32_t v = (bytes[f / 2] >> (f % 2 * 4)) & 15;
      return is_signed && v >= 8 ? v - 16 : v;
    }
  };

  // Zero points by the scales' flat index.
  struct Zeros {
    const uint8_t* bytes = nullptr;
    float fallback = 0.0f;
    bool nibbles = false, is_signed = false;
    int64_t row = 0, row_bytes = 0;  // uint8 4-bit: each row of `row` values in row_bytes
    float value(int64_t sf) const {
      if (!bytes) return fallback;
      if (!nibbles)
        return static_cast<float>(is_signed ? static_cast<int8_t>(bytes[sf]) : bytes[sf]);
      const int64_t byte = row ? sf / row * row_bytes + sf % row / 2 : sf / 2;
      const int64_t shift = (row ? sf % row : sf) % 2 * 4;
      const int32_t v = (bytes[byte] >> shift) & 15;
      return static_cast<float>(is_signed && v >= 8 ? v - 16 : v);
    }
  };

  Source source(OpContext& ctx, const Tensor& data) const {
    Source s;
    s.shape = data.shape();
    s.bytes = reinterpret_cast<const uint8_t*>(data.raw_data());
    switch (data.dtype()) {
      case DataType::Int4:
      case DataType::UInt4:
        if (bits_ != 4) ctx.fail("4-bit data " + data.describe() + " needs bits 4");
        s.nibbles = true;
        s.is_signed = data.dtype() == DataType::Int4;
        break;
      case DataType::UInt8:
        if (data.rank() == 0) ctx.fail("data " + data.describe() + " must have a dimension");
        s.nibbles = bits_ == 4;
        if (s.nibbles) s.shape.back() *= 2;
        break;
      default:
        ctx.fail("data " + data.describe() + " must be int4, uint4 or uint8",
                 ErrorKind::Unsupported);
    }
    if (s.shape.empty()) ctx.fail("data " + data.describe() + " must have a dimension");
    return s;
  }

  Zeros zero_points(OpContext& ctx, const Tensor& data, const Shape& scale_shape) const {
    Zeros z;
    z.nibbles = bits_ == 4;
    z.is_signed = data.dtype() == DataType::Int4;
    z.fallback = data.dtype() == DataType::Int4 ? 0.0f : static_cast<float>(1 << (bits_ - 1));
    if (!ctx.has_input(3)) return z;
    const Tensor& zp = ctx.input(3);
    Shape want = scale_shape;
    if (data.dtype() == DataType::UInt8 && bits_ == 4) {
      z.row = scale_shape.back();
      z.row_bytes = (z.row + 1) / 2;
      want.back() = z.row_bytes;
    }
    if (zp.dtype() != data.dtype() || zp.shape() != want) {
      ctx.fail("zero_points " + zp.describe() + " must be " +
               std::string(data_type_name(data.dtype())) + " of shape " + shape_to_string(want));
    }
    z.bytes = reinterpret_cast<const uint8_t*>(zp.raw_data());
    return z;
  }

  static int64_t axis(OpContext& ctx, int64_t a, int64_t rank, const char* what) {
    if (a < -rank || a >= rank) {
      ctx.fail(std::string(what) + " " + std::to_string(a) + " is out of range for rank " +
               std::to_string(rank));
    }
    return a < 0 ? a + rank : a;
  }

  static void store(Tensor& y, int64_t i, float v) {
    if (y.dtype() == DataType::Float) {
      y.data<float>()[i] = v;
    } else {
      y.data<float16>()[i] = float16(v);
    }
  }

  int64_t gather_axis_, quantize_axis_, block_, bits_;
};

// The output: data's logical shape with gather_axis replaced by indices' shape, of the
// scales' type.
void gather_block_shape(ShapeContext& c) {
  Shape s = c.shape(0);
  if (s.empty()) unknown("a scalar data input");
  if (c.dtype(0) == DataType::UInt8 && c.attr_int("bits", 4) == 4 && s.back() >= 0) s.back() *= 2;
  const auto rank = static_cast<int64_t>(s.size());
  int64_t g = c.attr_int("gather_axis", 0);
  if (g < -rank || g >= rank) unknown("gather_axis out of range");
  if (g < 0) g += rank;
  const Shape& idx = c.shape(1);
  Shape out(s.begin(), s.begin() + g);
  out.insert(out.end(), idx.begin(), idx.end());
  out.insert(out.end(), s.begin() + g + 1, s.end());
  c.set(0, c.dtype(2), out);
}

}  // namespace

KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "GatherBlockQuantized",
                  .min_inputs = 3,
                  .max_inputs = 4,
                  .types = "float, float16 (data: int4, uint4, uint8)",
                  .shape = gather_block_shape,
                  .create = make<GatherBlockQuantized>});

}  // namespace kiln::ops

// The recurrent ops' weights (ops/rnn/rnn.cpp): float W and R packed for the GEMM layer, and
// DynamicQuantizeLSTM's 8-bit ones packed for the int8 GEMM layer with their products.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/tensor.h"
#include "ops/math/gemm.h"
#include "ops/math/qgemm.h"

namespace kiln::ops::rnn {

// A [dirs, rows, k] weight (W or R) packed for the GEMM as the right operand: per direction
// its transpose [k x rows] in column segments, one after another. GRU's R has two segments,
// the z and r gates [0, 2h) and the candidate [2h, 3h) (whose product is taken apart, after
// the reset gate); every other weight one.
struct WeightLayout {
  int64_t dirs = 0, rows = 0, k = 0;
  bool split = false;
  int nr = 0;

  // Columns of segment `i` of a direction.
  int64_t begin(int i) const { return i == 0 ? 0 : rows - k; }
  int64_t end(int i) const { return split && i == 0 ? rows - k : rows; }
  int segments() const { return split ? 2 : 1; }
  int64_t segment_floats(int i) const {
    return math::PackedB::packed_floats(k, end(i) - begin(i), nr);
  }
  int64_t direction_floats() const {
    int64_t f = 0;
    for (int i = 0; i < segments(); ++i) f += segment_floats(i);
    return f;
  }
  // Segment `i` of direction `d` in the packed form at `data`.
  math::PackedB segment(const float* data, int64_t d, int i) const {
    const float* p = data + d * direction_floats() + (i == 1 ? segment_floats(0) : 0);
    return math::PackedB(p, k, end(i) - begin(i), nr);
  }
};

WeightLayout layout_of(const Tensor& w, bool split);

// The packed form of a float, float16 or bfloat16 weight (half ones widened as they are
// packed).
Tensor pack_weight(const Tensor& w, bool split);

// The weights cache's name for pack_weight's layout (the level decides the tile width).
std::string packing_name(bool split);

// DynamicQuantizeLSTM's packed 8-bit weight of one direction (W or R, k x 4H) with its scales
// (one or 4H) and zero points (one or 4H).
struct QuantWeight {
  math::QPackedB packed;
  const float* scales = nullptr;
  bool per_column = false;
  std::vector<int32_t> zeros;  // one, or one per column
};

// The bytes of one direction of a [dirs, k, n] 8-bit weight packed for the active level.
int64_t qweight_bytes(const Tensor& w);

// A [dirs, k, n] 8-bit weight packed per direction, one after another.
Tensor pack_qweight(const Tensor& w);

std::string qpacking_name();

// dst [rows x n] (row stride ld) (+)= quantize(src [rows x k]) * w, scaled back to float (plus
// `bias` per column when given): one product of DynamicQuantizeLSTM.
void quantized_product(const float* src, int64_t rows, int64_t k, const QuantWeight& w, float* dst,
                       int64_t ld, const float* bias, bool accumulate, int max_threads);

}  // namespace kiln::ops::rnn

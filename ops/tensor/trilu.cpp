// Trilu: keeps the upper (j >= i + k) or lower (j <= i + k) triangle of the last two dims
// and zeroes the rest. Works row by row on bytes; when the input may be overwritten only
// the dropped parts are written.
#include <algorithm>
#include <cstring>
#include <string>

#include "ops/core/common.h"

namespace kiln::ops {
namespace {

class Trilu final : public Kernel {
 public:
  explicit Trilu(const NodeInfo& info) : upper_(info.attr_int("upper", 1) != 0) {}

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    if (x.rank() < 2) ctx.fail("input must have rank >= 2, got " + x.describe());
    if (x.dtype() != DataType::String && bits_per_element(x.dtype()) < 8) {
      throw_unsupported_type(x.dtype(), "Trilu input");
    }
    int64_t k = 0;
    if (ctx.has_input(1)) {
      const std::vector<int64_t> kv = to_int64s(ctx.input(1));
      if (kv.size() != 1) ctx.fail("k must be a single value");
      k = kv[0];
    }
    const int64_t rows = x.dim(x.rank() - 2), cols = x.dim(x.rank() - 1);
    // Beyond +-(rows + cols) every k behaves the same; clamping keeps i + k in range.
    k = std::clamp(k, -(rows + cols), rows + cols);
    Tensor& y = ctx.output_reusing(0, 0, x.dtype(), x.shape());
    const bool in_place = y.raw_data() == x.raw_data();
    const int64_t total_rows = cols == 0 ? 0 : x.numel() / cols;
    // Kept columns [lo, hi) of row r.
    auto kept = [&](int64_t r, int64_t* lo, int64_t* hi) {
      const int64_t i = r % rows;
      *lo = upper_ ? std::clamp<int64_t>(i + k, 0, cols) : 0;
      *hi = upper_ ? cols : std::clamp<int64_t>(i + k + 1, 0, cols);
      if (*hi < *lo) *hi = *lo;
    };
    if (x.dtype() == DataType::String) {
      const std::string* src = x.data<const std::string>();
      std::string* dst = y.data<std::string>();
      for (int64_t r = 0; r < total_rows; ++r) {
        int64_t lo = 0, hi = 0;
        kept(r, &lo, &hi);
        for (int64_t j = 0; j < cols; ++j) {
          if (j < lo || j >= hi) {
            dst[r * cols + j].clear();
          } else if (!in_place) {
            dst[r * cols + j] = src[r * cols + j];
          }
        }
      }
      return;
    }
    const auto es = static_cast<size_t>(bits_per_element(x.dtype()) / 8);
    const auto row_bytes = static_cast<size_t>(cols) * es;
    const std::byte* src = x.raw_data();
    std::byte* dst = y.raw_data();
    parallel_for(total_rows, grain_for(static_cast<int64_t>(row_bytes)), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        int64_t lo = 0, hi = 0;
        kept(r, &lo, &hi);
        std::byte* out = dst + static_cast<size_t>(r) * row_bytes;
        const std::byte* in = src + static_cast<size_t>(r) * row_bytes;
        std::memset(out, 0, static_cast<size_t>(lo) * es);
        if (!in_place) {
          std::memcpy(out + lo * es, in + lo * es, static_cast<size_t>(hi - lo) * es);
        }
        std::memset(out + hi * es, 0, static_cast<size_t>(cols - hi) * es);
      }
    });
    if (!in_place) ctx.count_copy(y.nbytes());
  }

 private:
  bool upper_;
};

}  // namespace

KILN_REGISTER_OP({.op = "Trilu",
                  .since = 14,
                  .min_inputs = 1,
                  .max_inputs = 2,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .in_place = inputs(0),
                  .types = "all types but sub-byte ones",
                  .shape = same_shape,
                  .create = make<Trilu>});

}  // namespace kiln::ops

// RoiAlign (opset 10+): pools each region of interest of an NCHW feature map into an
// output_height x output_width grid, averaging (or taking the max of) bilinear samples in
// each bin. The sample positions and weights depend only on the roi, so they are computed
// once per roi and shared by all channels.
#include <algorithm>
#include <cmath>
#include <string>

#include "ops/core/common.h"

namespace kiln::ops {
namespace {

// A sample position along one axis: the two neighbouring pixels and their weights. Samples
// are separable (a bin's y positions do not depend on x), so each roi stores them per axis.
struct AxisSample {
  int64_t lo = 0, hi = 0;
  double w_lo = 0, w_hi = 0;
  bool valid = false;  // outside [-1, size]: the sample counts as zero
};

class RoiAlign final : public Kernel {
 public:
  explicit RoiAlign(const NodeInfo& info)
      : out_h_(info.attr_int("output_height", 1)),
        out_w_(info.attr_int("output_width", 1)),
        sampling_ratio_(info.attr_int("sampling_ratio", 0)),
        spatial_scale_(info.attr_float("spatial_scale", 1.0f)) {
    const std::string mode = info.attr_string("mode", "avg");
    if (mode == "avg") {
      max_ = false;
    } else if (mode == "max") {
      max_ = true;
    } else {
      info.fail("unknown mode '" + mode + "'", ErrorKind::Unsupported);
    }
    // Before opset 16 the roi corners were not shifted by half a pixel.
    const std::string coord = info.attr_string(
        "coordinate_transformation_mode", info.opset() >= 16 ? "half_pixel" : "output_half_pixel");
    if (coord == "half_pixel") {
      half_pixel_ = true;
    } else if (coord == "output_half_pixel") {
      half_pixel_ = false;
    } else {
      info.fail("unknown coordinate_transformation_mode '" + coord + "'", ErrorKind::Unsupported);
    }
    if (out_h_ < 1 || out_w_ < 1) info.fail("output_height and output_width must be >= 1");
    if (out_h_ > (int64_t{1} << 20) || out_w_ > (int64_t{1} << 20)) info.fail("output too large");
    if (sampling_ratio_ < 0 || sampling_ratio_ > 65536)
      info.fail("sampling_ratio must be in [0, 65536]");
    if (!std::isfinite(spatial_scale_)) info.fail("spatial_scale must be finite");
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& rois = ctx.input(1);
    const std::vector<int64_t> batch = to_int64s(ctx.input(2));
    if (x.rank() != 4) ctx.fail("X must be 4-D (N, C, H, W), got " + x.describe());
    if (rois.rank() != 2 || rois.dim(1) != 4)
      ctx.fail("rois must be (num_rois, 4), got " + rois.describe());
    if (rois.dtype() != x.dtype()) ctx.fail("rois must have the type of X");
    const int64_t num_rois = rois.dim(0);
    if (static_cast<int64_t>(batch.size()) != num_rois) {
      ctx.fail("batch_indices has " + std::to_string(batch.size()) + " values for " +
               std::to_string(num_rois) + " rois");
    }
    const int64_t n = x.dim(0), channels = x.dim(1), height = x.dim(2), width = x.dim(3);
    for (int64_t b : batch) {
      if (b < 0 || b >= n) ctx.fail("batch index " + std::to_string(b) + " is out of range");
    }
    Tensor& y = ctx.output(0, x.dtype(), {num_rois, channels, out_h_, out_w_});
    if (y.numel() == 0) return;
    if (height == 0 || width == 0) ctx.fail("X has an empty spatial dimension");

    dispatch(FloatTypes{}, x.dtype(), [&]<typename T>() {
      const T* box = rois.data<const T>();
      const T* src = x.data<const T>();
      T* dst = y.data<T>();
      const int64_t bins = out_h_ * out_w_, plane = height * width;
      for (int64_t r = 0; r < num_rois; ++r) {
        std::vector<AxisSample> ys, xs;
        int64_t gh = 0, gw = 0;
        roi_samples(ctx, value(box[r * 4]), value(box[r * 4 + 1]), value(box[r * 4 + 2]),
                    value(box[r * 4 + 3]), height, width, &ys, &xs, &gh, &gw);
        const double count = static_cast<double>(std::max<int64_t>(gh * gw, 1));
        parallel_for(channels, grain_for(bins * gh * gw * 4), [&](int64_t c0, int64_t c1) {
          for (int64_t c = c0; c < c1; ++c) {
            const T* img = src + (batch[static_cast<size_t>(r)] * channels + c) * plane;
            T* out = dst + (r * channels + c) * bins;
            for (int64_t ph = 0; ph < out_h_; ++ph) {
              for (int64_t pw = 0; pw < out_w_; ++pw) {
                double acc = 0;
                bool first = true;
                for (int64_t iy = 0; iy < gh; ++iy) {
                  const AxisSample& sy = ys[static_cast<size_t>(ph * gh + iy)];
                  for (int64_t ix = 0; ix < gw; ++ix) {
                    const AxisSample& sx = xs[static_cast<size_t>(pw * gw + ix)];
                    double v = 0;
                    if (sy.valid && sx.valid) {
                      const T* r0 = img + sy.lo * width;
                      const T* r1 = img + sy.hi * width;
                      const double p[4] = {sy.w_lo * sx.w_lo * value(r0[sx.lo]),
                                           sy.w_lo * sx.w_hi * value(r0[sx.hi]),
                                           sy.w_hi * sx.w_lo * value(r1[sx.lo]),
                                           sy.w_hi * sx.w_hi * value(r1[sx.hi])};
                      v = max_ ? std::max(std::max(p[0], p[1]), std::max(p[2], p[3]))
                               : p[0] + p[1] + p[2] + p[3];
                    }
                    if (max_) {
                      acc = first ? v : std::max(acc, v);
                      first = false;
                    } else {
                      acc += v;
                    }
                  }
                }
                if (!max_) acc /= count;
                out[ph * out_w_ + pw] = from_compute<T>(static_cast<compute_t<T>>(acc));
              }
            }
          }
        });
      }
    });
  }

 private:
  template <typename T>
  static double value(T v) {
    return static_cast<double>(static_cast<compute_t<T>>(v));
  }

  // Sample positions along one axis: `bins` bins of `grid` samples from `start`.
  static std::vector<AxisSample> axis_samples(double start, double bin, int64_t bins, int64_t grid,
                                              int64_t size) {
    std::vector<AxisSample> out(static_cast<size_t>(bins * grid));
    const double fsize = static_cast<double>(size);
    for (int64_t b = 0; b < bins; ++b) {
      for (int64_t i = 0; i < grid; ++i) {
        AxisSample& s = out[static_cast<size_t>(b * grid + i)];
        double v = start + static_cast<double>(b) * bin +
                   (static_cast<double>(i) + 0.5) * bin / static_cast<double>(grid);
        if (v < -1.0 || v > fsize) continue;
        v = std::max(v, 0.0);
        s.lo = static_cast<int64_t>(v);
        s.hi = s.lo + 1;
        if (s.lo >= size - 1) {
          s.lo = s.hi = size - 1;
          v = static_cast<double>(s.lo);
        }
        s.w_hi = v - static_cast<double>(s.lo);
        s.w_lo = 1 - s.w_hi;
        s.valid = true;
      }
    }
    return out;
  }

  void roi_samples(const OpContext& ctx, double x0, double y0, double x1, double y1, int64_t height,
                   int64_t width, std::vector<AxisSample>* ys, std::vector<AxisSample>* xs,
                   int64_t* gh, int64_t* gw) const {
    const double offset = half_pixel_ ? 0.5 : 0.0;
    const double start_w = x0 * spatial_scale_ - offset;
    const double start_h = y0 * spatial_scale_ - offset;
    double roi_w = x1 * spatial_scale_ - offset - start_w;
    double roi_h = y1 * spatial_scale_ - offset - start_h;
    if (!half_pixel_) {
      roi_w = std::max(roi_w, 1.0);  // malformed rois become 1x1
      roi_h = std::max(roi_h, 1.0);
    }
    if (!std::isfinite(roi_w) || !std::isfinite(roi_h) || !std::isfinite(start_w) ||
        !std::isfinite(start_h)) {
      ctx.fail("roi coordinates must be finite");
    }
    const double bin_h = roi_h / static_cast<double>(out_h_);
    const double bin_w = roi_w / static_cast<double>(out_w_);
    // Adaptive sampling takes about one sample per input pixel of the bin.
    auto grid = [&](double bin) {
      if (sampling_ratio_ > 0) return sampling_ratio_;
      const double v = std::ceil(bin);
      if (v > 65536.0) ctx.fail("roi too large for adaptive sampling");
      return static_cast<int64_t>(std::max(v, 0.0));
    };
    *gh = grid(bin_h);
    *gw = grid(bin_w);
    *ys = axis_samples(start_h, bin_h, out_h_, *gh, height);
    *xs = axis_samples(start_w, bin_w, out_w_, *gw, width);
  }

  int64_t out_h_, out_w_, sampling_ratio_;
  double spatial_scale_;
  bool max_ = false;
  bool half_pixel_ = true;
};

// [num_rois, C, output_height, output_width].
void roi_align_shape(ShapeContext& c) {
  const Shape& x = c.shape(0);
  const Shape& rois = c.shape(1);
  const int64_t h = c.attr_int("output_height", 1), w = c.attr_int("output_width", 1);
  if (x.size() != 4 || rois.size() != 2 || rois[1] != 4 || c.dtype(1) != c.dtype(0) ||
      c.shape(2) != Shape{rois[0]} || h < 1 || w < 1) {
    unknown("X, rois and batch_indices do not fit");
  }
  c.set(0, c.dtype(0), {rois[0], x[1], h, w});
}

}  // namespace

KILN_REGISTER_OP({.op = "RoiAlign",
                  .since = 10,
                  .min_inputs = 3,
                  .max_inputs = 3,
                  .types = "float, double, float16, bfloat16",
                  .shape = roi_align_shape,
                  .create = make<RoiAlign>});

}  // namespace kiln::ops

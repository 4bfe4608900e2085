// DFT and STFT. Signals are [batch, n..., 1] (real) or [batch, n..., 2] (complex); the
// transform runs over one signal axis in double precision with math::Fft (O(n log n) for
// every length).
#include <bit>
#include <cmath>
#include <complex>
#include <numbers>
#include <string>
#include <vector>

#include "engine/util/fft.h"
#include "ops/core/common.h"

namespace kiln::ops {
namespace {

using cd = std::complex<double>;
using math::Fft;

// Transforms longer than this are refused: their scratch buffers would not be realistic.
constexpr int64_t kMaxFftLength = int64_t{1} << 24;

// Reads and writes complex samples of one element type; the transforms themselves are not
// templates. Sample k of a line is at element offset + k * stride, with `comps` (1 or 2)
// consecutive components.
struct LineIo {
  void (*gather)(const void* base, int64_t offset, int64_t stride, int64_t count, int comps,
                 cd* out);
  void (*scatter)(void* base, int64_t offset, int64_t stride, int64_t count, int comps,
                  const cd* in);
};

template <typename T>
LineIo line_io() {
  return {[](const void* base, int64_t offset, int64_t stride, int64_t count, int comps, cd* out) {
            const T* p = static_cast<const T*>(base) + offset;
            for (int64_t k = 0; k < count; ++k, p += stride) {
              const double re = static_cast<double>(static_cast<compute_t<T>>(p[0]));
              const double im =
                  comps == 2 ? static_cast<double>(static_cast<compute_t<T>>(p[1])) : 0;
              out[k] = cd(re, im);
            }
          },
          [](void* base, int64_t offset, int64_t stride, int64_t count, int comps, const cd* in) {
            T* p = static_cast<T*>(base) + offset;
            for (int64_t k = 0; k < count; ++k, p += stride) {
              p[0] = from_compute<T>(static_cast<compute_t<T>>(in[k].real()));
              if (comps == 2) p[1] = from_compute<T>(static_cast<compute_t<T>>(in[k].imag()));
            }
          }};
}

LineIo line_io_for(DataType dt) {
  LineIo io{};
  dispatch(FloatTypes{}, dt, [&]<typename T>() { io = line_io<T>(); });
  return io;
}

int64_t scalar_int(const OpContext& ctx, const Tensor& t, const char* what) {
  if (t.numel() != 1) ctx.fail(std::string(what) + " must hold one value, got " + t.describe());
  return to_int64s(t)[0];
}

class Dft final : public Kernel {
 public:
  explicit Dft(const NodeInfo& info)
      : axis_(info.attr_int("axis", 1)),
        inverse_(info.attr_int("inverse", 0) != 0),
        onesided_(info.attr_int("onesided", 0) != 0) {}

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const int64_t r = static_cast<int64_t>(x.rank());
    if (r < 2 || (x.dim(r - 1) != 1 && x.dim(r - 1) != 2)) {
      ctx.fail("input must be [..., 1] (real) or [..., 2] (complex), got " + x.describe());
    }
    int64_t axis = axis_;
    if (ctx.opset() >= 20) axis = ctx.has_input(2) ? scalar_int(ctx, ctx.input(2), "axis") : -2;
    if (axis < 0) axis += r;
    if (axis < 0 || axis > r - 2) {
      ctx.fail("axis " + std::to_string(axis) + " is not a signal axis of " + x.describe());
    }
    const int64_t n_in = x.dim(static_cast<size_t>(axis));
    const bool irfft = inverse_ && onesided_;
    int64_t len = irfft ? 2 * (n_in - 1) : n_in;
    if (ctx.has_input(1)) len = scalar_int(ctx, ctx.input(1), "dft_length");
    if (len < 1 || len > kMaxFftLength) {
      ctx.fail("dft_length must be in [1, 2^24], got " + std::to_string(len));
    }
    const int64_t n_out = (onesided_ && !inverse_) ? len / 2 + 1 : len;
    const int comps_in = static_cast<int>(x.dim(static_cast<size_t>(r - 1)));
    const int comps_out = irfft ? 1 : 2;

    Shape out_shape = x.shape();
    out_shape[static_cast<size_t>(axis)] = n_out;
    out_shape.back() = comps_out;
    Tensor& y = ctx.output(0, x.dtype(), out_shape);
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= x.dim(static_cast<size_t>(d));
    for (int64_t d = axis + 1; d < r - 1; ++d) inner *= x.dim(static_cast<size_t>(d));
    const int64_t lines = outer * inner;
    if (lines == 0) return;

    const LineIo io = line_io_for(x.dtype());
    const Fft fft(len);
    // For the inverse of a one-sided spectrum, the bins up to len/2 are read and the rest
    // rebuilt by conjugate symmetry; otherwise the signal is cut or zero-padded to len.
    const int64_t n_read = std::min(n_in, irfft ? len / 2 + 1 : len);
    const double scale = inverse_ ? 1.0 / static_cast<double>(len) : 1.0;
    const void* src = x.raw_data();
    void* dst = y.raw_data();
    const int64_t cost = len * std::bit_width(static_cast<uint64_t>(len)) * 8;
    parallel_for(lines, grain_for(cost), [&](int64_t begin, int64_t end) {
      std::vector<cd> buf(static_cast<size_t>(len)),
          scratch(static_cast<size_t>(fft.scratch_size()));
      for (int64_t line = begin; line < end; ++line) {
        const int64_t o = line / inner, i = line % inner;
        std::fill(buf.begin(), buf.end(), cd(0, 0));
        io.gather(src, (o * n_in * inner + i) * comps_in, inner * comps_in, n_read, comps_in,
                  buf.data());
        if (irfft) {
          buf[0].imag(0);
          if (len % 2 == 0) buf[static_cast<size_t>(len / 2)].imag(0);
          for (int64_t k = 1; k < (len + 1) / 2; ++k) {
            buf[static_cast<size_t>(len - k)] = std::conj(buf[static_cast<size_t>(k)]);
          }
        }
        fft.run(buf.data(), scratch.data(), inverse_);
        if (inverse_) {
          for (cd& v : buf) v *= scale;
        }
        io.scatter(dst, (o * n_out * inner + i) * comps_out, inner * comps_out, n_out, comps_out,
                   buf.data());
      }
    });
  }

 private:
  int64_t axis_;
  bool inverse_, onesided_;
};

class Stft final : public Kernel {
 public:
  explicit Stft(const NodeInfo& info) : onesided_(info.attr_int("onesided", 1) != 0) {}

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    if (x.rank() != 3 || (x.dim(2) != 1 && x.dim(2) != 2)) {
      ctx.fail("signal must be [batch, length, 1 or 2], got " + x.describe());
    }
    const int64_t step = scalar_int(ctx, ctx.input(1), "frame_step");
    if (step < 1) ctx.fail("frame_step must be positive, got " + std::to_string(step));
    const Tensor* window = ctx.has_input(2) ? &ctx.input(2) : nullptr;
    const int64_t n = x.dim(1);
    int64_t frame = n;
    if (window) {
      if (window->rank() != 1) ctx.fail("window must be 1-D, got " + window->describe());
      if (window->dtype() != x.dtype()) ctx.fail("window and signal types differ");
      frame = window->dim(0);
    }
    if (ctx.has_input(3)) {
      frame = scalar_int(ctx, ctx.input(3), "frame_length");
      if (window && window->dim(0) != frame) {
        ctx.fail("window length " + std::to_string(window->dim(0)) + " != frame_length " +
                 std::to_string(frame));
      }
    }
    if (frame < 1 || frame > n || frame > kMaxFftLength) {
      ctx.fail("frame_length " + std::to_string(frame) + " must be in [1, signal length " +
               std::to_string(n) + "]");
    }
    const int64_t frames = (n - frame) / step + 1;
    const int64_t bins = onesided_ ? frame / 2 + 1 : frame;
    const int64_t batch = x.dim(0);
    const int comps = static_cast<int>(x.dim(2));
    Tensor& y = ctx.output(0, x.dtype(), {batch, frames, bins, 2});
    if (batch == 0) return;

    const LineIo io = line_io_for(x.dtype());
    std::vector<cd> w(static_cast<size_t>(frame), cd(1, 0));
    if (window) io.gather(window->raw_data(), 0, 1, frame, 1, w.data());
    const Fft fft(frame);
    const void* src = x.raw_data();
    void* dst = y.raw_data();
    parallel_for(batch * frames, grain_for(frame * 64), [&](int64_t begin, int64_t end) {
      std::vector<cd> buf(static_cast<size_t>(frame)),
          scratch(static_cast<size_t>(fft.scratch_size()));
      for (int64_t t = begin; t < end; ++t) {
        const int64_t b = t / frames, f = t % frames;
        io.gather(src, (b * n + f * step) * comps, comps, frame, comps, buf.data());
        for (int64_t k = 0; k < frame; ++k)
          buf[static_cast<size_t>(k)] *= w[static_cast<size_t>(k)].real();
        fft.run(buf.data(), scratch.data(), false);
        io.scatter(dst, t * bins * 2, 2, bins, 2, buf.data());
      }
    });
  }

 private:
  bool onesided_;
};

// A one-value integer input of a shape rule.
int64_t scalar_of(const ShapeContext& c, size_t i) {
  const std::vector<int64_t>& v = c.data(i);
  if (v.size() != 1) unknown("input " + std::to_string(i) + " must hold one value");
  return v[0];
}

// The input's shape with dft_length (or its one-sided half) along the axis and 1 (inverse
// one-sided) or 2 components.
void dft_shape(ShapeContext& c) {
  Shape out = c.shape(0);
  const auto r = static_cast<int64_t>(out.size());
  if (r < 2 || (out.back() != 1 && out.back() != 2)) unknown("input must be [..., 1 or 2]");
  int64_t axis = c.attr_int("axis", 1);
  if (c.opset() >= 20) axis = c.has_input(2) ? scalar_of(c, 2) : -2;
  if (axis < 0) axis += r;
  if (axis < 0 || axis > r - 2) unknown("axis is not a signal axis");
  const bool inverse = c.attr_int("inverse", 0) != 0, onesided = c.attr_int("onesided", 0) != 0;
  const int64_t n_in = out[static_cast<size_t>(axis)];
  int64_t len = inverse && onesided ? 2 * (n_in - 1) : n_in;
  if (c.has_input(1)) len = scalar_of(c, 1);
  if (len < 1 || len > kMaxFftLength) unknown("dft_length out of range");
  out[static_cast<size_t>(axis)] = onesided && !inverse ? len / 2 + 1 : len;
  out.back() = inverse && onesided ? 1 : 2;
  c.set(0, c.dtype(0), out);
}

// [batch, frames, bins, 2].
void stft_shape(ShapeContext& c) {
  const Shape& x = c.shape(0);
  if (x.size() != 3 || (x[2] != 1 && x[2] != 2)) unknown("signal must be [batch, length, 1 or 2]");
  const int64_t step = scalar_of(c, 1), n = x[1];
  if (step < 1) unknown("frame_step must be positive");
  int64_t frame = n;
  if (c.has_input(2)) {
    if (c.shape(2).size() != 1 || c.dtype(2) != c.dtype(0)) unknown("window does not fit");
    frame = c.shape(2)[0];
  }
  if (c.has_input(3)) {
    const int64_t length = scalar_of(c, 3);
    if (c.has_input(2) && length != frame) unknown("window length differs from frame_length");
    frame = length;
  }
  if (frame < 1 || frame > n || frame > kMaxFftLength) unknown("frame_length out of range");
  const int64_t bins = c.attr_int("onesided", 1) != 0 ? frame / 2 + 1 : frame;
  c.set(0, c.dtype(0), {x[0], (n - frame) / step + 1, bins, 2});
}

}  // namespace

KILN_REGISTER_OP({.op = "DFT",
                  .since = 17,
                  .min_inputs = 1,
                  .max_inputs = 3,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "float, double, float16, bfloat16",
                  .shape = dft_shape,
                  .create = make<Dft>});
KILN_REGISTER_OP({.op = "STFT",
                  .since = 17,
                  .min_inputs = 2,
                  .max_inputs = 4,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "float, double, float16, bfloat16",
                  .shape = stft_shape,
                  .create = make<Stft>});

}  // namespace kiln::ops

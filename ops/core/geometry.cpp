#include "ops/core/geometry.h"

#include <algorithm>

#include "engine/ir/graph.h"
#include "kiln/error.h"

namespace kiln::ops {
namespace {

[[noreturn]] void fail(ErrorKind kind, const std::string& message) {
  throw Error(kind, message);
}

std::string axis_text(size_t d) {
  return "spatial axis " + std::to_string(d);
}

const ir::Attribute* find_attr(const ir::Node& node, const char* name, ir::AttrKind kind) {
  const ir::Attribute* a = node.attr(name);
  if (a && a->kind != kind) {
    fail(ErrorKind::InvalidModel, std::string("attribute '") + name + "' has the wrong type");
  }
  return a;
}

std::vector<int64_t> ints_attr(const ir::Node& node, const char* name) {
  const ir::Attribute* a = find_attr(node, name, ir::AttrKind::Ints);
  return a ? a->ints : std::vector<int64_t>{};
}

void check_range(const std::vector<int64_t>& values, int64_t lo, const char* name) {
  for (int64_t v : values) {
    if (v < lo || v > kMaxWindowAttr) {
      fail(ErrorKind::InvalidModel, std::string(name) + " must be in [" + std::to_string(lo) +
                                        ", 2^31], got " + std::to_string(v));
    }
  }
}

// values[d], or `fallback` when the attribute is absent.
int64_t at(const std::vector<int64_t>& values, size_t d, int64_t fallback) {
  return values.empty() ? fallback : values[d];
}

// The spatial sizes output_shape asks for (it may list the whole output shape).
std::vector<int64_t> spatial_output_shape(const WindowAttrs& a, size_t rank) {
  std::vector<int64_t> s = a.output_shape;
  if (s.size() == rank + 2) s.erase(s.begin(), s.begin() + 2);
  return s;
}

// Checks the sizes common to both directions and starts an axis with them.
WindowAxis start_axis(const WindowAttrs& a, std::span<const int64_t> in,
                      std::span<const int64_t> kernel, size_t d) {
  WindowAxis w;
  w.in = in[d];
  w.kernel = kernel[d];
  if (w.in < 0 || w.in > kMaxWindowElements) {
    fail(ErrorKind::Runtime,
         "input size " + std::to_string(w.in) + " on " + axis_text(d) + " must be in [0, 2^48]");
  }
  if (w.kernel < 1 || w.kernel > kMaxWindowAttr) {
    fail(ErrorKind::Runtime, "kernel size " + std::to_string(w.kernel) + " on " + axis_text(d) +
                                 " must be in [1, 2^31]");
  }
  w.stride = at(a.strides, d, 1);
  w.dilation = at(a.dilations, d, 1);
  return w;
}

void check_axes(const WindowAttrs& a, std::span<const int64_t> in,
                std::span<const int64_t> kernel) {
  check_window_attrs(a);
  check_window_ranks(a, in.size());
  if (kernel.size() != in.size()) {
    fail(ErrorKind::Runtime, "the kernel has " + std::to_string(kernel.size()) +
                                 " axes, the input " + std::to_string(in.size()) + " spatial axes");
  }
}

void check_output_size(int64_t out, size_t d) {
  if (out < 0) {
    fail(ErrorKind::Runtime,
         "the output size on " + axis_text(d) + " would be negative (" + std::to_string(out) + ")");
  }
  if (out > kMaxWindowElements) {
    fail(ErrorKind::Runtime,
         "the output size on " + axis_text(d) + " would be " + std::to_string(out) + ", over 2^48");
  }
}

// a * b + c, or an error when it leaves int64.
int64_t checked_mul_add(int64_t a, int64_t b, int64_t c, size_t d) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r) || __builtin_add_overflow(r, c, &r)) {
    fail(ErrorKind::Runtime, "the output size on " + axis_text(d) + " overflows");
  }
  return r;
}

// floor(v / 2), also for negative v.
int64_t floor_half(int64_t v) {
  return v >= 0 ? v / 2 : -((1 - v) / 2);
}

}  // namespace

AutoPad parse_auto_pad(const std::string& text) {
  if (text == "NOTSET") return AutoPad::NotSet;
  if (text == "SAME_UPPER") return AutoPad::SameUpper;
  if (text == "SAME_LOWER") return AutoPad::SameLower;
  if (text == "VALID") return AutoPad::Valid;
  fail(ErrorKind::InvalidModel, "unknown auto_pad '" + text + "'");
}

WindowAttrs window_attrs(const ir::Node& node) {
  WindowAttrs a;
  if (const ir::Attribute* p = find_attr(node, "auto_pad", ir::AttrKind::String)) {
    a.auto_pad = parse_auto_pad(p->s);
  }
  a.kernel_shape = ints_attr(node, "kernel_shape");
  a.strides = ints_attr(node, "strides");
  a.dilations = ints_attr(node, "dilations");
  a.pads = ints_attr(node, "pads");
  if (const ir::Attribute* c = find_attr(node, "ceil_mode", ir::AttrKind::Int)) {
    a.ceil_mode = c->i != 0;
  }
  a.output_padding = ints_attr(node, "output_padding");
  a.output_shape = ints_attr(node, "output_shape");
  check_window_attrs(a);
  return a;
}

void check_window_attrs(const WindowAttrs& a) {
  check_range(a.kernel_shape, 1, "kernel_shape");
  check_range(a.strides, 1, "strides");
  check_range(a.dilations, 1, "dilations");
  check_range(a.pads, 0, "pads");
  check_range(a.output_padding, 0, "output_padding");
  check_range(a.output_shape, 0, "output_shape");
}

void check_window_ranks(const WindowAttrs& a, size_t rank) {
  auto need = [&](const std::vector<int64_t>& v, size_t n, const char* name) {
    if (!v.empty() && v.size() != n) {
      fail(ErrorKind::InvalidModel, std::string(name) + " has " + std::to_string(v.size()) +
                                        " values, expected " + std::to_string(n) + " for " +
                                        std::to_string(rank) + " spatial axes");
    }
  };
  need(a.kernel_shape, rank, "kernel_shape");
  need(a.strides, rank, "strides");
  need(a.dilations, rank, "dilations");
  need(a.pads, 2 * rank, "pads");
  need(a.output_padding, rank, "output_padding");
  if (a.output_shape.size() != rank + 2) need(a.output_shape, rank, "output_shape");
}

std::vector<int64_t> conv_kernel(const WindowAttrs& a, std::span<const int64_t> weight_spatial) {
  const std::vector<int64_t> kernel(weight_spatial.begin(), weight_spatial.end());
  for (int64_t k : kernel) {
    if (k < 1 || k > kMaxWindowAttr) {
      fail(ErrorKind::Runtime,
           "the weight's kernel " + shape_to_string(kernel) + " must have sizes in [1, 2^31]");
    }
  }
  if (!a.kernel_shape.empty() && a.kernel_shape != kernel) {
    fail(ErrorKind::Runtime, "kernel_shape " + shape_to_string(a.kernel_shape) +
                                 " does not match the weight's kernel " + shape_to_string(kernel));
  }
  return kernel;
}

std::vector<WindowAxis> forward_windows(std::span<const int64_t> in,
                                        std::span<const int64_t> kernel, const WindowAttrs& a) {
  check_axes(a, in, kernel);
  const size_t rank = in.size();
  std::vector<WindowAxis> axes;
  for (size_t d = 0; d < rank; ++d) {
    WindowAxis w = start_axis(a, in, kernel, d);
    const int64_t s = w.stride, ek = w.extent();
    if (a.auto_pad == AutoPad::SameUpper || a.auto_pad == AutoPad::SameLower) {
      w.out = (w.in + s - 1) / s;
      // No window over an empty axis needs padding.
      const int64_t total = w.out == 0 ? 0 : std::max<int64_t>(0, (w.out - 1) * s + ek - w.in);
      w.pad_begin = a.auto_pad == AutoPad::SameUpper ? total / 2 : total - total / 2;
      w.pad_end = total - w.pad_begin;
    } else {
      if (a.auto_pad == AutoPad::NotSet) {
        w.pad_begin = at(a.pads, d, 0);
        w.pad_end = at(a.pads, d + rank, 0);
      }
      const int64_t span = w.in + w.pad_begin + w.pad_end - ek;
      if (span < 0) {
        fail(ErrorKind::Runtime, "the window of " + std::to_string(ek) + " (kernel " +
                                     std::to_string(w.kernel) + ", dilation " +
                                     std::to_string(w.dilation) + ") on " + axis_text(d) +
                                     " is larger than the padded input of " +
                                     std::to_string(w.in + w.pad_begin + w.pad_end));
      }
      const bool ceil = a.ceil_mode && a.auto_pad == AutoPad::NotSet;
      w.out = (ceil ? (span + s - 1) / s : span / s) + 1;
      // ONNX's rule: the last window must start inside the input or its left padding.
      if (ceil && (w.out - 1) * s >= w.in + w.pad_begin) --w.out;
    }
    check_output_size(w.out, d);
    axes.push_back(w);
  }
  return axes;
}

std::vector<WindowAxis> transposed_windows(std::span<const int64_t> in,
                                           std::span<const int64_t> kernel, const WindowAttrs& a) {
  check_axes(a, in, kernel);
  const size_t rank = in.size();
  const std::vector<int64_t> wanted = spatial_output_shape(a, rank);
  const bool same = a.auto_pad == AutoPad::SameUpper || a.auto_pad == AutoPad::SameLower;
  std::vector<WindowAxis> axes;
  for (size_t d = 0; d < rank; ++d) {
    WindowAxis w = start_axis(a, in, kernel, d);
    const int64_t opad = at(a.output_padding, d, 0);
    if (opad != 0 && opad >= w.stride && opad >= w.dilation) {
      fail(ErrorKind::InvalidModel,
           "output_padding " + std::to_string(opad) + " must be smaller than the stride (" +
               std::to_string(w.stride) + ") or the dilation (" + std::to_string(w.dilation) + ")");
    }
    // Every position a kernel tap reaches, before cropping.
    const int64_t full = checked_mul_add(w.stride, w.in - 1, opad + w.extent(), d);
    check_output_size(full, d);
    if (!wanted.empty() || same) {
      w.out = wanted.empty() ? checked_mul_add(w.in, w.stride, 0, d) : wanted[d];
      const int64_t total = wanted.empty() ? std::max<int64_t>(0, full - w.out) : full - w.out;
      const int64_t half = floor_half(total);
      w.pad_begin = a.auto_pad == AutoPad::SameUpper ? half : total - half;
      w.pad_end = total - w.pad_begin;
    } else {
      if (a.auto_pad == AutoPad::NotSet) {
        w.pad_begin = at(a.pads, d, 0);
        w.pad_end = at(a.pads, d + rank, 0);
      }
      w.out = full - w.pad_begin - w.pad_end;
    }
    check_output_size(w.out, d);
    axes.push_back(w);
  }
  return axes;
}

Shape windowed_shape(int64_t batch, int64_t channels, const std::vector<WindowAxis>& axes) {
  Shape shape{batch, channels};
  for (const WindowAxis& w : axes) shape.push_back(w.out);
  check_output_elements(shape);
  return shape;
}

void check_output_elements(const Shape& shape) {
  for (int64_t d : shape) {
    if (d < 0) fail(ErrorKind::Runtime, "output shape " + shape_to_string(shape) + " is negative");
  }
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return;
  int64_t n = 1;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n) || n > kMaxWindowElements) {
      fail(ErrorKind::Runtime, "output shape " + shape_to_string(shape) + " is too large");
    }
  }
}

Windows3 right_aligned(const std::vector<WindowAxis>& axes) {
  Windows3 g;
  const size_t off = 3 - std::min<size_t>(axes.size(), 3);
  for (size_t d = 0; d < axes.size() && d < 3; ++d) {
    const WindowAxis& a = axes[d];
    const size_t i = off + d;
    g.in[i] = a.in, g.k[i] = a.kernel, g.out[i] = a.out;
    g.stride[i] = a.stride, g.dil[i] = a.dilation, g.pad[i] = a.pad_begin;
  }
  return g;
}

Shape conv_output_shape(const Shape& x, const Shape& w, const WindowAttrs& a) {
  if (x.size() < 3 || w.size() != x.size()) {
    fail(ErrorKind::Runtime, "X " + shape_to_string(x) + " and W " + shape_to_string(w) +
                                 " must have the same rank, at least 3");
  }
  check_window_ranks(a, x.size() - 2);
  const std::vector<int64_t> kernel = conv_kernel(a, spatial_dims(w));
  return windowed_shape(x[0], w[0], forward_windows(spatial_dims(x), kernel, a));
}

ValueFacts windowed_facts(const ValueFacts& x, int64_t rank, int64_t channels, int64_t channels_in,
                          const std::function<Shape(const Shape&)>& out_of) {
  ValueFacts out = typed_facts(x.dtype);
  if (rank < 3 || (x.ranked && x.rank() != rank)) return out;
  append_dim(out, x.dim(0), x.ranked ? x.dim_name(0) : std::string());
  append_dim(out, channels);
  for (int64_t k = 2; k < rank; ++k) append_dim(out, kUnknownDim);
  if (!x.ranked) return out;
  constexpr int64_t kProbe = int64_t{1} << 16;  // above any window a valid model holds
  Shape probe = x.shape;
  probe[0] = 1;
  if (probe[1] == kUnknownDim) probe[1] = channels_in;
  for (size_t k = 2; k < probe.size(); ++k)
    if (probe[k] == kUnknownDim) probe[k] = kProbe;
  try {
    const Shape full = out_of(probe);
    for (size_t k = 2; k < full.size() && k < out.shape.size(); ++k)
      if (x.shape[k] != kUnknownDim) out.shape[k] = full[k];
  } catch (const Error&) {
    // the probe is not a valid input: the spatial sizes stay unknown
  } catch (const UnknownFacts&) {
  }
  return out;
}

}  // namespace kiln::ops

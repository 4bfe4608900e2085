// Sliding-window geometry: the output size and padding along each spatial axis of every op
// that moves a kernel over an image (Conv, kiln.FusedConv, ConvInteger, QLinearConv,
// DeformConv, MaxPool, AveragePool, LpPool, the block grid of Col2Im) or scatters one back
// (ConvTranspose, MaxUnpool), and of shape inference for them.
//
// Inputs are plain values (shapes, attribute values), so code that has only shapes and a
// node's attributes can use it. Failures throw kiln::Error without a node: the planner and
// the executor add the node's name as the error passes through them, and shape inference
// turns it into "unknown". Attribute problems are ErrorKind::InvalidModel, sizes that the
// input shapes make impossible ErrorKind::Runtime.
//
// One limit holds for every op: attribute values (kernel, stride, dilation, pads,
// output_padding, output_shape, and the convolutions' group) and kernel sizes are at most
// kMaxWindowAttr; spatial sizes
// in and out, and output element counts, at most kMaxWindowElements. Within those limits
// no computation here or in the kernels can overflow int64.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "kiln/tensor.h"
#include "ops/core/contract.h"

namespace kiln::ir {
struct Node;
}

namespace kiln::ops {

inline constexpr int64_t kMaxWindowAttr = int64_t{1} << 31;
inline constexpr int64_t kMaxWindowElements = int64_t{1} << 48;

enum class AutoPad { NotSet, SameUpper, SameLower, Valid };

// "NOTSET", "SAME_UPPER", "SAME_LOWER" or "VALID"; anything else is an error.
AutoPad parse_auto_pad(const std::string& text);

// A node's window attributes. An empty list means the default: the weight's kernel, stride
// 1, dilation 1, no padding, no output_padding, no output_shape.
struct WindowAttrs {
  AutoPad auto_pad = AutoPad::NotSet;
  std::vector<int64_t> kernel_shape{}, strides{}, dilations{}, pads{};
  bool ceil_mode = false;                                 // forward windows (pooling) only
  std::vector<int64_t> output_padding{}, output_shape{};  // transposed windows only
};

// Reads auto_pad, kernel_shape, strides, dilations, pads, ceil_mode, output_padding and
// output_shape (those present) and checks them with check_window_attrs.
WindowAttrs window_attrs(const ir::Node& node);

// Every value in range: kernel_shape, strides and dilations in [1, kMaxWindowAttr], pads,
// output_padding and output_shape in [0, kMaxWindowAttr].
void check_window_attrs(const WindowAttrs& a);

// The lists that are given have one value per spatial axis (two for pads); output_shape may
// also list the whole output shape (rank + 2 values).
void check_window_ranks(const WindowAttrs& a, size_t rank);

// The kernel of a convolution: the weight's spatial sizes, each in [1, kMaxWindowAttr] and
// equal to kernel_shape when that is given.
std::vector<int64_t> conv_kernel(const WindowAttrs& a, std::span<const int64_t> weight_spatial);

// One spatial axis of a window op.
struct WindowAxis {
  int64_t in = 0;  // input size (for Col2Im: the image)
  int64_t kernel = 1, stride = 1, dilation = 1;
  // Padding before and after the input. Forward windows: as applied (explicit or automatic);
  // with ceil_mode the last window may reach past pad_end. Transposed windows: the amount
  // cropped from each end of the full output, negative where output_shape asks for more.
  int64_t pad_begin = 0, pad_end = 0;
  int64_t out = 0;  // output size (for Col2Im: the number of block positions)

  // Input positions one kernel placement spans.
  int64_t extent() const { return (kernel - 1) * dilation + 1; }
};

// Windows sliding over `in` (Conv, pooling, Col2Im's block grid): for each axis,
// - SAME_UPPER / SAME_LOWER: out = ceil(in / stride), the padding that needs split in two
//   halves, the odd unit at the end (UPPER) or at the start (LOWER);
// - VALID: no padding, out = floor((in - extent) / stride) + 1;
// - NOTSET: the explicit pads, out = floor or, with ceil_mode, ceil((in + pads - extent) /
//   stride) + 1, where ceil_mode drops a last window that would start in the end padding.
// An output is empty only where the input is (SAME over an empty axis); a window larger
// than the padded input is an error.
std::vector<WindowAxis> forward_windows(std::span<const int64_t> in,
                                        std::span<const int64_t> kernel, const WindowAttrs& a);

// Windows scattered back (ConvTranspose, MaxUnpool): the full output of an axis is
// stride * (in - 1) + output_padding + extent. With output_shape, or SAME_UPPER /
// SAME_LOWER (out = in * stride), the difference to the asked size is cropped, the odd
// unit at the start except for SAME_UPPER; otherwise (NOTSET, VALID) the explicit pads are
// (VALID: none). output_padding must be smaller than the stride or the dilation.
std::vector<WindowAxis> transposed_windows(std::span<const int64_t> in,
                                           std::span<const int64_t> kernel, const WindowAttrs& a);

// The spatial axes of a convolution right-aligned in three dimensions (leading axes of size
// 1), as the convolution kernels index them.
struct Windows3 {
  std::array<int64_t, 3> in{1, 1, 1}, out{1, 1, 1}, k{1, 1, 1}, stride{1, 1, 1}, dil{1, 1, 1},
      pad{0, 0, 0};  // pad: before each axis
  int64_t in_size() const { return in[0] * in[1] * in[2]; }
  int64_t out_size() const { return out[0] * out[1] * out[2]; }
  int64_t k_size() const { return k[0] * k[1] * k[2]; }
};
// `axes` (1 to 3 of them) as a Windows3.
Windows3 right_aligned(const std::vector<WindowAxis>& axes);

// [batch, channels, out...], its element count checked with check_output_elements.
Shape windowed_shape(int64_t batch, int64_t channels, const std::vector<WindowAxis>& axes);

// The output shape of a convolution of `x` [N, C, spatial...] by a weight `w` [M, C/group,
// kernel...] (Conv, ConvInteger, QLinearConv, DeformConv): [N, M, out...]. The kernels and
// the shape rules both use it.
Shape conv_output_shape(const Shape& x, const Shape& w, const WindowAttrs& a);

// The facts of a window op's output [N, channels, spatial...] of rank `rank` (Conv and its kin,
// pools) when its input `x` is known only in part: N from x, `channels` as given (kUnknownDim
// when not known), each spatial size where x's is known. Each output size depends on its own
// axis alone, so `out_of` (the output shape of a complete input shape) is run on x with every
// unknown size replaced by a large one, and those axes' results dropped; spatial sizes stay
// unknown when it rejects that shape. `channels_in` is the probe's C when x does not tell it.
ValueFacts windowed_facts(const ValueFacts& x, int64_t rank, int64_t channels, int64_t channels_in,
                          const std::function<Shape(const Shape&)>& out_of);

// The sizes after batch and channels: a window op's spatial axes.
inline std::span<const int64_t> spatial_dims(const Shape& shape) {
  return std::span<const int64_t>(shape).subspan(std::min<size_t>(2, shape.size()));
}

// Fails unless `shape` has no negative size and, unless it is empty, at most
// kMaxWindowElements elements.
void check_output_elements(const Shape& shape);

}  // namespace kiln::ops

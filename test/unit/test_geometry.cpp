// The shared window geometry (ops/core/geometry.h) against naive references that place windows
// one by one, over random sizes and every auto_pad mode, ceil_mode and dilation; hostile
// attribute values and sizes must be errors.
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ops/core/geometry.h"
#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::ops;
using namespace kiln::testing;

namespace {

using Ints = std::vector<int64_t>;

// What a naive placement of windows gives for one axis, or `fails`.
struct Expected {
  bool fails = false;
  int64_t out = 0, pad_begin = 0, pad_end = 0;
};

// Input positions one placement covers: the last tap's offset, plus one.
int64_t naive_extent(int64_t kernel, int64_t dilation) {
  int64_t last = 0;
  for (int64_t t = 0; t < kernel; ++t) last = t * dilation;
  return last + 1;
}

// Forward windows, placed from the start of the padded input [-pb, in + pe).
Expected naive_forward(int64_t in, int64_t kernel, int64_t stride, int64_t dilation, int64_t pb,
                       int64_t pe, AutoPad mode, bool ceil_mode) {
  const int64_t extent = naive_extent(kernel, dilation);
  Expected e;
  if (mode == AutoPad::SameUpper || mode == AutoPad::SameLower) {
    // One window per stride step starting inside the input; padding makes the last fit.
    for (int64_t start = 0; start < in; start += stride) ++e.out;
    const int64_t last_end = e.out == 0 ? 0 : (e.out - 1) * stride + extent;
    const int64_t total = last_end > in ? last_end - in : 0;
    e.pad_begin = mode == AutoPad::SameUpper ? total / 2 : (total + 1) / 2;
    e.pad_end = total - e.pad_begin;
    return e;
  }
  if (mode == AutoPad::Valid) pb = pe = 0;
  e.pad_begin = pb;
  e.pad_end = pe;
  if (extent > pb + in + pe) {
    e.fails = true;
    return e;
  }
  if (!ceil_mode || mode != AutoPad::NotSet) {
    // Every window that fits inside the padded input.
    for (int64_t start = -pb; start + extent <= in + pe; start += stride) ++e.out;
    return e;
  }
  // Windows until the padded input is covered (the last may overhang) ...
  int64_t start = -pb;
  e.out = 1;
  while (start + extent < in + pe) {
    start += stride;
    ++e.out;
  }
  // ... without a last one that starts past the input and its left padding.
  if (start >= in) --e.out;
  return e;
}

// Transposed windows: every input position scatters its kernel taps; the output is the
// scattered range, cropped by the pads or to the asked size.
Expected naive_transposed(int64_t in, int64_t kernel, int64_t stride, int64_t dilation, int64_t pb,
                          int64_t pe, int64_t opad, int64_t wanted, AutoPad mode) {
  int64_t reached = 0;
  for (int64_t i = 0; i < in; ++i) {
    for (int64_t t = 0; t < kernel; ++t) reached = std::max(reached, i * stride + t * dilation + 1);
  }
  const int64_t full = reached + opad;
  Expected e;
  const bool same = mode == AutoPad::SameUpper || mode == AutoPad::SameLower;
  if (wanted >= 0 || same) {
    e.out = wanted >= 0 ? wanted : in * stride;
    const int64_t total = wanted >= 0 ? full - e.out : std::max<int64_t>(0, full - e.out);
    const auto half = static_cast<int64_t>(std::floor(static_cast<double>(total) / 2));
    e.pad_begin = mode == AutoPad::SameUpper ? half : total - half;
    e.pad_end = total - e.pad_begin;
  } else {
    if (mode == AutoPad::Valid) pb = pe = 0;
    e.pad_begin = pb;
    e.pad_end = pe;
    e.out = full - pb - pe;
    e.fails = e.out < 0;
  }
  return e;
}

AutoPad random_mode(std::mt19937& rng) {
  const AutoPad modes[] = {AutoPad::NotSet, AutoPad::SameUpper, AutoPad::SameLower, AutoPad::Valid};
  return modes[std::uniform_int_distribution<int>(0, 3)(rng)];
}

int64_t pick(std::mt19937& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// Random attributes for `rank` axes; lists left empty (the defaults) at random.
WindowAttrs random_attrs(std::mt19937& rng, size_t rank) {
  WindowAttrs a;
  a.auto_pad = random_mode(rng);
  a.ceil_mode = pick(rng, 0, 1) == 1;
  for (size_t d = 0; d < rank; ++d) {
    a.strides.push_back(pick(rng, 1, 4));
    a.dilations.push_back(pick(rng, 1, 3));
  }
  for (size_t d = 0; d < 2 * rank; ++d) a.pads.push_back(pick(rng, 0, 4));
  if (pick(rng, 0, 4) == 0) a.strides.clear();
  if (pick(rng, 0, 4) == 0) a.dilations.clear();
  if (pick(rng, 0, 4) == 0) a.pads.clear();
  return a;
}

int64_t value_or(const Ints& v, size_t d, int64_t fallback) {
  return v.empty() ? fallback : v[d];
}

template <typename F>
ErrorKind error_kind(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.kind();
  }
  FAIL("no error");
  return ErrorKind::Runtime;
}

}  // namespace

TEST_CASE("Forward windows match naive placement over random sizes and modes", "[geometry]") {
  std::mt19937 rng(181);
  int checked = 0, failures = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    const size_t rank = static_cast<size_t>(pick(rng, 1, 3));
    const WindowAttrs a = random_attrs(rng, rank);
    Ints in, kernel;
    for (size_t d = 0; d < rank; ++d) {
      in.push_back(pick(rng, 0, 3) == 0 ? pick(rng, 0, 3) : pick(rng, 1, 20));
      kernel.push_back(pick(rng, 1, 5));
    }
    std::vector<Expected> expected;
    bool fails = false;
    for (size_t d = 0; d < rank; ++d) {
      expected.push_back(naive_forward(in[d], kernel[d], value_or(a.strides, d, 1),
                                       value_or(a.dilations, d, 1), value_or(a.pads, d, 0),
                                       value_or(a.pads, d + rank, 0), a.auto_pad, a.ceil_mode));
      fails = fails || expected.back().fails;
    }
    INFO("iteration " << iter);
    if (fails) {
      CHECK(error_kind([&] { forward_windows(in, kernel, a); }) == ErrorKind::Runtime);
      ++failures;
      continue;
    }
    const std::vector<WindowAxis> axes = forward_windows(in, kernel, a);
    REQUIRE(axes.size() == rank);
    for (size_t d = 0; d < rank; ++d) {
      INFO("axis " << d << " in " << in[d] << " kernel " << kernel[d]);
      CHECK(axes[d].in == in[d]);
      CHECK(axes[d].kernel == kernel[d]);
      CHECK(axes[d].out == expected[d].out);
      CHECK(axes[d].pad_begin == expected[d].pad_begin);
      CHECK(axes[d].pad_end == expected[d].pad_end);
      // An output is empty only over an empty input.
      CHECK((axes[d].out > 0 || in[d] == 0));
    }
    ++checked;
  }
  CHECK(checked > 2000);
  CHECK(failures > 100);
}

TEST_CASE("ceil_mode keeps an overhanging window but not one starting in the end padding",
          "[geometry]") {
  WindowAttrs a;
  a.strides = {2};
  a.ceil_mode = true;
  // 5 inputs, kernel 2, stride 2: windows at 0, 2 and 4 (the last overhangs by one).
  CHECK(forward_windows(Ints{5}, Ints{2}, a)[0].out == 3);
  a.ceil_mode = false;
  CHECK(forward_windows(Ints{5}, Ints{2}, a)[0].out == 2);
  // With two units of end padding a window at 4 fits; ceil would add one at 6, in the padding.
  a.ceil_mode = true;
  a.pads = {0, 2};
  CHECK(forward_windows(Ints{5}, Ints{2}, a)[0].out == 3);
  // SAME ignores ceil_mode: ceil(5 / 2) windows.
  a.pads.clear();
  a.auto_pad = AutoPad::SameLower;
  const WindowAxis w = forward_windows(Ints{5}, Ints{4}, a)[0];
  CHECK(w.out == 3);
  CHECK(w.pad_begin == 2);  // total 3, the odd unit at the start
  CHECK(w.pad_end == 1);
}

TEST_CASE("Transposed windows match a naive scatter over random sizes and modes", "[geometry]") {
  std::mt19937 rng(182);
  int checked = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    const size_t rank = static_cast<size_t>(pick(rng, 1, 3));
    WindowAttrs a = random_attrs(rng, rank);
    Ints in, kernel;
    for (size_t d = 0; d < rank; ++d) {
      in.push_back(pick(rng, 1, 12));
      kernel.push_back(pick(rng, 1, 5));
      const int64_t s = value_or(a.strides, d, 1), dil = value_or(a.dilations, d, 1);
      a.output_padding.push_back(pick(rng, 0, std::max(s, dil) - 1));
    }
    const int kind = static_cast<int>(pick(rng, 0, 2));  // none, spatial or full output_shape
    if (kind > 0) {
      if (kind == 2) a.output_shape = {1, 1};
      for (size_t d = 0; d < rank; ++d) a.output_shape.push_back(pick(rng, 0, 40));
    }
    const Ints wanted(a.output_shape.end() - static_cast<std::ptrdiff_t>(kind > 0 ? rank : 0),
                      a.output_shape.end());
    std::vector<Expected> expected;
    bool fails = false;
    for (size_t d = 0; d < rank; ++d) {
      expected.push_back(naive_transposed(in[d], kernel[d], value_or(a.strides, d, 1),
                                          value_or(a.dilations, d, 1), value_or(a.pads, d, 0),
                                          value_or(a.pads, d + rank, 0), a.output_padding[d],
                                          wanted.empty() ? -1 : wanted[d], a.auto_pad));
      fails = fails || expected.back().fails;
    }
    INFO("iteration " << iter);
    if (fails) {
      CHECK(error_kind([&] { transposed_windows(in, kernel, a); }) == ErrorKind::Runtime);
      continue;
    }
    const std::vector<WindowAxis> axes = transposed_windows(in, kernel, a);
    REQUIRE(axes.size() == rank);
    for (size_t d = 0; d < rank; ++d) {
      INFO("axis " << d << " in " << in[d] << " kernel " << kernel[d]);
      CHECK(axes[d].out == expected[d].out);
      CHECK(axes[d].pad_begin == expected[d].pad_begin);
      CHECK(axes[d].pad_end == expected[d].pad_end);
    }
    ++checked;
  }
  CHECK(checked > 3000);
}

TEST_CASE("Window attributes out of range are model errors", "[geometry]") {
  const int64_t over = (int64_t{1} << 31) + 1;
  auto bad = [](WindowAttrs a) { return error_kind([&] { check_window_attrs(a); }); };
  for (int64_t v : {int64_t{0}, int64_t{-1}, over}) {
    CHECK(bad({.kernel_shape = {v}}) == ErrorKind::InvalidModel);
    CHECK(bad({.strides = {v}}) == ErrorKind::InvalidModel);
    CHECK(bad({.dilations = {v}}) == ErrorKind::InvalidModel);
  }
  for (int64_t v : {int64_t{-1}, over, std::numeric_limits<int64_t>::min()}) {
    CHECK(bad({.pads = {v, 0}}) == ErrorKind::InvalidModel);
    CHECK(bad({.output_padding = {v}}) == ErrorKind::InvalidModel);
    CHECK(bad({.output_shape = {v}}) == ErrorKind::InvalidModel);
  }
  CHECK_NOTHROW(check_window_attrs({.kernel_shape = {int64_t{1} << 31}, .pads = {0, 0}}));
  CHECK_THROWS_WITH(check_window_attrs({.strides = {3, 0}}),
                    Catch::Contains("strides must be in [1, 2^31], got 0"));
  // Forward and transposed windows check them too (shape inference calls them directly).
  CHECK_THROWS_AS(forward_windows(Ints{4}, Ints{2}, {.strides = {0}}), Error);
  CHECK_THROWS_AS(transposed_windows(Ints{4}, Ints{2}, {.pads = {-1, 0}}), Error);

  CHECK_THROWS_WITH(check_window_ranks({.pads = {1, 1}}, 2),
                    Catch::Contains("pads has 2 values, expected 4"));
  CHECK_NOTHROW(check_window_ranks({.output_shape = {1, 3, 5, 5}}, 2));
  CHECK_NOTHROW(check_window_ranks({.output_shape = {5, 5}}, 2));
  CHECK_THROWS_AS(check_window_ranks({.output_shape = {1, 5, 5}}, 2), Error);
  CHECK_THROWS_AS(forward_windows(Ints{4, 4}, Ints{2}, {}), Error);

  CHECK(parse_auto_pad("SAME_LOWER") == AutoPad::SameLower);
  CHECK_THROWS_WITH(parse_auto_pad("same_upper"), Catch::Contains("unknown auto_pad 'same_upper'"));
}

TEST_CASE("Hostile sizes give errors, not overflows", "[geometry]") {
  const int64_t big = int64_t{1} << 31;
  // Inputs: negative, or past the element limit.
  CHECK(error_kind([] { forward_windows(Ints{-1}, Ints{1}, {}); }) == ErrorKind::Runtime);
  CHECK_THROWS_AS(forward_windows(Ints{(int64_t{1} << 48) + 1}, Ints{1}, {}), Error);
  CHECK_THROWS_AS(
      forward_windows(Ints{std::numeric_limits<int64_t>::max()}, Ints{1}, {.pads = {big, big}}),
      Error);
  // Kernels from a weight: empty or beyond the attribute limit.
  CHECK_THROWS_AS(forward_windows(Ints{4}, Ints{0}, {}), Error);
  CHECK_THROWS_AS(forward_windows(Ints{4}, Ints{big + 1}, {}), Error);
  CHECK_THROWS_AS(conv_kernel({}, Ints{3, 0}), Error);
  CHECK_THROWS_WITH(conv_kernel({.kernel_shape = {3, 3}}, Ints{3, 2}),
                    Catch::Contains("kernel_shape [3,3] does not match the weight's kernel [3,2]"));
  CHECK(conv_kernel({}, Ints{3, 2}) == Ints{3, 2});
  // The largest window over a small input, and the largest padding around it.
  CHECK_THROWS_WITH(forward_windows(Ints{4}, Ints{big}, {.dilations = {big}}),
                    Catch::Contains("is larger than the padded input"));
  const WindowAxis wide = forward_windows(Ints{1}, Ints{1}, {.pads = {big, big}})[0];
  CHECK(wide.out == 2 * big + 1);
  // Transposed: stride * input past int64, past the element limit, and the SAME size.
  CHECK_THROWS_AS(transposed_windows(Ints{int64_t{1} << 48}, Ints{2}, {.strides = {big}}), Error);
  CHECK_THROWS_WITH(transposed_windows(Ints{int64_t{1} << 20}, Ints{2}, {.strides = {big}}),
                    Catch::Contains("over 2^48"));
  CHECK_THROWS_AS(transposed_windows(Ints{int64_t{1} << 47}, Ints{1},
                                     {.auto_pad = AutoPad::SameUpper, .strides = {big}}),
                  Error);
  // Pads cropping more than the scattered range.
  CHECK_THROWS_WITH(transposed_windows(Ints{2}, Ints{2}, {.pads = {2, 2}}),
                    Catch::Contains("would be negative"));
  CHECK_THROWS_WITH(transposed_windows(Ints{3}, Ints{2}, {.strides = {2}, .output_padding = {2}}),
                    Catch::Contains("output_padding 2 must be smaller than the stride (2)"));
  // Element counts.
  CHECK_THROWS_WITH(windowed_shape(int64_t{1} << 30, int64_t{1} << 30, {WindowAxis{.out = 1024}}),
                    Catch::Contains("is too large"));
  CHECK_THROWS_AS(windowed_shape(-1, 1, {}), Error);
  CHECK_NOTHROW(check_output_elements(Shape{0, big, big, big}));
  CHECK_THROWS_AS(check_output_elements(Shape{2, -1}), Error);
  CHECK(windowed_shape(2, 3, {WindowAxis{.out = 4}, WindowAxis{.out = 5}}) == Shape{2, 3, 4, 5});
}

TEST_CASE("window_attrs reads a node's attributes and refuses wrong types", "[geometry]") {
  ir::Node node;
  node.op_type = "MaxPool";
  auto add = [&](const std::string& name, ir::AttrKind kind) -> ir::Attribute& {
    ir::Attribute& a = node.attributes.emplace_back();
    a.name = name;
    a.kind = kind;
    return a;
  };
  add("kernel_shape", ir::AttrKind::Ints).ints = {3, 3};
  add("strides", ir::AttrKind::Ints).ints = {2, 1};
  add("auto_pad", ir::AttrKind::String).s = "SAME_UPPER";
  add("ceil_mode", ir::AttrKind::Int).i = 1;
  const WindowAttrs a = window_attrs(node);
  CHECK(a.kernel_shape == Ints{3, 3});
  CHECK(a.strides == Ints{2, 1});
  CHECK(a.dilations.empty());
  CHECK(a.auto_pad == AutoPad::SameUpper);
  CHECK(a.ceil_mode);
  add("pads", ir::AttrKind::Int).i = 1;
  CHECK_THROWS_WITH(window_attrs(node), Catch::Contains("attribute 'pads' has the wrong type"));
  node.attributes.back().kind = ir::AttrKind::Ints;
  node.attributes.back().ints = {0, -1, 0, 0};
  CHECK(error_kind([&] { window_attrs(node); }) == ErrorKind::InvalidModel);
}

TEST_CASE("Geometry errors name the node that failed", "[geometry]") {
  std::mt19937 rng(183);
  const Tensor x = random_tensor(DataType::Float, {1, 1, 4, 4}, rng);
  const Tensor w = random_tensor(DataType::Float, {1, 1, 5, 5}, rng);
  auto error_of = [](OpTest t) {
    try {
      t.run();
    } catch (const Error& e) {
      return e;
    }
    FAIL("no error");
    return Error(ErrorKind::Runtime, "");
  };
  const Error run_time = error_of(OpTest("Conv", 11).input(x).input(w));
  CHECK(run_time.op() == "Conv");
  CHECK(run_time.kind() == ErrorKind::Runtime);
  CHECK_THAT(run_time.message(), Catch::Contains("is larger than the padded input"));
  const Error plan_time = error_of(OpTest("AveragePool", 19)
                                       .input(x)
                                       .attr("kernel_shape", Ints{2, 2})
                                       .attr("dilations", Ints{0, 1}));
  CHECK(plan_time.op() == "AveragePool");
  CHECK(plan_time.kind() == ErrorKind::InvalidModel);
  CHECK_THAT(plan_time.message(), Catch::Contains("dilations must be in [1, 2^31], got 0"));
}

TEST_CASE("Window ops accept empty spatial inputs where the geometry allows", "[geometry]") {
  std::mt19937 rng(184);
  const Tensor x = random_tensor(DataType::Float, {1, 2, 0, 3}, rng);
  const Tensor w = random_tensor(DataType::Float, {4, 2, 2, 2}, rng);
  CHECK(OpTest("Conv", 11).input(x).input(w).attr("auto_pad", "SAME_UPPER").run1().shape() ==
        Shape{1, 4, 0, 3});
  CHECK(OpTest("AveragePool", 19)
            .input(x)
            .attr("kernel_shape", Ints{2, 2})
            .attr("auto_pad", "SAME_LOWER")
            .run1()
            .shape() == Shape{1, 2, 0, 3});
  // Without padding a window cannot fit into the empty axis.
  CHECK_THROWS_AS(OpTest("Conv", 11).input(x).input(w).run(), Error);
}

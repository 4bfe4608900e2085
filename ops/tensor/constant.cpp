// Ops that make tensors from attributes and shapes: Constant, ConstantOfShape, Range,
// EyeLike.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "engine/ir/graph.h"
#include "ops/core/common.h"

namespace kiln::ops {
namespace {

// One element of type `dt` holding `v`; throws when an integer type cannot hold it.
std::vector<std::byte> element_from_double(DataType dt, double v) {
  std::vector<std::byte> out(static_cast<size_t>(bits_per_element(dt) / 8));
  dispatch(PodTypes{}, dt, [&]<typename T>() {
    T t{};
    if constexpr (std::is_same_v<T, bool>) {
      t = v != 0;
    } else if constexpr (std::is_integral_v<T>) {
      const double hi = std::ldexp(1.0, std::numeric_limits<T>::digits);
      const double lo = std::is_signed_v<T> ? -hi : 0.0;
      if (!(v > lo - 1 && v < hi)) {
        throw Error(ErrorKind::Runtime, "value " + std::to_string(v) + " does not fit " +
                                            std::string(data_type_name(dt)));
      }
      t = static_cast<T>(v);
    } else {
      t = T(static_cast<compute_t<T>>(v));
    }
    std::memcpy(out.data(), &t, sizeof(T));
  });
  return out;
}

// Repeats one element over a contiguous tensor by doubling memcpys.
void fill_bytes(const Tensor& out, const std::byte* elem, size_t es) {
  const size_t total = out.nbytes();
  if (total == 0) return;
  std::byte* p = out.raw_data();
  std::memcpy(p, elem, es);
  for (size_t done = es; done < total;) {
    const size_t n = std::min(done, total - done);
    std::memcpy(p + done, p, n);
    done += n;
  }
}

// The engine folds Constant nodes into initializers before planning; this kernel serves
// graphs built without that pass.
class Constant final : public Kernel {
 public:
  explicit Constant(const NodeInfo& info) {
    std::optional<Tensor> v = ir::constant_node_value(info.node());
    if (!v) info.fail("has no value attribute");
    value_ = *v;
    // Every run hands out the same tensor: nobody may write into it.
    value_.storage()->set_read_only();
  }
  void run(OpContext& ctx) override { ctx.set_output(0, value_); }

 private:
  Tensor value_;
};

class ConstantOfShape final : public Kernel {
 public:
  explicit ConstantOfShape(const NodeInfo& info) {
    if (const Tensor* v = info.attr_tensor("value")) {
      if (v->numel() != 1) info.fail("value must hold exactly one element");
      value_ = v->contiguous();
    } else {
      value_ = Tensor::scalar<float>(0.0f);
    }
    if (value_.dtype() != DataType::String && bits_per_element(value_.dtype()) < 8) {
      throw_unsupported_type(value_.dtype(), "ConstantOfShape value");
    }
  }

  void run(OpContext& ctx) override {
    const std::vector<int64_t> dims = to_int64s(ctx.input(0));
    check_output_size(dims);
    Tensor& out = ctx.output(0, value_.dtype(), dims);
    if (value_.dtype() == DataType::String) {
      const std::string& v = value_.data<const std::string>()[0];
      std::string* p = out.data<std::string>();
      for (int64_t i = 0; i < out.numel(); ++i) p[i] = v;
    } else {
      fill_bytes(out, value_.raw_data(), static_cast<size_t>(bits_per_element(value_.dtype()) / 8));
    }
  }

 private:
  Tensor value_;
};

using RangeTypes = TypeList<float, double, float16, bfloat16, int16_t, int32_t, int64_t>;

class Range final : public Kernel {
 public:
  explicit Range(const NodeInfo& info) : stash_double_(info.attr_int("stash_type", 1) == 11) {
    const int64_t stash = info.attr_int("stash_type", 1);
    if (stash != 1 && stash != 11) info.fail("stash_type must be 1 (float) or 11 (double)");
  }

  void run(OpContext& ctx) override {
    const Tensor& start = ctx.input(0);
    const Tensor& limit = ctx.input(1);
    const Tensor& delta = ctx.input(2);
    for (const Tensor* t : {&start, &limit, &delta}) {
      if (t->numel() != 1) ctx.fail("start, limit and delta must be scalars, got " + t->describe());
      if (t->dtype() != start.dtype()) ctx.fail("start, limit and delta must have one type");
    }
    dispatch(RangeTypes{}, start.dtype(), [&]<typename T>() {
      const T s = start.contiguous().data<const T>()[0];
      const T l = limit.contiguous().data<const T>()[0];
      const T d = delta.contiguous().data<const T>()[0];
      if constexpr (std::is_integral_v<T>) {
        fill_int<T>(ctx, s, l, d);
      } else if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
        if (stash_double_) {
          fill_float<T, double>(ctx, s, l, d);
        } else {
          fill_float<T, float>(ctx, s, l, d);
        }
      } else {
        fill_float<T, double>(ctx, s, l, d);
      }
    });
  }

 private:
  template <typename T>
  static void fill_int(OpContext& ctx, T s, T l, T d) {
    if (d == 0) ctx.fail("delta cannot be 0");
    const __int128 diff = static_cast<__int128>(l) - s, step = d;
    int64_t n = 0;
    if (diff != 0 && (diff > 0) == (step > 0)) {
      const __int128 a = diff > 0 ? diff : -diff, b = step > 0 ? step : -step;
      const __int128 count = (a + b - 1) / b;
      if (count > kMaxOutputElements) ctx.fail("the range has too many elements");
      n = static_cast<int64_t>(count);
    }
    T* out = ctx.output(0, data_type_of<T>(), {n}).template data<T>();
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(s + static_cast<__int128>(i) * step);
  }

  template <typename T, typename C>
  static void fill_float(OpContext& ctx, T s, T l, T d) {
    const C start = static_cast<C>(static_cast<compute_t<T>>(s));
    const C limit = static_cast<C>(static_cast<compute_t<T>>(l));
    const C delta = static_cast<C>(static_cast<compute_t<T>>(d));
    if (delta == 0) ctx.fail("delta cannot be 0");
    const double count = std::ceil((static_cast<double>(limit) - start) / delta);
    if (std::isnan(count)) ctx.fail("start, limit and delta must be numbers");
    if (count > static_cast<double>(kMaxOutputElements))
      ctx.fail("the range has too many elements");
    const int64_t n = count > 0 ? static_cast<int64_t>(count) : 0;
    T* out = ctx.output(0, data_type_of<T>(), {n}).template data<T>();
    for (int64_t i = 0; i < n; ++i) {
      out[i] = from_compute<T>(static_cast<compute_t<T>>(start + static_cast<C>(i) * delta));
    }
  }

  bool stash_double_;
};

class EyeLike final : public Kernel {
 public:
  explicit EyeLike(const NodeInfo& info) : k_(info.attr_int("k", 0)) {
    if (info.has_attr("dtype")) {
      const int64_t dt = info.attr_int("dtype");
      if (dt < 0 || dt > INT32_MAX || !is_known_data_type(static_cast<int32_t>(dt))) {
        info.fail("unknown dtype " + std::to_string(dt));
      }
      dtype_ = static_cast<DataType>(dt);
      if (!type_in(PodTypes{}, dtype_)) throw_unsupported_type(dtype_, "EyeLike dtype");
    }
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    if (x.rank() != 2) ctx.fail("input must be 2-D, got " + x.describe());
    const DataType dt = dtype_ == DataType::Undefined ? x.dtype() : dtype_;
    const std::vector<std::byte> one = element_from_double(dt, 1.0);
    Tensor& y = ctx.output(0, dt, x.shape());
    std::memset(y.raw_data(), 0, y.nbytes());
    const int64_t rows = x.dim(0), cols = x.dim(1);
    std::byte* p = y.raw_data();
    for (int64_t i = 0; i < rows; ++i) {
      // j = i + k, computed so that huge |k| cannot overflow.
      if (k_ >= cols || k_ <= -rows) break;
      const int64_t j = i + k_;
      if (j < 0) continue;
      if (j >= cols) break;
      std::memcpy(p + static_cast<size_t>(i * cols + j) * one.size(), one.data(), one.size());
    }
  }

 private:
  int64_t k_;
  DataType dtype_ = DataType::Undefined;
};

void constant_shape(ShapeContext& c) {
  const ir::Node& node = c.node();
  if (const ir::Attribute* a = node.attr("value"); a && a->t.defined()) {
    const ValueFacts v = facts_of(a->t);
    c.set(0, v.dtype, v.shape, v.has_data ? &v.data : nullptr);
  } else if (const ir::Attribute* i = node.attr("value_int")) {
    const std::vector<int64_t> data{i->i};
    c.set(0, DataType::Int64, {}, &data);
  } else if (const ir::Attribute* is = node.attr("value_ints")) {
    c.set(0, DataType::Int64, {static_cast<int64_t>(is->ints.size())}, &is->ints);
  } else if (node.attr("value_float")) {
    c.set(0, DataType::Float, {});
  } else if (const ir::Attribute* fs = node.attr("value_floats")) {
    c.set(0, DataType::Float, {static_cast<int64_t>(fs->floats.size())});
  } else {
    unknown("a string or sparse Constant");
  }
}

void constant_of_shape_shape(ShapeContext& c) {
  const ir::Attribute* value = c.node().attr("value");
  DataType dtype = DataType::Float;
  int64_t fill = 0;
  if (value && value->t.defined()) {
    const ValueFacts v = facts_of(value->t);
    dtype = v.dtype;
    if (v.has_data && !v.data.empty()) fill = v.data[0];
  }
  const ValueFacts& dims = c.facts(0);
  if (!dims.has_data) {
    // Partial facts: the rank, and the dimensions whose elements are known.
    ValueFacts out = typed_facts(dtype);
    if (dims.rank() == 1 && dims.shape[0] != kUnknownDim && dims.shape[0] <= kMaxKnownData) {
      for (int64_t k = 0; k < dims.shape[0]; ++k) {
        const std::optional<int64_t> e = dims.elem(static_cast<size_t>(k));
        append_dim(out, e && *e >= 0 ? *e : kUnknownDim);
      }
    }
    c.set(0, std::move(out));
    return;
  }
  const std::vector<int64_t>& shape = c.data(0);
  const std::vector<int64_t> data(
      static_cast<size_t>(std::min<int64_t>(numel_or_unknown(shape), kMaxKnownData + 1)), fill);
  c.set(0, dtype, shape, &data);
}

// An integer Range's length (and small contents) follow from known start, limit and delta;
// a float one's length depends on rounding the kernel does, so it is left to the run.
void range_shape(ShapeContext& c) {
  const ValueFacts& start = c.facts(0);
  const bool bounds = c.facts(0).has_data && c.facts(1).has_data && c.facts(2).has_data;
  if (!is_integer_type(start.dtype) || !bounds) {
    // A float Range's length, or one of unknown bounds, is only known when run.
    c.set(0, ranked_facts(start.dtype, {kUnknownDim}));
    return;
  }
  const int64_t s = c.data(0).at(0), limit = c.data(1).at(0), delta = c.data(2).at(0);
  if (delta == 0) unknown("delta 0");
  const int64_t span = checked_sub(limit, s);
  const int64_t n =
      std::max<int64_t>(0, checked_div(checked_add(span, delta - (delta > 0 ? 1 : -1)), delta));
  std::vector<int64_t> data;
  for (int64_t k = 0; k < n && k <= kMaxKnownData; ++k) data.push_back(s + k * delta);
  c.set(0, start.dtype, {n}, &data);
}

void eye_like_shape(ShapeContext& c) {
  const int64_t dtype = c.attr_int("dtype", -1);
  if (dtype > INT32_MAX || (dtype >= 0 && !is_known_data_type(static_cast<int32_t>(dtype))))
    unknown("bad dtype");
  c.set(0, dtype < 0 ? c.dtype(0) : static_cast<DataType>(dtype), c.shape(0));
}

}  // namespace

KILN_REGISTER_OP({.op = "Constant",
                  .since = 1,
                  .min_inputs = 0,
                  .max_inputs = 0,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "all types",
                  .shape = constant_shape,
                  .create = make<Constant>});
KILN_REGISTER_OP({.op = "ConstantOfShape",
                  .since = 9,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "all types but sub-byte ones",
                  .shape = constant_of_shape_shape,
                  .create = make<ConstantOfShape>});
KILN_REGISTER_OP({.op = "Range",
                  .since = 11,
                  .min_inputs = 3,
                  .max_inputs = 3,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .strided_inputs = true,
                  .types = "float, double, float16, bfloat16, int16, int32, int64",
                  .shape = range_shape,
                  .create = make<Range>});
KILN_REGISTER_OP({.op = "EyeLike",
                  .since = 9,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .strided_inputs = true,
                  .types = "numeric types, bool",
                  .shape = eye_like_shape,
                  .create = make<EyeLike>});

}  // namespace kiln::ops

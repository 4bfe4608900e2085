// ScatterElements (and the deprecated Scatter), ScatterND and TensorScatter: a copy of
// `data` with some elements or slices replaced (or combined with a reduction). The output
// is written over `data` when the executor allows it, so a KV cache updated with
// TensorScatter is not copied on every step.
#include <algorithm>
#include <string>

#include "ops/core/common.h"

namespace kiln::ops {
namespace {

struct Bytes16 {
  uint64_t lo, hi;
};

// Calls f.template operator()<T>() with T a trivially copyable type of the element's width
// (or std::string); element pointers come from elems<T>().
template <typename F>
void dispatch_width(DataType dt, F&& f) {
  if (dt == DataType::String) return f.template operator()<std::string>();
  switch (bits_per_element(dt)) {
    case 8:
      return f.template operator()<uint8_t>();
    case 16:
      return f.template operator()<uint16_t>();
    case 32:
      return f.template operator()<uint32_t>();
    case 64:
      return f.template operator()<uint64_t>();
    case 128:
      return f.template operator()<Bytes16>();
    default:
      throw_unsupported_type(dt, "data");
  }
}

template <typename T>
T* elems(const Tensor& t) {
  return reinterpret_cast<T*>(t.raw_data());
}

[[noreturn]] void index_out_of_range(int64_t index, int64_t dim, const char* what) {
  throw Error(ErrorKind::Runtime, std::string(what) + " index " + std::to_string(index) +
                                      " is out of range for a dimension of size " +
                                      std::to_string(dim));
}

enum class Reduction { None, Add, Mul, Max, Min };

Reduction read_reduction(const NodeInfo& info) {
  const std::string r = info.attr_string("reduction", "none");
  const int64_t opset = info.opset();
  if (r == "none") return Reduction::None;
  if (opset >= 16 && r == "add") return Reduction::Add;
  if (opset >= 16 && r == "mul") return Reduction::Mul;
  if (opset >= 18 && r == "max") return Reduction::Max;
  if (opset >= 18 && r == "min") return Reduction::Min;
  info.fail("reduction '" + r + "' is not defined at opset " + std::to_string(opset));
}

// dst = dst (op) src in the compute type; integers wrap around instead of overflowing.
template <typename T>
void combine(T& dst, const T& src, Reduction r) {
  using C = compute_t<T>;
  const C a = static_cast<C>(dst), b = static_cast<C>(src);
  C v = a;
  if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;
    using W = std::conditional_t<(sizeof(C) < sizeof(unsigned)), unsigned, U>;
    switch (r) {
      case Reduction::Add:
        v = static_cast<C>(static_cast<U>(a) + static_cast<U>(b));
        break;
      case Reduction::Mul:
        v = static_cast<C>(static_cast<W>(static_cast<U>(a)) * static_cast<W>(static_cast<U>(b)));
        break;
      case Reduction::Max:
        v = std::max(a, b);
        break;
      case Reduction::Min:
        v = std::min(a, b);
        break;
      case Reduction::None:
        v = b;
        break;
    }
  } else {
    switch (r) {
      case Reduction::Add:
        v = a + b;
        break;
      case Reduction::Mul:
        v = a * b;
        break;
      case Reduction::Max:
        v = std::max(a, b);
        break;
      case Reduction::Min:
        v = std::min(a, b);
        break;
      case Reduction::None:
        v = b;
        break;
    }
  }
  dst = from_compute<T>(v);
}

// Calls f(T* dst, const T* src, n) with a loop that applies `r` to n elements: by width
// for plain replacement, by numeric type otherwise.
template <typename F>
void with_combiner(DataType dt, Reduction r, F&& f) {
  if (r == Reduction::None) {
    dispatch_width(dt, [&]<typename T>() {
      f(elems<T>, [](T* dst, const T* src, int64_t n) { std::copy_n(src, n, dst); });
    });
    return;
  }
  dispatch(
      NumericTypes{}, dt,
      [&]<typename T>() {
        f(elems<T>, [r](T* dst, const T* src, int64_t n) {
          for (int64_t i = 0; i < n; ++i) combine(dst[i], src[i], r);
        });
      },
      "data (with a reduction)");
}

// The output: data itself when it may be overwritten, else a copy of it.
Tensor& copy_of_data(OpContext& ctx) {
  const Tensor& data = ctx.input(0);
  Tensor& out = ctx.output_reusing(0, 0, data.dtype(), data.shape());
  if (out.storage() != data.storage() || out.byte_offset() != data.byte_offset()) {
    copy_elements(data, out);
    ctx.count_copy(out.nbytes());
  }
  return out;
}

class ScatterElements final : public Kernel {
 public:
  explicit ScatterElements(const NodeInfo& info)
      : axis_(info.attr_int("axis", 0)), reduction_(read_reduction(info)) {}

  void run(OpContext& ctx) override {
    const Tensor& data = ctx.input(0);
    const Tensor& indices = ctx.input(1);
    const Tensor& updates = ctx.input(2);
    const size_t rank = data.rank();
    if (rank == 0) ctx.fail("data must have rank >= 1");
    if (indices.rank() != rank || indices.shape() != updates.shape()) {
      ctx.fail("indices " + indices.describe() + " and updates " + updates.describe() +
               " must have the same shape and the rank of data " + data.describe());
    }
    if (updates.dtype() != data.dtype()) ctx.fail("updates and data have different types");
    const size_t axis = static_cast<size_t>(normalize_axis(axis_, static_cast<int64_t>(rank)));
    for (size_t d = 0; d < rank; ++d) {
      if (d != axis && indices.dim(d) > data.dim(d)) {
        ctx.fail("indices " + indices.describe() + " exceed data " + data.describe() +
                 " outside the scatter axis");
      }
    }
    const int64_t dim = data.dim(axis);
    std::vector<int64_t> idx = to_int64s(indices);
    for (int64_t& i : idx) {
      if (i < -dim || i >= dim) index_out_of_range(i, dim, "ScatterElements");
      if (i < 0) i += dim;
    }
    Tensor& out = copy_of_data(ctx);
    if (indices.numel() == 0) return;

    // Element offset in data of every update, in order (later duplicates win or combine).
    std::vector<int64_t> target(idx.size());
    const Shape& ds = out.strides();
    std::vector<int64_t> coord(rank, 0);
    for (size_t e = 0; e < idx.size(); ++e) {
      int64_t off = 0;
      for (size_t d = 0; d < rank; ++d) off += (d == axis ? idx[e] : coord[d]) * ds[d];
      target[e] = off;
      for (size_t d = rank; d-- > 0;) {
        if (++coord[d] < indices.dim(d)) break;
        coord[d] = 0;
      }
    }
    with_combiner(data.dtype(), reduction_, [&](auto get, auto apply) {
      auto* dst = get(out);
      const auto* src = get(updates);
      for (size_t e = 0; e < target.size(); ++e) apply(dst + target[e], src + e, 1);
    });
    ctx.count_copy(updates.nbytes());
  }

 private:
  int64_t axis_;
  Reduction reduction_;
};

class ScatterND final : public Kernel {
 public:
  explicit ScatterND(const NodeInfo& info) : reduction_(read_reduction(info)) {}

  void run(OpContext& ctx) override {
    const Tensor& data = ctx.input(0);
    const Tensor& indices = ctx.input(1);
    const Tensor& updates = ctx.input(2);
    if (indices.dtype() != DataType::Int64) ctx.fail("indices must be int64");
    if (updates.dtype() != data.dtype()) ctx.fail("updates and data have different types");
    const size_t r = data.rank(), q = indices.rank();
    if (r < 1 || q < 1) ctx.fail("data and indices must have rank >= 1");
    const int64_t k = indices.dim(q - 1);
    if (k < 1 || static_cast<size_t>(k) > r) {
      ctx.fail("the last dimension of indices (" + std::to_string(k) + ") must be in [1, " +
               std::to_string(r) + "]");
    }
    Shape expected(indices.shape().begin(), indices.shape().end() - 1);
    expected.insert(expected.end(), data.shape().begin() + k, data.shape().end());
    if (updates.shape() != expected) {
      ctx.fail("updates " + updates.describe() + " must have shape " + shape_to_string(expected));
    }
    const int64_t slice = shape_numel(Shape(data.shape().begin() + k, data.shape().end()));
    const int64_t slices = indices.numel() / k;
    std::vector<int64_t> offsets(static_cast<size_t>(slices));
    const int64_t* ip = indices.data<const int64_t>();
    const Shape ds = contiguous_strides(data.shape());
    for (int64_t s = 0; s < slices; ++s) {
      int64_t off = 0;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t dim = data.dim(static_cast<size_t>(j));
        int64_t i = ip[s * k + j];
        if (i < -dim || i >= dim) index_out_of_range(i, dim, "ScatterND");
        if (i < 0) i += dim;
        off += i * ds[static_cast<size_t>(j)];
      }
      offsets[static_cast<size_t>(s)] = off;
    }
    Tensor& out = copy_of_data(ctx);
    if (slice == 0) return;
    with_combiner(data.dtype(), reduction_, [&](auto get, auto apply) {
      auto* dst = get(out);
      const auto* src = get(updates);
      for (int64_t s = 0; s < slices; ++s) {
        apply(dst + offsets[static_cast<size_t>(s)], src + s * slice, slice);
      }
    });
    ctx.count_copy(updates.nbytes());
  }

 private:
  Reduction reduction_;
};

// present = past with update written at write_indices[batch] along `axis` (a KV cache).
class TensorScatter final : public Kernel {
 public:
  explicit TensorScatter(const NodeInfo& info) : axis_(info.attr_int("axis", -2)) {
    const std::string mode = info.attr_string("mode", "linear");
    if (mode != "linear" && mode != "circular") info.fail("mode must be linear or circular");
    circular_ = mode == "circular";
  }

  void run(OpContext& ctx) override {
    const Tensor& past = ctx.input(0);
    const Tensor& update = ctx.input(1);
    const size_t rank = past.rank();
    if (rank < 2) ctx.fail("past_cache must have rank >= 2");
    const size_t axis = static_cast<size_t>(normalize_axis(axis_, static_cast<int64_t>(rank)));
    if (axis == 0) ctx.fail("axis cannot be the batch dimension");
    if (update.dtype() != past.dtype() || update.rank() != rank) {
      ctx.fail("update " + update.describe() + " does not match past_cache " + past.describe());
    }
    for (size_t d = 0; d < rank; ++d) {
      if (d != axis && update.dim(d) != past.dim(d)) {
        ctx.fail("update " + update.describe() + " does not match past_cache " + past.describe());
      }
    }
    const int64_t batch = past.dim(0), max_len = past.dim(axis), len = update.dim(axis);
    if (len > max_len) ctx.fail("update is longer than the cache");
    std::vector<int64_t> starts(static_cast<size_t>(batch), 0);
    if (ctx.has_input(2)) {
      const Tensor& wi = ctx.input(2);
      if (wi.numel() != batch) ctx.fail("write_indices must have one value per batch");
      starts = to_int64s(wi);
    }
    for (int64_t& s : starts) {
      if (circular_) {
        if (max_len > 0) s = ((s % max_len) + max_len) % max_len;
      } else if (s < 0 || s > max_len - len) {
        ctx.fail("write index " + std::to_string(s) + " with " + std::to_string(len) +
                 " new entries does not fit a cache of length " + std::to_string(max_len));
      }
    }
    Tensor& out = copy_of_data(ctx);
    if (update.numel() == 0) return;

    const int64_t prefix = shape_numel(Shape(past.shape().begin(), past.shape().begin() + axis));
    const int64_t per_batch = prefix / batch;
    const int64_t inner = shape_numel(Shape(past.shape().begin() + axis + 1, past.shape().end()));
    dispatch_width(past.dtype(), [&]<typename T>() {
      T* dst = elems<T>(out);
      const T* src = elems<const T>(update);
      parallel_for(prefix, grain_for(len * inner), [&](int64_t begin, int64_t end) {
        for (int64_t p = begin; p < end; ++p) {
          const int64_t start = starts[static_cast<size_t>(p / per_batch)];
          const T* from = src + p * len * inner;
          T* to = dst + p * max_len * inner;
          const int64_t first = std::min(len, max_len - start);  // before wrapping around
          std::copy_n(from, first * inner, to + start * inner);
          std::copy_n(from + first * inner, (len - first) * inner, to);
        }
      });
    });
    ctx.count_copy(update.nbytes());
  }

 private:
  int64_t axis_;
  bool circular_ = false;
};

// The output is data with some elements replaced.
void scatter_shape(ShapeContext& c) {
  if (c.dtype(2) != c.dtype(0)) unknown("updates and data have different types");
  same_shape(c);
}

void tensor_scatter_shape(ShapeContext& c) {
  if (c.dtype(1) != c.dtype(0) || c.shape(0).size() < 2) unknown("update does not match the cache");
  same_shape(c);
}

}  // namespace

KILN_REGISTER_OP({.op = "Scatter",
                  .since = 9,
                  .min_inputs = 3,
                  .max_inputs = 3,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .in_place = inputs(0),
                  .types = "all types (deprecated since opset 11; same as ScatterElements)",
                  .shape = scatter_shape,
                  .create = make<ScatterElements>});
KILN_REGISTER_OP({.op = "ScatterElements",
                  .since = 11,
                  .min_inputs = 3,
                  .max_inputs = 3,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .in_place = inputs(0),
                  .types = "all types; numeric with a reduction",
                  .shape = scatter_shape,
                  .create = make<ScatterElements>});
KILN_REGISTER_OP({.op = "ScatterND",
                  .since = 11,
                  .min_inputs = 3,
                  .max_inputs = 3,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .in_place = inputs(0),
                  .types = "all types; numeric with a reduction",
                  .shape = scatter_shape,
                  .create = make<ScatterND>});
KILN_REGISTER_OP({.op = "TensorScatter",
                  .since = 24,
                  .min_inputs = 2,
                  .max_inputs = 3,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .in_place = inputs(0),
                  .types = "all types",
                  .shape = tensor_scatter_shape,
                  .create = make<TensorScatter>});

}  // namespace kiln::ops

#include "tools/common/compare.h"

#include <cmath>
#include <cstring>
#include <string>

namespace kiln::tooling {
namespace {

double element_as_double(const Tensor& t, int64_t i) {
  const std::byte* p = t.raw_data();
  switch (t.dtype()) {
    case DataType::Float:
      return reinterpret_cast<const float*>(p)[i];
    case DataType::Double:
      return reinterpret_cast<const double*>(p)[i];
    case DataType::Float16:
      return float16::to_float(reinterpret_cast<const uint16_t*>(p)[i]);
    case DataType::BFloat16:
      return static_cast<float>(bfloat16::from_bits(reinterpret_cast<const uint16_t*>(p)[i]));
    default:
      return 0;
  }
}

Comparison compare_tensors(const Tensor& actual_in, const Tensor& expected_in, double rtol,
                           double atol) {
  Comparison c;
  if (actual_in.dtype() != expected_in.dtype()) {
    c.ok = false;
    c.message = "element type " + std::string(data_type_name(actual_in.dtype())) + ", expected " +
                std::string(data_type_name(expected_in.dtype()));
    return c;
  }
  if (actual_in.shape() != expected_in.shape()) {
    c.ok = false;
    c.message = "shape " + shape_to_string(actual_in.shape()) + ", expected " +
                shape_to_string(expected_in.shape());
    return c;
  }
  const Tensor a = actual_in.contiguous();
  const Tensor e = expected_in.contiguous();
  const int64_t n = a.numel();
  const DataType dt = a.dtype();
  if (dt == DataType::Float || dt == DataType::Double || dt == DataType::Float16 ||
      dt == DataType::BFloat16) {
    int64_t bad = 0, first_bad = -1;
    for (int64_t i = 0; i < n; ++i) {
      const double x = element_as_double(a, i), y = element_as_double(e, i);
      if (std::isnan(x) || std::isnan(y)) {
        if (std::isnan(x) != std::isnan(y)) {
          if (first_bad < 0) first_bad = i;
          ++bad;
        }
        continue;
      }
      if (std::isinf(x) || std::isinf(y)) {
        if (x != y) {
          if (first_bad < 0) first_bad = i;
          ++bad;
        }
        continue;
      }
      const double err = std::abs(x - y);
      if (err > c.max_abs_err) c.max_abs_err = err;
      if (err > atol + rtol * std::abs(y)) {
        if (first_bad < 0) first_bad = i;
        ++bad;
      }
    }
    if (bad > 0) {
      c.ok = false;
      c.message = std::to_string(bad) + " of " + std::to_string(n) +
                  " elements differ (max abs error " + std::to_string(c.max_abs_err) +
                  "; first at " + std::to_string(first_bad) + ": got " +
                  std::to_string(element_as_double(a, first_bad)) + ", expected " +
                  std::to_string(element_as_double(e, first_bad)) + ")";
    }
    return c;
  }
  if (dt == DataType::String) {
    const std::string* x = a.data<const std::string>();
    const std::string* y = e.data<const std::string>();
    for (int64_t i = 0; i < n; ++i) {
      if (x[i] != y[i]) {
        c.ok = false;
        c.message = "element " + std::to_string(i) + " is '" + x[i] + "', expected '" + y[i] + "'";
        return c;
      }
    }
    return c;
  }
  // Integers, bools and other fixed-width types compare bytewise (bools as truth values).
  const size_t bytes = a.nbytes();
  if (dt == DataType::Bool) {
    const auto* x = reinterpret_cast<const uint8_t*>(a.raw_data());
    const auto* y = reinterpret_cast<const uint8_t*>(e.raw_data());
    for (int64_t i = 0; i < n; ++i) {
      if ((x[i] != 0) != (y[i] != 0)) {
        c.ok = false;
        c.message = "element " + std::to_string(i) + " differs";
        return c;
      }
    }
    return c;
  }
  if (bytes > 0 && std::memcmp(a.raw_data(), e.raw_data(), bytes) != 0) {
    c.ok = false;
    const int esize = bits_per_element(dt) / 8;
    for (size_t i = 0; esize > 0 && i < bytes; ++i) {
      if (a.raw_data()[i] != e.raw_data()[i]) {
        c.message = "element " + std::to_string(i / static_cast<size_t>(esize)) + " differs";
        break;
      }
    }
    if (c.message.empty()) c.message = "packed elements differ";
  }
  return c;
}

}  // namespace

Comparison compare_values(const Value& actual, const Value& expected, double rtol, double atol) {
  Comparison c;
  if (actual.kind() != expected.kind()) {
    c.ok = false;
    c.message = "got " + actual.describe() + ", expected " + expected.describe();
    return c;
  }
  switch (expected.kind()) {
    case Value::Kind::Tensor:
      return compare_tensors(actual.tensor(), expected.tensor(), rtol, atol);
    case Value::Kind::Sequence: {
      const auto& xs = actual.items();
      const auto& ys = expected.items();
      if (xs.size() != ys.size()) {
        c.ok = false;
        c.message = "sequence of " + std::to_string(xs.size()) + " items, expected " +
                    std::to_string(ys.size());
        return c;
      }
      for (size_t i = 0; i < xs.size(); ++i) {
        Comparison item = compare_tensors(xs[i], ys[i], rtol, atol);
        if (item.max_abs_err > c.max_abs_err) c.max_abs_err = item.max_abs_err;
        if (!item.ok) {
          item.message = "item " + std::to_string(i) + ": " + item.message;
          return item;
        }
      }
      return c;
    }
    case Value::Kind::Optional:
      if (actual.has_element() != expected.has_element()) {
        c.ok = false;
        c.message = "got " + actual.describe() + ", expected " + expected.describe();
        return c;
      }
      if (!expected.has_element()) return c;
      return compare_values(actual.element(), expected.element(), rtol, atol);
    case Value::Kind::None:
      return c;
  }
  return c;
}

}  // namespace kiln::tooling

// Cast and CastLike between every element type kiln stores.
//
// Elements go through a small intermediate chunk (double for floating sources, int64 for
// integer sources, uint64 bits for uint64) so that each type needs one reader and one
// writer instead of a kernel per pair. Numeric rules follow numpy/ml_dtypes, which the ONNX
// reference uses: floats to integers truncate and wrap modulo the target width (NaN and out
// of range values give the x86 "integer indefinite" pattern), floats to float8/float4 round
// to nearest even with the `saturate` rules in float8.h, numbers to strings print like numpy.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "ops/core/common.h"
#include "ops/core/float8.h"
#include "ops/math/kernels.h"

#if defined(__F16C__)
#endif

namespace kiln::ops {
namespace {

using lowp::RoundMode;

enum class Kind { F, I, U };     // chunk holds doubles, int64s, or uint64 bit patterns in i
constexpr int64_t kChunk = 256;  // a multiple of 4: packed targets never share a byte

struct Chunk {
  Kind kind = Kind::F;
  double f[kChunk];
  int64_t i[kChunk];
};

struct CastOptions {
  bool saturate = true;
  RoundMode round = RoundMode::Up;
};

[[noreturn]] void bad_string(const std::string& s, DataType to) {
  throw Error(ErrorKind::Runtime, "cannot parse '" + s + "' as " + std::string(data_type_name(to)));
}

std::string trimmed(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

double parse_double(const std::string& s, DataType to) {
  const std::string t = trimmed(s);
  if (t.empty()) bad_string(s, to);
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size()) bad_string(s, to);
  return v;
}

// Truncation toward zero; NaN and values outside int64 give INT64_MIN (as x86 does).
int64_t double_to_int64(double d) {
  if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) return INT64_MIN;
  return static_cast<int64_t>(d);
}

template <typename T>
T double_to_int(double d) {
  if constexpr (std::is_same_v<T, int32_t>) {
    if (!(d > -2147483649.0 && d < 2147483648.0)) return INT32_MIN;
    return static_cast<int32_t>(d);
  } else if constexpr (std::is_same_v<T, uint64_t>) {
    if (d >= 9223372036854775808.0 && d < 18446744073709551616.0) return static_cast<uint64_t>(d);
    return static_cast<uint64_t>(double_to_int64(d));
  } else {
    return static_cast<T>(double_to_int64(d));  // modular narrowing
  }
}

// ---- readers: elements [start, start + n) of a source into the chunk ----

template <typename T>
void read_typed(const std::byte* src, int64_t start, int64_t n, Chunk& c) {
  const T* p = reinterpret_cast<const T*>(src) + start;
  if constexpr (std::is_same_v<T, uint64_t>) {
    c.kind = Kind::U;
    for (int64_t k = 0; k < n; ++k) c.i[k] = static_cast<int64_t>(p[k]);
  } else if constexpr (std::is_integral_v<T>) {
    c.kind = Kind::I;
    for (int64_t k = 0; k < n; ++k) c.i[k] = static_cast<int64_t>(p[k]);
  } else {
    c.kind = Kind::F;
    for (int64_t k = 0; k < n; ++k) c.f[k] = static_cast<double>(static_cast<compute_t<T>>(p[k]));
  }
}

void read_strings(const std::byte* src, int64_t start, int64_t n, DataType to, Chunk& c) {
  const std::string* p = reinterpret_cast<const std::string*>(src) + start;
  if (is_integer_type(to)) {
    c.kind = Kind::I;
    const bool is_u64 = to == DataType::UInt64;
    for (int64_t k = 0; k < n; ++k) {
      const std::string t = trimmed(p[k]);
      const char* b = t.data();
      const char* e = b + t.size();
      if (!t.empty() && t[0] == '+') ++b;
      std::from_chars_result r{};
      if (is_u64 && b != e && *b != '-') {
        uint64_t u = 0;
        r = std::from_chars(b, e, u);
        c.i[k] = static_cast<int64_t>(u);
      } else {
        r = std::from_chars(b, e, c.i[k]);
      }
      if (r.ec != std::errc() || r.ptr != e || b == e) {
        c.i[k] = is_u64 ? static_cast<int64_t>(double_to_int<uint64_t>(parse_double(p[k], to)))
                        : double_to_int64(parse_double(p[k], to));
      }
    }
  } else {
    // To bool, strings parse as numbers or true/false (numpy would call every non-empty
    // string true, "0" and "False" included).
    c.kind = Kind::F;
    for (int64_t k = 0; k < n; ++k) {
      if (to == DataType::Bool) {
        std::string t = trimmed(p[k]);
        for (char& ch : t) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        if (t == "true" || t == "false") {
          c.f[k] = t == "true" ? 1.0 : 0.0;
          continue;
        }
      }
      c.f[k] = parse_double(p[k], to);
    }
  }
}

void read_chunk(const Tensor& in, int64_t start, int64_t n, DataType to, Chunk& c) {
  const std::byte* src = in.raw_data();
  const DataType dt = in.dtype();
  if (dt == DataType::String) return read_strings(src, start, n, to, c);
  if (const float* table = lowp::decode_table(dt)) {
    c.kind = Kind::F;
    if (dt == DataType::Float4E2M1) {
      for (int64_t k = 0; k < n; ++k) c.f[k] = table[lowp::get_packed(src, start + k, 4)];
    } else {
      const auto* p = reinterpret_cast<const uint8_t*>(src) + start;
      for (int64_t k = 0; k < n; ++k) c.f[k] = table[p[k]];
    }
    return;
  }
  if (const int bits = lowp::packed_bits(dt)) {
    c.kind = Kind::I;
    for (int64_t k = 0; k < n; ++k) {
      c.i[k] = lowp::packed_int_value(lowp::get_packed(src, start + k, bits), dt);
    }
    return;
  }
  dispatch(
      PodTypes{}, dt, [&]<typename T>() { read_typed<T>(src, start, n, c); }, "Cast input");
}

// ---- writers: the chunk into elements [start, start + n) of the target ----

template <typename T>
void write_typed(const Chunk& c, std::byte* dst, int64_t start, int64_t n) {
  T* p = reinterpret_cast<T*>(dst) + start;
  if constexpr (std::is_same_v<T, bool>) {
    for (int64_t k = 0; k < n; ++k) p[k] = c.kind == Kind::F ? c.f[k] != 0.0 : c.i[k] != 0;
  } else if constexpr (std::is_integral_v<T>) {
    if (c.kind == Kind::F) {
      for (int64_t k = 0; k < n; ++k) p[k] = double_to_int<T>(c.f[k]);
    } else {
      for (int64_t k = 0; k < n; ++k) p[k] = static_cast<T>(c.i[k]);
    }
  } else if constexpr (std::is_same_v<T, float16>) {
    for (int64_t k = 0; k < n; ++k) {
      const double v = c.kind == Kind::F   ? c.f[k]
                       : c.kind == Kind::I ? static_cast<double>(c.i[k])
                                           : static_cast<double>(static_cast<uint64_t>(c.i[k]));
      p[k] =
          float16::from_bits(static_cast<uint16_t>(lowp::encode_minifloat(v, lowp::kHalf, false)));
    }
  } else {
    using C = compute_t<T>;
    if (c.kind == Kind::F) {
      for (int64_t k = 0; k < n; ++k) p[k] = T(static_cast<C>(c.f[k]));
    } else if (c.kind == Kind::I) {
      for (int64_t k = 0; k < n; ++k) p[k] = T(static_cast<C>(c.i[k]));
    } else {
      for (int64_t k = 0; k < n; ++k) p[k] = T(static_cast<C>(static_cast<uint64_t>(c.i[k])));
    }
  }
}

double chunk_value(const Chunk& c, int64_t k) {
  if (c.kind == Kind::F) return c.f[k];
  if (c.kind == Kind::I) return static_cast<double>(c.i[k]);
  return static_cast<double>(static_cast<uint64_t>(c.i[k]));
}

void write_chunk(const Chunk& c, Tensor& out, int64_t start, int64_t n, const CastOptions& opt) {
  std::byte* dst = out.raw_data();
  const DataType dt = out.dtype();
  if (const int bits = lowp::packed_bits(dt)) {
    const lowp::MiniFloat* f = lowp::minifloat_format(dt);
    const uint32_t mask = (1u << bits) - 1;
    const int per_byte = 8 / bits;
    auto code = [&](int64_t k) -> uint32_t {
      if (f) return lowp::encode_minifloat(chunk_value(c, k), *f, true);
      const int64_t v = c.kind == Kind::F ? double_to_int64(c.f[k]) : c.i[k];
      return static_cast<uint32_t>(v) & mask;
    };
    auto* bytes = reinterpret_cast<uint8_t*>(dst) + start / per_byte;
    for (int64_t k = 0; k < n; k += per_byte) {
      uint32_t b = 0;
      for (int j = 0; j < per_byte && k + j < n; ++j) b |= code(k + j) << (j * bits);
      bytes[k / per_byte] = static_cast<uint8_t>(b);
    }
    return;
  }
  if (const lowp::MiniFloat* f = lowp::minifloat_format(dt)) {
    auto* p = reinterpret_cast<uint8_t*>(dst) + start;
    for (int64_t k = 0; k < n; ++k) {
      p[k] = static_cast<uint8_t>(lowp::encode_minifloat(chunk_value(c, k), *f, opt.saturate));
    }
    return;
  }
  if (dt == DataType::Float8E8M0) {
    auto* p = reinterpret_cast<uint8_t*>(dst) + start;
    for (int64_t k = 0; k < n; ++k) {
      p[k] = lowp::encode_e8m0(static_cast<float>(chunk_value(c, k)), opt.round, opt.saturate);
    }
    return;
  }
  dispatch(
      PodTypes{}, dt, [&]<typename T>() { write_typed<T>(c, dst, start, n); }, "Cast output");
}

// ---- numbers to strings, as numpy's astype(str) prints them ----

std::string float_to_string(double v, DataType src) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[64];
  std::to_chars_result r{};
  double cutoff = 1e6;
  if (src == DataType::Double) {
    r = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
    cutoff = 1e16;
  } else if (src == DataType::Float16) {
    // The fewest digits that read back as the same half.
    const uint16_t h = float16::from_float(static_cast<float>(v));
    int len = 0;
    for (int prec = 0; prec <= 5; ++prec) {
      len = std::snprintf(buf, sizeof(buf), "%.*e", prec, v);
      if (float16::from_float(std::strtof(buf, nullptr)) == h) break;
    }
    r.ptr = buf + len;
    cutoff = 1e3;
  } else {
    r = std::to_chars(buf, buf + sizeof(buf), static_cast<float>(v), std::chars_format::scientific);
  }
  const std::string sci(buf, r.ptr);
  const size_t epos = sci.find('e');
  const int exp10 = std::atoi(sci.c_str() + epos + 1);
  std::string digits;
  for (size_t i = 0; i < epos; ++i) {
    if (sci[i] >= '0' && sci[i] <= '9') digits += sci[i];
  }
  const std::string sign = std::signbit(v) ? "-" : "";
  const double a = std::abs(v);
  std::string s;
  if (a == 0 || (a >= 1e-4 && a < cutoff)) {
    if (exp10 >= 0) {
      const size_t int_len = static_cast<size_t>(exp10) + 1;
      if (digits.size() <= int_len) {
        s = digits + std::string(int_len - digits.size(), '0') + ".0";
      } else {
        s = digits.substr(0, int_len) + "." + digits.substr(int_len);
      }
    } else {
      s = "0." + std::string(static_cast<size_t>(-exp10 - 1), '0') + digits;
    }
  } else {
    s = digits.substr(0, 1);
    if (digits.size() > 1) s += "." + digits.substr(1);
    const int e = exp10 < 0 ? -exp10 : exp10;
    s += std::string(exp10 < 0 ? "e-" : "e+") + (e < 10 ? "0" : "") + std::to_string(e);
  }
  return sign + s;
}

void format_chunk(const Chunk& c, DataType src, std::string* out, int64_t n) {
  for (int64_t k = 0; k < n; ++k) {
    if (src == DataType::Bool) {
      out[k] = c.i[k] ? "True" : "False";
    } else if (c.kind == Kind::I) {
      out[k] = std::to_string(c.i[k]);
    } else if (c.kind == Kind::U) {
      out[k] = std::to_string(static_cast<uint64_t>(c.i[k]));
    } else {
      out[k] = float_to_string(c.f[k], src);
    }
  }
}

// Same-layout conversions common in real models, without the intermediate chunk.
template <typename TI, typename TO>
bool try_direct(const Tensor& in, Tensor& out) {
  if (in.dtype() != data_type_of<TI>() || out.dtype() != data_type_of<TO>()) return false;
  const TI* src = in.data<const TI>();
  TO* dst = out.data<TO>();
  parallel_for(in.numel(), 1 << 15, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k)
      dst[k] = TO(static_cast<compute_t<TO>>(static_cast<compute_t<TI>>(src[k])));
  });
  return true;
}

// float <-> float16 / bfloat16 through the dispatched conversion kernels (F16C or AVX-512
// where the processor has them), in blocks across threads.
bool half_vectorised(const Tensor& in, Tensor& out) {
  const math::ConvertKernels& cv = math::kernels().convert;
  using ToFloat = void (*)(const uint16_t*, float*, int64_t);
  using FromFloat = void (*)(const float*, uint16_t*, int64_t);
  ToFloat widen = nullptr;
  FromFloat narrow = nullptr;
  if (out.dtype() == DataType::Float) {
    if (in.dtype() == DataType::Float16) widen = cv.f16_to_f32;
    if (in.dtype() == DataType::BFloat16) widen = cv.bf16_to_f32;
  } else if (in.dtype() == DataType::Float) {
    if (out.dtype() == DataType::Float16) narrow = cv.f32_to_f16;
    if (out.dtype() == DataType::BFloat16) narrow = cv.f32_to_bf16;
  }
  if (!widen && !narrow) return false;
  const int64_t n = in.numel();
  parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) {
    if (widen) {
      widen(reinterpret_cast<const uint16_t*>(in.raw_data()) + b, out.data<float>() + b, e - b);
    } else {
      narrow(in.data<const float>() + b, reinterpret_cast<uint16_t*>(out.raw_data()) + b, e - b);
    }
  });
  return true;
}

void cast_tensor(const Tensor& in, Tensor& out, const CastOptions& opt) {
  if (half_vectorised(in, out) || try_direct<float, double>(in, out) ||
      try_direct<double, float>(in, out) || try_direct<int32_t, int64_t>(in, out) ||
      try_direct<int64_t, int32_t>(in, out) || try_direct<int64_t, float>(in, out) ||
      try_direct<int32_t, float>(in, out)) {
    return;
  }
  const int64_t n = in.numel();
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  const DataType to = out.dtype();
  parallel_for(chunks, std::max<int64_t>(1, (1 << 15) / kChunk), [&](int64_t b, int64_t e) {
    Chunk c;
    for (int64_t ch = b; ch < e; ++ch) {
      const int64_t start = ch * kChunk;
      const int64_t len = std::min(kChunk, n - start);
      read_chunk(in, start, len, to, c);
      if (to == DataType::String) {
        format_chunk(c, in.dtype(), out.data<std::string>() + start, len);
      } else {
        write_chunk(c, out, start, len, opt);
      }
    }
  });
}

bool castable(DataType t) {
  return t != DataType::Undefined && t != DataType::Complex64 && t != DataType::Complex128;
}

class CastBase : public Kernel {
 public:
  explicit CastBase(const NodeInfo& info) {
    opt_.saturate = info.attr_int("saturate", 1) != 0;
    const std::string mode = info.attr_string("round_mode", "up");
    if (mode == "up") {
      opt_.round = RoundMode::Up;
    } else if (mode == "down") {
      opt_.round = RoundMode::Down;
    } else if (mode == "nearest") {
      opt_.round = RoundMode::Nearest;
    } else {
      info.fail("round_mode must be 'up', 'down' or 'nearest', got '" + mode + "'");
    }
  }

 protected:
  void convert(OpContext& ctx, DataType to) {
    const Value& v = ctx.input_value(0);
    const Tensor& x = ctx.input(0);
    if (!castable(x.dtype())) throw_unsupported_type(x.dtype(), "Cast input");
    if (!castable(to)) throw_unsupported_type(to, "Cast target");
    if (x.dtype() == to) {
      ctx.set_output(0, v);  // nothing to convert: share the input
      return;
    }
    // Between types of one byte size or more and equal width, each element is read before
    // it is overwritten by its own converted value, so the input's buffer can be reused.
    const int bits = bits_per_element(x.dtype());
    if (bits >= 8 && bits == bits_per_element(to) && x.dtype() != DataType::String &&
        to != DataType::String && x.is_contiguous() && ctx.can_overwrite(0)) {
      Tensor y(to, x.shape(), x.storage(), x.byte_offset());
      cast_tensor(x, y, opt_);
      ctx.count_in_place();
      ctx.set_output(0, Value(std::move(y)));
      return;
    }
    Tensor& y = ctx.output(0, to, x.shape());
    cast_tensor(x, y, opt_);
  }
  CastOptions opt_;
};

class Cast final : public CastBase {
 public:
  explicit Cast(const NodeInfo& info) : CastBase(info) {
    const int64_t to = info.attr_int("to");
    if (to < INT32_MIN || to > INT32_MAX || !is_known_data_type(static_cast<int32_t>(to)) ||
        !castable(static_cast<DataType>(to))) {
      info.fail("Cast 'to' is not a supported element type: " + std::to_string(to),
                ErrorKind::Unsupported);
    }
    to_ = static_cast<DataType>(to);
  }
  void run(OpContext& ctx) override { convert(ctx, to_); }

 private:
  DataType to_;
};

class CastLike final : public CastBase {
 public:
  explicit CastLike(const NodeInfo& info) : CastBase(info) {}
  void run(OpContext& ctx) override { convert(ctx, ctx.input(1).dtype()); }
};

// Integer and bool values carry over (a value the target type cannot hold becomes unknown).
void cast_shape(ShapeContext& c) {
  const auto to = static_cast<DataType>(c.attr_int("to", 0));
  if (!is_known_data_type(static_cast<int32_t>(to))) unknown("bad 'to'");
  ValueFacts out = c.facts(0);
  out.dtype = to;
  const bool keep = is_integer_type(to) || to == DataType::Bool;
  const auto convert = [&](int64_t v) -> std::optional<int64_t> {
    if (to == DataType::Bool) return v != 0;
    if (to == DataType::Int32 && (v < INT32_MIN || v > INT32_MAX)) return std::nullopt;
    if (to != DataType::Int64 && to != DataType::Int32) return std::nullopt;
    return v;
  };
  std::vector<std::optional<int64_t>> elems;
  for (size_t k = 0; keep && k < out.num_elems(); ++k) {
    const std::optional<int64_t> e = out.elem(k);
    elems.push_back(e ? convert(*e) : std::nullopt);
  }
  out.has_data = false;
  out.data.clear();
  out.elems = std::move(elems);
  c.set(0, std::move(out));
}

void cast_like_shape(ShapeContext& c) {
  same_shape_as(c, c.facts(1).dtype);
}

// A cast to the same type is the input; one between types of the same width writes over a
// writable contiguous input (see CastBase::convert).
void place_cast(Placement& p) {
  const ValueFacts& x = p.input(0);
  const DataType to = p.output(0).dtype;
  const int bits = bits_per_element(x.dtype);
  if (x.dtype == to) {
    p.view(0, 0, p.strides(0));
  } else if (bits >= 8 && bits == bits_per_element(to) && x.dtype != DataType::String &&
             to != DataType::String && p.contiguous(0) && p.writable(0)) {
    p.view(0, 0, {});
  } else {
    p.allocate(0);
  }
}

}  // namespace

KILN_REGISTER_OP({.op = "Cast",
                  .since = 6,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .in_place = inputs(0),
                  .types = "all but complex (float8, float4, int4, int2, string included)",
                  .shape = cast_shape,
                  .place = place_cast,
                  .create = make<Cast>});
KILN_REGISTER_OP({.op = "CastLike",
                  .since = 15,
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "all but complex (float8, float4, int4, int2, string included)",
                  .shape = cast_like_shape,
                  .place = place_cast,
                  .create = make<CastLike>});

}  // namespace kiln::ops

// Cast, BitCast, quantization and integer matmul/conv kernels against naive references.
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "ops/core/float8.h"
#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

// ---- an independent description of the small float formats ----

struct Fmt {
  DataType dt;
  int ebits, mbits, bias;
  bool fnuz;     // NaN is 0x80, no negative zero, no infinity
  bool has_inf;  // IEEE-like top exponent (E5M2)
  bool no_nan;   // float4e2m1
};

const Fmt kFormats[] = {
    {DataType::Float8E4M3FN, 4, 3, 7, false, false, false},
    {DataType::Float8E4M3FNUZ, 4, 3, 8, true, false, false},
    {DataType::Float8E5M2, 5, 2, 15, false, true, false},
    {DataType::Float8E5M2FNUZ, 5, 2, 16, true, false, false},
    {DataType::Float4E2M1, 2, 1, 1, false, false, true},
};

int code_count(const Fmt& f) {
  return 1 << (1 + f.ebits + f.mbits);
}

double naive_decode(uint32_t code, const Fmt& f) {
  const int total = f.ebits + f.mbits;
  const bool neg = (code >> total) & 1;
  const uint32_t e = (code >> f.mbits) & ((1u << f.ebits) - 1);
  const uint32_t m = code & ((1u << f.mbits) - 1);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (f.fnuz && code == (1u << total)) return nan;
  if (f.has_inf && e == (1u << f.ebits) - 1) {
    return m == 0 ? (neg ? -1 : 1) * std::numeric_limits<double>::infinity() : nan;
  }
  if (!f.fnuz && !f.has_inf && !f.no_nan && e == (1u << f.ebits) - 1 && m == (1u << f.mbits) - 1) {
    return nan;  // E4M3FN: only S.1111.111 is NaN
  }
  const double mant = e == 0 ? m / std::ldexp(1.0, f.mbits) : 1 + m / std::ldexp(1.0, f.mbits);
  const double v = std::ldexp(mant, (e == 0 ? 1 : static_cast<int>(e)) - f.bias);
  return neg ? -v : v;
}

// Nearest code by exhaustive search, ties to the even code, with overflow where rounding
// would pass the largest finite value.
uint32_t naive_encode(double x, const Fmt& f, bool saturate) {
  const int total = f.ebits + f.mbits;
  const uint32_t sign = std::signbit(x) ? (1u << total) : 0u;
  double max = 0, below_max = 0;
  uint32_t max_code = 0;
  for (uint32_t c = 0; c < (1u << total); ++c) {
    const double v = naive_decode(c, f);
    if (std::isfinite(v) && v > max) below_max = max, max = v, max_code = c;
  }
  const uint32_t nan_code = f.fnuz ? (1u << total) : f.no_nan ? 0 : (sign | ((1u << total) - 1));
  // float4 has no NaN: ml_dtypes gives the zero whose sign bit is the opposite of x's.
  if (std::isnan(x) && f.no_nan) return std::signbit(x) ? 0u : (1u << total);
  if (std::isnan(x)) return nan_code;
  const double a = std::abs(x);
  const double limit = max + (max - below_max) / 2;
  if (a > limit || (a == limit && (max_code & 1))) {
    if (saturate || f.no_nan) return sign | max_code;
    if (f.has_inf) return sign | (((1u << f.ebits) - 1) << f.mbits);
    return nan_code;
  }
  uint32_t best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (uint32_t c = 0; c <= max_code; ++c) {
    const double err = std::abs(naive_decode(c, f) - a);
    if (err < best_err || (err == best_err && (c & 1) == 0)) best = c, best_err = err;
  }
  if (best == 0 && f.fnuz) return 0;
  return sign | best;
}

bool same_code(uint32_t a, uint32_t b, const Fmt& f) {
  const double va = naive_decode(a, f), vb = naive_decode(b, f);
  if (std::isnan(va) || std::isnan(vb)) return std::isnan(va) && std::isnan(vb);
  return a == b;
}

Tensor bytes_tensor(DataType dt, Shape shape, const std::vector<uint8_t>& bytes) {
  Tensor t = Tensor::zeros(dt, std::move(shape));
  REQUIRE(t.nbytes() == bytes.size());
  std::memcpy(t.raw_data(), bytes.data(), bytes.size());
  return t;
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const auto* p = reinterpret_cast<const uint8_t*>(t.raw_data());
  return std::vector<uint8_t>(p, p + t.nbytes());
}

uint32_t code_at(const Tensor& t, int64_t i) {
  const int bits = ops::lowp::packed_bits(t.dtype());
  if (bits) return ops::lowp::get_packed(t.raw_data(), i, bits);
  return reinterpret_cast<const uint8_t*>(t.raw_data())[i];
}

// Values that probe rounding: random, exact midpoints between codes, specials.
std::vector<float> probe_values(const Fmt& f, std::mt19937& rng) {
  std::vector<float> v;
  double max = 0;
  for (int c = 0; c < code_count(f) / 2; ++c) {
    const double a = naive_decode(static_cast<uint32_t>(c), f), b = naive_decode(c + 1u, f);
    if (std::isfinite(a)) max = std::max(max, a);
    if (std::isfinite(a) && std::isfinite(b)) {
      v.push_back(static_cast<float>((a + b) / 2));
      v.push_back(static_cast<float>(-(a + b) / 2));
      v.push_back(static_cast<float>(a));
    }
  }
  std::uniform_real_distribution<double> d(-1.3 * max, 1.3 * max);
  std::uniform_real_distribution<double> e(-30, 30);
  for (int i = 0; i < 300; ++i) {
    v.push_back(static_cast<float>(d(rng)));
    v.push_back(static_cast<float>(std::ldexp(d(rng) / max, static_cast<int>(e(rng)))));
  }
  for (float s : {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                  -std::numeric_limits<float>::quiet_NaN(), 1e-30f, -1e-30f, 1e30f}) {
    v.push_back(s);
  }
  v.push_back(static_cast<float>(max * 1.5 + 1));
  return v;
}

}  // namespace

TEST_CASE("float8 and float4 codes decode to their values and encode back", "[cast]") {
  for (const Fmt& f : kFormats) {
    const ops::lowp::MiniFloat* mf = ops::lowp::minifloat_format(f.dt);
    REQUIRE(mf != nullptr);
    for (int c = 0; c < code_count(f); ++c) {
      const auto code = static_cast<uint32_t>(c);
      INFO(data_type_name(f.dt) << " code " << c);
      const double expected = naive_decode(code, f);
      const double got = ops::lowp::decode_minifloat(code, *mf);
      if (std::isnan(expected)) {
        REQUIRE(std::isnan(got));
        continue;
      }
      REQUIRE(got == expected);
      REQUIRE(std::signbit(got) == std::signbit(expected));
      for (bool sat : {false, true}) {
        const uint32_t back = ops::lowp::encode_minifloat(got, *mf, sat);
        // Infinity saturates to the largest finite value; everything else survives.
        if (std::isinf(expected) && sat) {
          REQUIRE(back == ((code & 0x80) | mf->max_code));
        } else {
          REQUIRE(back == code);
        }
      }
    }
  }
  // Spot values everyone agrees on.
  CHECK(ops::lowp::decode_minifloat(0x7e, ops::lowp::kE4M3FN) == 448.0f);
  CHECK(ops::lowp::decode_minifloat(0x7f, ops::lowp::kE4M3FNUZ) == 240.0f);
  CHECK(ops::lowp::decode_minifloat(0x7b, ops::lowp::kE5M2) == 57344.0f);
  CHECK(ops::lowp::decode_minifloat(0x7, ops::lowp::kE2M1) == 6.0f);
  CHECK(ops::lowp::decode_minifloat(0x1, ops::lowp::kE2M1) == 0.5f);
}

TEST_CASE("float8 and float4 encoding matches an exhaustive nearest-even search", "[cast]") {
  std::mt19937 rng(11);
  for (const Fmt& f : kFormats) {
    const ops::lowp::MiniFloat* mf = ops::lowp::minifloat_format(f.dt);
    for (float x : probe_values(f, rng)) {
      for (bool sat : {false, true}) {
        INFO(data_type_name(f.dt) << " x=" << x << " saturate=" << sat);
        const uint32_t got = ops::lowp::encode_minifloat(x, *mf, sat);
        REQUIRE(same_code(got, naive_encode(x, f, sat), f));
      }
    }
  }
}

TEST_CASE("float16 encoding from double agrees with float16::from_float", "[cast]") {
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    const float x = std::bit_cast<float>(bits(rng));
    if (std::isnan(x)) continue;
    REQUIRE(ops::lowp::encode_minifloat(x, ops::lowp::kHalf, false) == float16::from_float(x));
  }
}

TEST_CASE("float8e8m0 round modes and the full code table", "[cast]") {
  using ops::lowp::RoundMode;
  // 2^-127 is a float subnormal: like the ONNX reference, "up" sees a fraction and rounds.
  CHECK(ops::lowp::decode_e8m0(0) == std::ldexp(1.0f, -127));
  CHECK(ops::lowp::encode_e8m0(std::ldexp(1.0f, -127), RoundMode::Down, true) == 0);
  CHECK(ops::lowp::encode_e8m0(std::ldexp(1.0f, -127), RoundMode::Nearest, true) == 0);
  CHECK(ops::lowp::encode_e8m0(std::ldexp(1.0f, -127), RoundMode::Up, true) == 1);
  for (int c = 1; c < 255; ++c) {
    const float v = ops::lowp::decode_e8m0(static_cast<uint8_t>(c));
    REQUIRE(v == static_cast<float>(std::ldexp(1.0, c - 127)));
    for (RoundMode m : {RoundMode::Up, RoundMode::Down, RoundMode::Nearest}) {
      REQUIRE(ops::lowp::encode_e8m0(v, m, true) == c);
    }
  }
  CHECK(std::isnan(ops::lowp::decode_e8m0(0xff)));
  std::mt19937 rng(9);
  std::uniform_real_distribution<double> d(-40, 40);
  for (int i = 0; i < 2000; ++i) {
    const float x = static_cast<float>(std::exp2(d(rng)));
    const int e = std::ilogb(x);  // x in [2^e, 2^(e+1))
    const bool exact = x == std::ldexp(1.0f, e);
    const double ratio = x / std::ldexp(1.0, e);  // in [1, 2)
    CHECK(ops::lowp::encode_e8m0(x, RoundMode::Down, true) == e + 127);
    CHECK(ops::lowp::encode_e8m0(x, RoundMode::Up, true) == e + 127 + (exact ? 0 : 1));
    CHECK(ops::lowp::encode_e8m0(x, RoundMode::Nearest, true) == e + 127 + (ratio >= 1.5 ? 1 : 0));
  }
  CHECK(ops::lowp::encode_e8m0(std::numeric_limits<float>::max(), RoundMode::Up, true) == 0xfe);
  CHECK(ops::lowp::encode_e8m0(std::numeric_limits<float>::max(), RoundMode::Up, false) == 0xff);
}

TEST_CASE("Cast float to float8/float4 through the op matches the naive search", "[cast]") {
  std::mt19937 rng(21);
  for (const Fmt& f : kFormats) {
    const std::vector<float> xs = probe_values(f, rng);
    const Tensor x = Tensor::from_vector<float>({static_cast<int64_t>(xs.size())}, xs);
    for (int sat : {0, 1}) {
      INFO(data_type_name(f.dt) << " saturate=" << sat);
      const Tensor y = OpTest("Cast", 25)
                           .input(x)
                           .attr("to", static_cast<int64_t>(f.dt))
                           .attr("saturate", sat)
                           .run1();
      REQUIRE(y.dtype() == f.dt);
      for (size_t i = 0; i < xs.size(); ++i) {
        INFO("x=" << xs[i]);
        REQUIRE(same_code(code_at(y, static_cast<int64_t>(i)),
                          naive_encode(xs[i], f, sat || f.no_nan), f));
      }
      // And back to float: the decoded codes.
      const Tensor back = OpTest("Cast", 25).input(y).attr("to", int64_t{1}).run1();
      for (size_t i = 0; i < xs.size(); ++i) {
        const double want = naive_decode(code_at(y, static_cast<int64_t>(i)), f);
        const double got = back.data<float>()[i];
        REQUIRE(((std::isnan(want) && std::isnan(got)) || want == got));
      }
    }
  }
}

TEST_CASE("Cast between standard types matches static_cast semantics", "[cast]") {
  std::mt19937 rng(3);
  const Tensor x = random_tensor(DataType::Float, {4, 33}, rng, -100, 100);
  struct Target {
    DataType dt;
    double (*ref)(float);
  };
  const Target targets[] = {
      {DataType::Double, [](float v) { return static_cast<double>(v); }},
      {DataType::Int8, [](float v) { return static_cast<double>(static_cast<int8_t>(v)); }},
      {DataType::Int16, [](float v) { return static_cast<double>(static_cast<int16_t>(v)); }},
      {DataType::Int32, [](float v) { return static_cast<double>(static_cast<int32_t>(v)); }},
      {DataType::Int64, [](float v) { return static_cast<double>(static_cast<int64_t>(v)); }},
      {DataType::UInt8,
       [](float v) {  // numpy wraps negatives modulo 256
         return static_cast<double>(static_cast<uint8_t>(static_cast<int64_t>(v)));
       }},
      {DataType::UInt32,
       [](float v) { return static_cast<double>(static_cast<uint32_t>(static_cast<int64_t>(v))); }},
      {DataType::Bool, [](float v) { return v != 0 ? 1.0 : 0.0; }},
      {DataType::Float16, [](float v) { return static_cast<double>(float16(v)); }},
      {DataType::BFloat16, [](float v) { return static_cast<double>(bfloat16(v)); }},
  };
  for (const Target& t : targets) {
    INFO(data_type_name(t.dt));
    const Tensor y = OpTest("Cast", 13).input(x).attr("to", static_cast<int64_t>(t.dt)).run1();
    REQUIRE(y.dtype() == t.dt);
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double got = t.dt == DataType::Bool ? (y.data<bool>()[i] ? 1.0 : 0.0) : element(y, i);
      REQUIRE(got == t.ref(x.data<float>()[i]));
    }
    if (t.dt == DataType::Bool) continue;
    // Back to float through the chunked path too (a large tensor crosses chunk boundaries).
    const Tensor back = OpTest("Cast", 13).input(y).attr("to", int64_t{1}).run1();
    for (int64_t i = 0; i < x.numel(); ++i)
      REQUIRE(back.data<float>()[i] == static_cast<float>(element(y, i)));
  }
  // int64 -> float rounds once (not through double), uint64 keeps its top bit.
  const Tensor big =
      Tensor::from_vector<int64_t>({2}, {(int64_t{1} << 53) + 1, -(int64_t{1} << 60) - 1});
  const Tensor fb = OpTest("Cast", 13).input(big).attr("to", int64_t{1}).run1();
  CHECK(fb.data<float>()[0] == static_cast<float>((int64_t{1} << 53) + 1));
  const Tensor u = Tensor::from_vector<uint64_t>({1}, {~uint64_t{0}});
  CHECK(OpTest("Cast", 13).input(u).attr("to", int64_t{11}).run1().data<double>()[0] ==
        18446744073709551616.0);
  CHECK(OpTest("Cast", 13).input(u).attr("to", int64_t{7}).run1().data<int64_t>()[0] == -1);
}

TEST_CASE("Cast to and from packed int4/uint4/int2/uint2 wraps like ml_dtypes", "[cast]") {
  const Tensor x = Tensor::from_vector<float>({7}, {-9.0f, 2.7f, -2.7f, 9.5f, 15.0f, NAN, 1.0f});
  const Tensor i4 = OpTest("Cast", 25).input(x).attr("to", int64_t{22}).run1();
  // -9 -> 7, 2.7 -> 2, -2.7 -> -2 (0xe), 9.5 -> 9 -> -7 (0x9), 15 -> -1, NaN -> 0, 1; pad 0.
  CHECK(bytes_of(i4) == std::vector<uint8_t>{0x27, 0x9e, 0x0f, 0x01});
  const Tensor back = OpTest("Cast", 25).input(i4).attr("to", int64_t{3}).run1();
  CHECK(back.to_vector<int8_t>() == std::vector<int8_t>{7, 2, -2, -7, -1, 0, 1});
  const Tensor u2 = OpTest("Cast", 25).input(x).attr("to", int64_t{25}).run1();
  // -9 -> 3, 2 -> 2, -2 -> 2, 9 -> 1 | 15 -> 3, NaN -> 0, 1 -> 1
  CHECK(bytes_of(u2) == std::vector<uint8_t>{0x6b, 0x13});
  const Tensor i2 = bytes_tensor(DataType::Int2, {5}, {0x39, 0x02});
  CHECK(OpTest("Cast", 25).input(i2).attr("to", int64_t{7}).run1().to_vector<int64_t>() ==
        std::vector<int64_t>{1, -2, -1, 0, -2});
}

TEST_CASE("Cast to strings prints like numpy, and strings parse back", "[cast]") {
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor f =
      Tensor::from_vector<float>({15}, {1.0f, 1e-7f, NAN, inf, -inf, 1e6f, 1e16f, 1.5e-5f, 1e-4f,
                                        123456789.0f, 0.1f, -0.0f, 999999.0f, 0.00012f, 123456.0f});
  CHECK(OpTest("Cast", 13).input(f).attr("to", int64_t{8}).run1().to_vector<std::string>() ==
        std::vector<std::string>{"1.0", "1e-07", "nan", "inf", "-inf", "1e+06", "1e+16", "1.5e-05",
                                 "1e-04", "1.2345679e+08", "0.1", "-0.0", "999999.0", "0.00012",
                                 "123456.0"});
  const Tensor d = Tensor::from_vector<double>({6}, {1.0, 1e-7, 1e6, 1e16, 0.1, 1.0 / 3});
  CHECK(
      OpTest("Cast", 13).input(d).attr("to", int64_t{8}).run1().to_vector<std::string>() ==
      std::vector<std::string>{"1.0", "1e-07", "1000000.0", "1e+16", "0.1", "0.3333333333333333"});
  const Tensor h =
      Tensor::from_vector<float16>({6}, {float16(1.0f), float16(1e-7f), float16(1e4f),
                                         float16(0.1f), float16(1.0f / 3), float16(65504.0f)});
  CHECK(OpTest("Cast", 13).input(h).attr("to", int64_t{8}).run1().to_vector<std::string>() ==
        std::vector<std::string>{"1.0", "1e-07", "1e+04", "0.1", "0.3333", "6.55e+04"});
  const Tensor b = Tensor::from_vector<bool>({2}, {true, false});
  CHECK(OpTest("Cast", 13).input(b).attr("to", int64_t{8}).run1().to_vector<std::string>() ==
        std::vector<std::string>{"True", "False"});
  const Tensor i = Tensor::from_vector<int8_t>({2}, {1, -5});
  CHECK(OpTest("Cast", 13).input(i).attr("to", int64_t{8}).run1().to_vector<std::string>() ==
        std::vector<std::string>{"1", "-5"});

  const Tensor s =
      Tensor::from_vector<std::string>({7}, {"1.5", "NaN", "INF", "-INF", "+INF", " 2 ", "1e3"});
  const Tensor sf = OpTest("Cast", 13).input(s).attr("to", int64_t{1}).run1();
  const std::vector<float> v = sf.to_vector<float>();
  CHECK(v[0] == 1.5f);
  CHECK(std::isnan(v[1]));
  CHECK(v[2] == inf);
  CHECK(v[3] == -inf);
  CHECK(v[4] == inf);
  CHECK(v[5] == 2.0f);
  CHECK(v[6] == 1000.0f);
  const Tensor si = Tensor::from_vector<std::string>({3}, {"12", "-3", "9223372036854775807"});
  CHECK(OpTest("Cast", 13).input(si).attr("to", int64_t{7}).run1().to_vector<int64_t>() ==
        std::vector<int64_t>{12, -3, INT64_MAX});
  const Tensor bad = Tensor::from_vector<std::string>({1}, {"abc"});
  REQUIRE_THROWS_AS(OpTest("Cast", 13).input(bad).attr("to", int64_t{1}).run(), Error);
}

TEST_CASE("CastLike takes the target type from its second input", "[cast]") {
  const Tensor x = Tensor::from_vector<float>({3}, {1.5f, 500.0f, -1e-9f});
  const Tensor like = Tensor::zeros(DataType::Float8E4M3FN, {0});
  const Tensor y = OpTest("CastLike", 19).input(x).input(like).attr("saturate", 0).run1();
  CHECK(y.dtype() == DataType::Float8E4M3FN);
  CHECK(bytes_of(y) == std::vector<uint8_t>{0x3c, 0x7f, 0x80});
  const Tensor same =
      OpTest("CastLike", 15).input(x).input(Tensor::zeros(DataType::Float, {1})).run1();
  CHECK(same.to_vector<float>() == x.to_vector<float>());
}

TEST_CASE("Cast errors: unknown target, bad round_mode", "[cast]") {
  const Tensor x = Tensor::from_vector<float>({1}, {1.0f});
  REQUIRE_THROWS_AS(OpTest("Cast", 13).input(x).attr("to", int64_t{999}).run(), Error);
  REQUIRE_THROWS_AS(OpTest("Cast", 13).input(x).attr("to", int64_t{0}).run(), Error);
  REQUIRE_THROWS_AS(OpTest("Cast", 13).input(x).attr("to", int64_t{14}).run(), Error);
  REQUIRE_THROWS_AS(OpTest("Cast", 13).input(x).run(), Error);  // 'to' is required
  REQUIRE_THROWS_AS(
      OpTest("Cast", 25).input(x).attr("to", int64_t{24}).attr("round_mode", "sideways").run(),
      Error);
}

TEST_CASE("BitCast reinterprets bits without copying", "[cast]") {
  const Tensor x = Tensor::from_vector<float>({2}, {1.0f, -2.0f});
  OpTest t("BitCast", 26);
  const Tensor y = t.input(x).attr("to", int64_t{6}).run1();
  CHECK(y.to_vector<int32_t>() ==
        std::vector<int32_t>{0x3f800000, static_cast<int32_t>(0xc0000000)});
  CHECK(t.stats().bytes_copied == 0);
  REQUIRE_THROWS_AS(OpTest("BitCast", 26).input(x).attr("to", int64_t{7}).run(), Error);
  REQUIRE_THROWS_AS(OpTest("BitCast", 26).input(x).attr("to", int64_t{8}).run(), Error);
  const Tensor u = Tensor::from_vector<uint8_t>({3}, {0, 1, 7});
  const Tensor b = OpTest("BitCast", 26).input(u).attr("to", int64_t{9}).run1();
  CHECK(b.to_vector<bool>() == std::vector<bool>{false, true, true});
}

// ---- quantization ----

namespace {

// Flat index of x's element `i` in a scale of shape `sshape` (per tensor, per axis, blocked).
int64_t scale_index(const Shape& xs, const Shape& sshape, int64_t axis, int64_t block, int64_t i) {
  if (shape_numel(sshape) == 1) return 0;
  Shape idx(xs.size());
  for (size_t d = xs.size(); d-- > 0;) idx[d] = i % xs[d], i /= xs[d];
  if (block == 0) return idx[static_cast<size_t>(axis)];
  idx[static_cast<size_t>(axis)] /= block;
  int64_t flat = 0;
  for (size_t d = 0; d < xs.size(); ++d) flat = flat * sshape[d] + idx[d];
  return flat;
}

struct QuantCase {
  Shape x, scale;
  int64_t axis, block;
};

QuantCase random_quant_case(std::mt19937& rng) {
  QuantCase c;
  const size_t rank = std::uniform_int_distribution<size_t>(1, 4)(rng);
  c.x = random_shape(rank, 6, rng);
  c.axis = std::uniform_int_distribution<int64_t>(0, static_cast<int64_t>(rank) - 1)(rng);
  const int mode = std::uniform_int_distribution<int>(0, 2)(rng);
  c.block = 0;
  if (mode == 0) {
    c.scale = {};
  } else if (mode == 1) {
    c.scale = {c.x[static_cast<size_t>(c.axis)]};
  } else {
    c.block = std::uniform_int_distribution<int64_t>(1, 4)(rng);
    c.scale = c.x;
    const int64_t a = c.x[static_cast<size_t>(c.axis)];
    c.scale[static_cast<size_t>(c.axis)] = (a + c.block - 1) / c.block;
  }
  return c;
}

}  // namespace

TEST_CASE("QuantizeLinear per tensor, per axis and blocked match a naive loop", "[cast]") {
  std::mt19937 rng(17);
  const DataType outs[] = {DataType::UInt8, DataType::Int8,  DataType::Int16, DataType::UInt16,
                           DataType::Int4,  DataType::UInt4, DataType::Int2};
  for (int iter = 0; iter < 60; ++iter) {
    const QuantCase c = random_quant_case(rng);
    const DataType out_t = outs[iter % 7];
    const Tensor x = random_tensor(DataType::Float, c.x, rng, -300, 300);
    const Tensor scale = random_tensor(DataType::Float, c.scale, rng, 0.5, 8);
    int64_t lo = 0, hi = 0;
    ops::lowp::integer_range(out_t, lo, hi);
    // A zero point tensor of the output type, values stored through Cast.
    const Tensor zf = random_tensor(DataType::Float, c.scale, rng, static_cast<double>(lo),
                                    static_cast<double>(hi));
    const Tensor zp = OpTest("Cast", 25).input(zf).attr("to", static_cast<int64_t>(out_t)).run1();
    INFO(shape_to_string(c.x) << " scale " << shape_to_string(c.scale) << " axis " << c.axis
                              << " block " << c.block << " " << data_type_name(out_t));
    OpTest t("QuantizeLinear", 25);
    t.input(x).input(scale).input(zp).attr("axis", c.axis);
    if (c.block) t.attr("block_size", c.block);
    const Tensor y = t.run1();
    REQUIRE(y.dtype() == out_t);
    const Tensor zd = OpTest("Cast", 25).input(zp).attr("to", int64_t{1}).run1();
    const Tensor yd = OpTest("Cast", 25).input(y).attr("to", int64_t{1}).run1();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const int64_t si = scale_index(c.x, c.scale, c.axis, c.block, i);
      const float q = x.data<float>()[i] / scale.data<float>()[si];
      const double want = std::clamp(static_cast<double>(std::nearbyint(q) + zd.data<float>()[si]),
                                     static_cast<double>(lo), static_cast<double>(hi));
      REQUIRE(yd.data<float>()[i] == want);
    }
    // Dequantize back with the same layout.
    OpTest dq("DequantizeLinear", 25);
    dq.input(y).input(scale).input(zp).attr("axis", c.axis);
    if (c.block) dq.attr("block_size", c.block);
    const Tensor r = dq.run1();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const int64_t si = scale_index(c.x, c.scale, c.axis, c.block, i);
      const float want = (yd.data<float>()[i] - zd.data<float>()[si]) * scale.data<float>()[si];
      REQUIRE(r.data<float>()[i] == want);
    }
  }
}

TEST_CASE("QuantizeLinear to float8 saturates, output_dtype and default uint8", "[cast]") {
  const Tensor x = Tensor::from_vector<float>({4}, {0.0f, 2.0f, 100000.0f, -7.0f});
  const Tensor s = Tensor::scalar<float>(2.0f);
  const Tensor y = OpTest("QuantizeLinear", 21)
                       .input(x)
                       .input(s)
                       .attr("output_dtype", static_cast<int64_t>(DataType::Float8E4M3FN))
                       .run1();
  CHECK(bytes_of(y) == std::vector<uint8_t>{0x00, 0x38, 0x7e, 0xc6});
  const Tensor ns = OpTest("QuantizeLinear", 21)
                        .input(x)
                        .input(s)
                        .attr("output_dtype", static_cast<int64_t>(DataType::Float8E4M3FN))
                        .attr("saturate", 0)
                        .run1();
  CHECK(bytes_of(ns)[2] == 0x7f);
  const Tensor u = OpTest("QuantizeLinear", 13).input(x).input(s).run1();
  CHECK(u.to_vector<uint8_t>() == std::vector<uint8_t>{0, 1, 255, 0});
  // float16 input divides in float16, as numpy does.
  const Tensor h = Tensor::from_vector<float16>({1}, {float16(3.0f)});
  const Tensor hs = Tensor::scalar<float16>(float16(2.0f));
  CHECK(OpTest("QuantizeLinear", 21).input(h).input(hs).run1().to_vector<uint8_t>() ==
        std::vector<uint8_t>{2});  // 1.5 rounds to even
}

TEST_CASE("QuantizeLinear and DequantizeLinear reject bad layouts and types", "[cast]") {
  const Tensor x = Tensor::zeros(DataType::Float, {2, 4});
  const Tensor s3 = Tensor::from_vector<float>({3}, {1, 1, 1});
  const Tensor sblk = Tensor::from_vector<float>({2, 1}, {1, 1});
  const Tensor zp_i8 = Tensor::from_vector<int8_t>({2}, {0, 0});
  const Tensor s2 = Tensor::from_vector<float>({2}, {1, 1});
  REQUIRE_THROWS_AS(OpTest("QuantizeLinear", 21).input(x).input(s3).attr("axis", 1).run(), Error);
  REQUIRE_THROWS_AS(OpTest("QuantizeLinear", 21).input(x).input(s2).attr("axis", 2).run(), Error);
  REQUIRE_THROWS_AS(
      OpTest("QuantizeLinear", 21).input(x).input(sblk).attr("axis", 1).attr("block_size", 2).run(),
      Error);
  REQUIRE_THROWS_AS(OpTest("QuantizeLinear", 21).input(x).input(s2).attr("block_size", -1).run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("QuantizeLinear", 21)
                        .input(x)
                        .input(s2)
                        .input(zp_i8)
                        .attr("axis", 0)
                        .attr("output_dtype", int64_t{2})
                        .run(),
                    Error);
  REQUIRE_THROWS_AS(
      OpTest("QuantizeLinear", 21).input(x).input(s2).attr("output_dtype", int64_t{1}).run(),
      Error);
  const Tensor q = Tensor::zeros(DataType::UInt8, {2, 4});
  REQUIRE_THROWS_AS(
      OpTest("DequantizeLinear", 21).input(q).input(s2).input(zp_i8).attr("axis", 0).run(), Error);
  REQUIRE_THROWS_AS(OpTest("DequantizeLinear", 21).input(x).input(s2).attr("axis", 0).run(), Error);
}

TEST_CASE("DynamicQuantizeLinear matches the reference formula", "[cast]") {
  std::mt19937 rng(23);
  for (int iter = 0; iter < 10; ++iter) {
    const Tensor x = random_tensor(DataType::Float, random_shape(2, 40, rng), rng,
                                   iter % 2 ? 0.5 : -3.0, iter % 3 ? 4.0 : -0.5);
    const auto outs = OpTest("DynamicQuantizeLinear", 11).input(x).outputs(3).run();
    float mn = 0, mx = 0;
    for (float v : x.to_vector<float>()) mn = std::min(mn, v), mx = std::max(mx, v);
    const float scale = (mx - mn) / 255.0f;
    const float zp = std::nearbyint(std::clamp(-mn / scale, 0.0f, 255.0f));
    CHECK(outs[1].tensor().data<float>()[0] == scale);
    CHECK(outs[2].tensor().data<uint8_t>()[0] == static_cast<uint8_t>(zp));
    const Tensor& y = outs[0].tensor();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const float q = std::clamp(std::nearbyint(x.data<float>()[i] / scale) + zp, 0.0f, 255.0f);
      REQUIRE(y.data<uint8_t>()[i] == static_cast<uint8_t>(q));
    }
  }
}

// ---- integer matmul and conv ----

namespace {

// Naive batched matmul with numpy broadcasting of batch dims, on int64 values.
std::vector<int64_t> naive_matmul(const std::vector<int64_t>& a, const Shape& as,
                                  const std::vector<int64_t>& b, const Shape& bs, Shape& out) {
  const int64_t M = as[as.size() - 2], K = as.back(), N = bs.back();
  const Shape ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
  out = ab.size() >= bb.size() ? ab : bb;
  for (size_t i = 0; i < out.size(); ++i) {
    const size_t oa = out.size() - ab.size(), ob = out.size() - bb.size();
    const int64_t da = i >= oa ? ab[i - oa] : 1, db = i >= ob ? bb[i - ob] : 1;
    out[i] = std::max(da, db);
  }
  const int64_t batches = shape_numel(out);
  std::vector<int64_t> y(static_cast<size_t>(batches * M * N));
  for (int64_t bi = 0; bi < batches; ++bi) {
    int64_t rem = bi, ia = 0, ib = 0, sa = 1, sb = 1;
    for (size_t d = out.size(); d-- > 0;) {
      const int64_t c = rem % out[d];
      rem /= out[d];
      const size_t oa = out.size() - ab.size(), ob = out.size() - bb.size();
      if (d >= oa) ia += (ab[d - oa] == 1 ? 0 : c) * sa, sa *= ab[d - oa];
      if (d >= ob) ib += (bb[d - ob] == 1 ? 0 : c) * sb, sb *= bb[d - ob];
    }
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = 0; n < N; ++n) {
        int64_t acc = 0;
        for (int64_t k = 0; k < K; ++k) {
          acc += a[static_cast<size_t>((ia * M + m) * K + k)] *
                 b[static_cast<size_t>((ib * K + k) * N + n)];
        }
        y[static_cast<size_t>((bi * M + m) * N + n)] = acc;
      }
    }
  }
  out.push_back(M);
  out.push_back(N);
  return y;
}

std::vector<int64_t> ints_of(const Tensor& t) {
  std::vector<int64_t> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i)
    v[static_cast<size_t>(i)] = static_cast<int64_t>(element(t, i));
  return v;
}

}  // namespace

TEST_CASE("MatMulInteger matches a naive integer loop over random broadcast shapes", "[cast]") {
  std::mt19937 rng(29);
  for (int iter = 0; iter < 30; ++iter) {
    const int64_t M = std::uniform_int_distribution<int64_t>(1, 40)(rng);
    const int64_t K = std::uniform_int_distribution<int64_t>(1, 70)(rng);
    const int64_t N = std::uniform_int_distribution<int64_t>(1, 20)(rng);
    Shape as{M, K}, bs{K, N};
    if (iter % 3 == 1) as.insert(as.begin(), {2, 3});
    if (iter % 3 == 2) as.insert(as.begin(), 3), bs.insert(bs.begin(), {2, 1});
    const DataType ta = iter % 2 ? DataType::Int8 : DataType::UInt8;
    const DataType tb = iter % 4 < 2 ? DataType::UInt8 : DataType::Int8;
    const double alo = ta == DataType::Int8 ? -128 : 0, ahi = ta == DataType::Int8 ? 127 : 255;
    const double blo = tb == DataType::Int8 ? -128 : 0, bhi = tb == DataType::Int8 ? 127 : 255;
    const Tensor a = OpTest("Cast", 13)
                         .input(random_tensor(DataType::Int32, as, rng, alo, ahi))
                         .attr("to", static_cast<int64_t>(ta))
                         .run1();
    const Tensor b = OpTest("Cast", 13)
                         .input(random_tensor(DataType::Int32, bs, rng, blo, bhi))
                         .attr("to", static_cast<int64_t>(tb))
                         .run1();
    // a: per-row zero points; b: one zero point.
    const Tensor azp = OpTest("Cast", 13)
                           .input(random_tensor(DataType::Int32, {M}, rng, alo, ahi))
                           .attr("to", static_cast<int64_t>(ta))
                           .run1();
    const Tensor bzp = OpTest("Cast", 13)
                           .input(random_tensor(DataType::Int32, {}, rng, blo, bhi))
                           .attr("to", static_cast<int64_t>(tb))
                           .run1();
    std::vector<int64_t> av = ints_of(a), bv = ints_of(b);
    const std::vector<int64_t> az = ints_of(azp);
    for (size_t i = 0; i < av.size(); ++i)
      av[i] -= az[(i / static_cast<size_t>(K)) % static_cast<size_t>(M)];
    for (auto& v : bv) v -= ints_of(bzp)[0];
    Shape out;
    const std::vector<int64_t> want = naive_matmul(av, as, bv, bs, out);
    INFO(shape_to_string(as) << " x " << shape_to_string(bs));
    const Tensor y = OpTest("MatMulInteger", 10).input(a).input(b).input(azp).input(bzp).run1();
    REQUIRE(y.dtype() == DataType::Int32);
    REQUIRE(y.shape() == out);
    REQUIRE(ints_of(y) == want);
  }
}

TEST_CASE("QLinearMatMul requantizes a naive integer product", "[cast]") {
  std::mt19937 rng(31);
  const Shape as{3, 5, 7}, bs{7, 4};
  const Tensor a = OpTest("Cast", 13)
                       .input(random_tensor(DataType::Int32, as, rng, 0, 255))
                       .attr("to", int64_t{2})
                       .run1();
  const Tensor b = OpTest("Cast", 13)
                       .input(random_tensor(DataType::Int32, bs, rng, 0, 255))
                       .attr("to", int64_t{2})
                       .run1();
  const Tensor a_s = Tensor::scalar<float>(0.02f), b_s = Tensor::scalar<float>(0.03f);
  const Tensor y_s = Tensor::scalar<float>(0.5f);
  const Tensor a_z = Tensor::scalar<uint8_t>(120), b_z = Tensor::scalar<uint8_t>(130);
  const Tensor y_z = Tensor::scalar<uint8_t>(100);
  const Tensor y = OpTest("QLinearMatMul", 21)
                       .input(a)
                       .input(a_s)
                       .input(a_z)
                       .input(b)
                       .input(b_s)
                       .input(b_z)
                       .input(y_s)
                       .input(y_z)
                       .run1();
  std::vector<int64_t> av = ints_of(a), bv = ints_of(b);
  for (auto& v : av) v -= 120;
  for (auto& v : bv) v -= 130;
  Shape out;
  const std::vector<int64_t> acc = naive_matmul(av, as, bv, bs, out);
  REQUIRE(y.shape() == out);
  const double mult = static_cast<double>(0.02f * 0.03f / 0.5f);
  for (size_t i = 0; i < acc.size(); ++i) {
    const double want =
        std::clamp(std::nearbyint(static_cast<double>(acc[i]) * mult + 100), 0.0, 255.0);
    REQUIRE(static_cast<double>(y.data<uint8_t>()[i]) == want);
  }
}

TEST_CASE("MatMulInteger rejects bad shapes, types and zero points", "[cast]") {
  const Tensor a = Tensor::zeros(DataType::UInt8, {2, 3});
  const Tensor b = Tensor::zeros(DataType::UInt8, {4, 2});
  const Tensor b_ok = Tensor::zeros(DataType::UInt8, {3, 2});
  REQUIRE_THROWS_AS(OpTest("MatMulInteger", 10).input(a).input(b).run(), Error);
  REQUIRE_THROWS_AS(
      OpTest("MatMulInteger", 10).input(Tensor::zeros(DataType::Float, {2, 3})).input(b_ok).run(),
      Error);
  REQUIRE_THROWS_AS(OpTest("MatMulInteger", 10)
                        .input(a)
                        .input(b_ok)
                        .input(Tensor::zeros(DataType::UInt8, {5}))
                        .run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("MatMulInteger", 10)
                        .input(a)
                        .input(b_ok)
                        .input(Tensor::zeros(DataType::Int8, {}))
                        .run(),
                    Error);
}

namespace {

struct ConvCase {
  int64_t n, c, h, w, m, kh, kw, group, sh, sw, dh, dw, pt, pl, pb, pr;
};

// Direct 2-D convolution of centred values.
std::vector<int64_t> naive_conv(const std::vector<int64_t>& x, const std::vector<int64_t>& w,
                                const ConvCase& c, int64_t& oh, int64_t& ow) {
  oh = (c.h + c.pt + c.pb - ((c.kh - 1) * c.dh + 1)) / c.sh + 1;
  ow = (c.w + c.pl + c.pr - ((c.kw - 1) * c.dw + 1)) / c.sw + 1;
  const int64_t cg = c.c / c.group, mg = c.m / c.group;
  std::vector<int64_t> y(static_cast<size_t>(c.n * c.m * oh * ow));
  for (int64_t n = 0; n < c.n; ++n)
    for (int64_t m = 0; m < c.m; ++m)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          int64_t acc = 0;
          const int64_t g = m / mg;
          for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t a = 0; a < c.kh; ++a)
              for (int64_t b = 0; b < c.kw; ++b) {
                const int64_t yy = i * c.sh - c.pt + a * c.dh, xx = j * c.sw - c.pl + b * c.dw;
                if (yy < 0 || yy >= c.h || xx < 0 || xx >= c.w) continue;
                acc += x[static_cast<size_t>(((n * c.c + g * cg + ci) * c.h + yy) * c.w + xx)] *
                       w[static_cast<size_t>(((m * cg + ci) * c.kh + a) * c.kw + b)];
              }
          y[static_cast<size_t>(((n * c.m + m) * oh + i) * ow + j)] = acc;
        }
  return y;
}

}  // namespace

TEST_CASE("ConvInteger and QLinearConv match a naive direct convolution", "[cast]") {
  std::mt19937 rng(37);
  auto r = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int iter = 0; iter < 25; ++iter) {
    ConvCase c{};
    c.group = r(1, 3);
    c.n = r(1, 2), c.c = c.group * r(1, 3), c.m = c.group * r(1, 3);
    c.kh = r(1, 3), c.kw = r(1, 3), c.sh = r(1, 2), c.sw = r(1, 3), c.dh = r(1, 2), c.dw = r(1, 2);
    c.pt = r(0, 2), c.pl = r(0, 2), c.pb = r(0, 2), c.pr = r(0, 2);
    c.h = (c.kh - 1) * c.dh + r(1, 8), c.w = (c.kw - 1) * c.dw + r(1, 8);
    const Shape xs{c.n, c.c, c.h, c.w}, ws{c.m, c.c / c.group, c.kh, c.kw};
    const Tensor x = OpTest("Cast", 13)
                         .input(random_tensor(DataType::Int32, xs, rng, 0, 255))
                         .attr("to", int64_t{2})
                         .run1();
    const Tensor w = OpTest("Cast", 13)
                         .input(random_tensor(DataType::Int32, ws, rng, -128, 127))
                         .attr("to", int64_t{3})
                         .run1();
    const Tensor xz = Tensor::scalar<uint8_t>(static_cast<uint8_t>(r(0, 255)));
    const Tensor wz = OpTest("Cast", 13)
                          .input(random_tensor(DataType::Int32, {c.m}, rng, -128, 127))
                          .attr("to", int64_t{3})
                          .run1();
    std::vector<int64_t> xv = ints_of(x), wv = ints_of(w);
    for (auto& v : xv) v -= xz.data<uint8_t>()[0];
    const int64_t per = wv.size() / static_cast<size_t>(c.m);
    for (size_t i = 0; i < wv.size(); ++i) wv[i] -= ints_of(wz)[i / static_cast<size_t>(per)];
    int64_t oh = 0, ow = 0;
    const std::vector<int64_t> want = naive_conv(xv, wv, c, oh, ow);
    INFO("iter " << iter << " x " << shape_to_string(xs) << " w " << shape_to_string(ws));
    const std::vector<int64_t> pads{c.pt, c.pl, c.pb, c.pr};
    const Tensor y = OpTest("ConvInteger", 10)
                         .input(x)
                         .input(w)
                         .input(xz)
                         .input(wz)
                         .attr("group", c.group)
                         .attr("strides", std::vector<int64_t>{c.sh, c.sw})
                         .attr("dilations", std::vector<int64_t>{c.dh, c.dw})
                         .attr("pads", pads)
                         .run1();
    REQUIRE(y.shape() == Shape{c.n, c.m, oh, ow});
    REQUIRE(ints_of(y) == want);

    const Tensor xs_ = Tensor::scalar<float>(0.05f), ys_ = Tensor::scalar<float>(0.7f);
    const Tensor ws_ = random_tensor(DataType::Float, {c.m}, rng, 0.01, 0.1);
    const Tensor yz = Tensor::scalar<int8_t>(-3);
    const Tensor bias = random_tensor(DataType::Int32, {c.m}, rng, -500, 500);
    const Tensor q = OpTest("QLinearConv", 10)
                         .input(x)
                         .input(xs_)
                         .input(xz)
                         .input(w)
                         .input(ws_)
                         .input(wz)
                         .input(ys_)
                         .input(yz)
                         .input(bias)
                         .attr("group", c.group)
                         .attr("strides", std::vector<int64_t>{c.sh, c.sw})
                         .attr("dilations", std::vector<int64_t>{c.dh, c.dw})
                         .attr("pads", pads)
                         .run1();
    REQUIRE(q.dtype() == DataType::Int8);
    const int64_t plane = oh * ow;
    for (size_t i = 0; i < want.size(); ++i) {
      const int64_t m = (static_cast<int64_t>(i) / plane) % c.m;
      const double mult = static_cast<double>(0.05f * ws_.data<float>()[m] / 0.7f);
      const double v = static_cast<double>(want[i] + bias.data<int32_t>()[m]) * mult - 3;
      REQUIRE(static_cast<double>(q.data<int8_t>()[i]) ==
              std::nearbyint(std::clamp(v, -128.0, 127.0)));
    }
  }
}

TEST_CASE("ConvInteger handles 1-D, SAME padding, and rejects bad geometry", "[cast]") {
  const Tensor x = Tensor::from_vector<uint8_t>({1, 1, 5}, {1, 2, 3, 4, 5});
  const Tensor w = Tensor::from_vector<uint8_t>({1, 1, 3}, {1, 1, 1});
  const Tensor y =
      OpTest("ConvInteger", 10).input(x).input(w).attr("auto_pad", "SAME_UPPER").run1();
  CHECK(y.to_vector<int32_t>() == std::vector<int32_t>{3, 6, 9, 12, 9});
  REQUIRE_THROWS_AS(OpTest("ConvInteger", 10).input(x).input(w).attr("group", 2).run(), Error);
  REQUIRE_THROWS_AS(OpTest("ConvInteger", 10).input(x).input(w).attr("group", 0).run(), Error);
  REQUIRE_THROWS_AS(OpTest("ConvInteger", 10).input(x).input(w).attr("auto_pad", "BOGUS").run(),
                    Error);
  REQUIRE_THROWS_AS(
      OpTest("ConvInteger", 10).input(x).input(Tensor::zeros(DataType::UInt8, {1, 1, 9})).run(),
      Error);
  REQUIRE_THROWS_AS(
      OpTest("ConvInteger", 10).input(Tensor::zeros(DataType::UInt8, {5})).input(w).run(), Error);
  REQUIRE_THROWS_AS(
      OpTest("ConvInteger", 10).input(x).input(w).attr("strides", std::vector<int64_t>{0}).run(),
      Error);
}

TEST_CASE("Cast float <-> float16 agrees with the scalar conversion on every half", "[cast]") {
  std::vector<float16> halves;
  for (uint32_t h = 0; h < 0x10000; ++h)
    halves.push_back(float16::from_bits(static_cast<uint16_t>(h)));
  const Tensor h = Tensor::from_vector<float16>({static_cast<int64_t>(halves.size())}, halves);
  const Tensor f = OpTest("Cast", 13).input(h).attr("to", int64_t{1}).run1();
  for (uint32_t i = 0; i < 0x10000; ++i) {
    const float want = float16::to_float(static_cast<uint16_t>(i));
    const float got = f.data<float>()[i];
    REQUIRE(((std::isnan(want) && std::isnan(got)) ||
             std::bit_cast<uint32_t>(want) == std::bit_cast<uint32_t>(got)));
  }
  std::mt19937 rng(41);
  std::uniform_int_distribution<uint32_t> bits;
  std::vector<float> xs(100003);
  for (auto& x : xs) x = std::bit_cast<float>(bits(rng));
  const Tensor x = Tensor::from_vector<float>({static_cast<int64_t>(xs.size())}, xs);
  const Tensor y = OpTest("Cast", 13).input(x).attr("to", int64_t{10}).run1();
  for (size_t i = 0; i < xs.size(); ++i) {
    const uint16_t want = float16::from_float(xs[i]), got = y.data<float16>()[i].bits;
    REQUIRE(((std::isnan(xs[i]) && (got & 0x7fff) > 0x7c00 && (got & 0x8000) == (want & 0x8000)) ||
             got == want));
  }
}

TEST_CASE("QLinearMatMul on float8 inputs decodes, multiplies and re-encodes", "[cast]") {
  const Fmt& f = kFormats[0];  // E4M3FN
  std::mt19937 rng(43);
  std::uniform_int_distribution<int> code(0, 0x5f);  // finite values up to 15.5, both signs
  std::vector<uint8_t> av(2 * 3), bv(3 * 2);
  for (auto& v : av) v = static_cast<uint8_t>(code(rng) | (rng() % 2 ? 0x80 : 0));
  for (auto& v : bv) v = static_cast<uint8_t>(code(rng) | (rng() % 2 ? 0x80 : 0));
  const Tensor a = bytes_tensor(DataType::Float8E4M3FN, {2, 3}, av);
  const Tensor b = bytes_tensor(DataType::Float8E4M3FN, {3, 2}, bv);
  const Tensor zero = bytes_tensor(DataType::Float8E4M3FN, {}, {0});
  const Tensor one = Tensor::scalar<float>(1.0f), half = Tensor::scalar<float>(0.5f);
  const Tensor y = OpTest("QLinearMatMul", 21)
                       .input(a)
                       .input(half)
                       .input(zero)
                       .input(b)
                       .input(one)
                       .input(zero)
                       .input(one)
                       .input(zero)
                       .run1();
  REQUIRE(y.dtype() == DataType::Float8E4M3FN);
  for (int m = 0; m < 2; ++m) {
    for (int n = 0; n < 2; ++n) {
      double acc = 0;
      for (int k = 0; k < 3; ++k)
        acc += naive_decode(av[m * 3 + k], f) * naive_decode(bv[k * 2 + n], f);
      REQUIRE(same_code(code_at(y, m * 2 + n), naive_encode(acc * 0.5, f, true), f));
    }
  }
  const Tensor a4 = Tensor::zeros(DataType::Float4E2M1, {2, 2});
  const Tensor z4 = Tensor::zeros(DataType::Float4E2M1, {});
  REQUIRE_THROWS_AS(OpTest("QLinearMatMul", 21)
                        .input(a4)
                        .input(one)
                        .input(z4)
                        .input(a4)
                        .input(one)
                        .input(z4)
                        .input(one)
                        .input(z4)
                        .run(),
                    Error);
}

TEST_CASE("Cast to float8e8m0 honours round_mode", "[cast]") {
  const Tensor x = Tensor::from_vector<float>({3}, {3.0f, 2.5f, -8.0f});
  auto run = [&](const char* mode) {
    return bytes_of(
        OpTest("Cast", 25).input(x).attr("to", int64_t{24}).attr("round_mode", mode).run1());
  };
  CHECK(run("down") == std::vector<uint8_t>{0x80, 0x80, 0x82});
  CHECK(run("up") == std::vector<uint8_t>{0x81, 0x81, 0x82});
  CHECK(run("nearest") == std::vector<uint8_t>{0x81, 0x80, 0x82});
}

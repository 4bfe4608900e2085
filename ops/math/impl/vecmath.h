// Vectorised float math, written once against the level's vector type: exp, log, erf, tanh,
// sigmoid, GELU (erf and tanh forms) and SiLU over arrays; the row kernels built on them are
// in impl/vecmath_rows.h. Included by each ops/math/isa_*.cpp inside its namespace; it
// includes nothing itself.
//
// Each function reduces its argument to a short interval and evaluates a minimax polynomial
// there (coefficients fitted for this file with a Remez exchange in 40-digit arithmetic, then
// rounded to float). Largest errors over all floats, at every level: exp 1.02 ulp, log 0.87,
// erf 1.33, tanh 1.52, sigmoid 2.41, SiLU 3.4, GELU 3.53 (and -0 below -5.586, where
// |gelu| < 6.5e-8), the tanh form of GELU 1.9 for x >= 0 and 7.6 down to -2, then about |z|
// ulp for its sigmoid argument z (rounding z to float). test/unit/test_vecmath.cpp holds these
// bounds. NaN in gives NaN out, infinities give the limits, and exp, the sigmoid and SiLU
// round results below FLT_MIN into subnormals instead of flushing them.
//
// The clamps below are written vmin(limit, vmax(limit, x)): the SSE/AVX min and max return
// their second operand when either is NaN, so NaN passes through them unchanged.

constexpr float kVmInf = __builtin_inff();
constexpr float kVmSqrtHalf = 0.707106769f;
constexpr float kVmLn2Hi = 0.693359375f;  // 9 significant bits: n * kVmLn2Hi is exact
constexpr float kVmLn2Lo = -2.12194440e-4f;

// e^r = 1 + r + r^2 P(r) on [-ln2/2, ln2/2] (relative error 3.1e-9 before rounding).
constexpr float kExpP[] = {0.49999994f, 0.166665211f, 0.041668389f, 0.00836871006f, 0.00138146128f};
// log(1 + f) = f - f^2/2 + f^3 P(f) on [sqrt(1/2) - 1, sqrt(2) - 1] (5.8e-9).
constexpr float kLogP[] = {0.333333313f, -0.250008196f, 0.200012267f, -0.166233569f,
                           0.142017573f, -0.13160181f,  0.12761578f,  -0.0763450041f};
// erf(x) = x + x P(x^2) on [0, kErfSplit] (4.1e-10); the leading x is added last so that
// P's rounding is relative to 0.128, not to 1.128.
constexpr float kErfSmallP[] = {0.128379166f,   -0.376126349f,    0.112836957f,   -0.0268593989f,
                                0.00520103239f, -0.000814270461f, 8.37010157e-05f};
// log(erfc(a)) = P(a) on [kErfSplit, kErfEnd], absolute (so erfc relative) error 9.5e-9.
constexpr float kErfcLogP[] = {0.000302897155f, -1.1301676f,      -0.631931424f,
                               -0.10998743f,    0.0263721328f,    -0.00474360306f,
                               0.000593654113f, -4.57145907e-05f, 1.62127719e-06f};
// log(erfc(x / sqrt2)) + x^2 / 2 = P(x - 3) on [kErfSplit sqrt2, kErfEnd sqrt2] (9.5e-9), for
// GELU: a fit in x itself spares the rounding of x / sqrt2, which the steep erfc would
// magnify; with -x^2/2 taken out (and added back exactly) P's value stays below 2.1, and
// centred at 3 (x - 3 is exact there) its terms stay small too.
constexpr float kGeluErfcLogP[] = {-1.41457903f,    -0.283098698f,    0.0352796167f,
                                   -0.00524495356f, 0.000788706995f,  -0.00011330648f,
                                   1.48885038e-05f, -1.60871843e-06f, 1.01328894e-07f};
constexpr float kErfSplit = 0.921875f;
// erfc(3.95) = 2.3e-8, below half an ulp of 1: from here on erf rounds to +-1.
constexpr float kErfEnd = 3.95f;
// tanh(a) = a + a^3 P(a^2) on [0, kTanhSplit] (2.1e-9).
constexpr float kTanhP[] = {-0.333333343f, 0.133333296f,    -0.0539637394f,
                            0.0217904691f, -0.00838018954f, 0.0023080979f};
constexpr float kTanhSplit = 0.625f;

template <int N>
inline VF vm_poly(VF x, const float (&c)[N]) {
  VF p = vset1(c[N - 1]);
#pragma GCC unroll 16
  for (int i = N - 2; i >= 0; --i) p = vfmadd(p, x, vset1(c[i]));
  return p;
}

inline VF vm_sign(VF x) {
  return vand(x, vset1(-0.0f));
}

// e^x = m * scale with both factors normal floats (scale a power of two): the product rounds
// once, into a subnormal when below FLT_MIN, and callers that multiply m first keep the bits
// of results that are normal even when e^x is not. Above 88.8 every result is +inf; below
// -112 it is 0 even after m is multiplied by up to 2^8 (vm_times_sigmoid's -200), so clamping
// there keeps n = round(x / ln2) within [-162, 128] and both factors normal.
// With kLo, e^(x + lo) for a small lo that extends x's precision.
// e^r for x = n ln2 + r, n = round(x / ln2) returned in *n (with kLo, e^(r + lo)).
template <bool kLo = false>
inline VF vm_exp_reduced(VF x, VF* n, VF lo = VF{}) {
  *n = vround(vmul(x, vset1(1.44269504f)));
  VF r = vfnmadd(*n, vset1(kVmLn2Hi), x);
  r = vfnmadd(*n, vset1(kVmLn2Lo), r);
  if constexpr (kLo) r = vadd(r, lo);
  return vadd(vfmadd(vmul(r, r), vm_poly(r, kExpP), r), vset1(1.0f));
}

template <bool kLo = false>
inline VF vm_exp_parts(VF x, VF* scale, VF lo = VF{}) {
  const VF xc = vmin(vset1(88.8f), vmax(vset1(-112.0f), x));
  VF n;
  const VF e = vm_exp_reduced<kLo>(xc, &n, lo);
  // 2^n as two normal factors, so a result below FLT_MIN is rounded once, into a subnormal.
  const VI ni = vcvt_int(n);
  const VI n1 = vsra<1>(ni);
  *scale = vfrom_bits(vshl<23>(viadd(visub(ni, n1), viset1(127))));
  return vmul(e, vfrom_bits(vshl<23>(viadd(n1, viset1(127)))));
}

inline VF vm_exp(VF x) {
  VF scale;
  const VF m = vm_exp_parts(x, &scale);
  return vmul(m, scale);
}

// vm_exp for x in [kVmExpNormalLo, 88] or NaN, with the same bits as vm_exp there: 2^n is a
// normal float for every such x (n >= -126), so it is one factor and neither clamp is needed
// (about a quarter of vm_exp's instructions). Callers check the range first.
constexpr float kVmExpNormalLo = -87.0f;
inline VF vm_exp_normal(VF x) {
  VF n;
  const VF e = vm_exp_reduced(x, &n);
  return vmul(e, vfrom_bits(vshl<23>(viadd(vcvt_int(n), viset1(127)))));
}

// log(x): x = 2^k m with m in [sqrt(1/2), sqrt(2)), log x = k ln2 + log(1 + (m - 1)).
inline VF vm_log(VF x) {
  // Subnormals are scaled by 2^23 first so that the exponent field holds their exponent.
  const VM tiny = vlt(x, vset1(1.17549435e-38f));
  const VF xs = vselect(tiny, vmul(x, vset1(8388608.0f)), x);
  // Subtracting sqrt(1/2)'s bits rounds the exponent so that m lands in [sqrt(1/2), sqrt(2)).
  const VI u = visub(vbits(xs), viset1(0x3f3504f3));
  const VF m = vfrom_bits(viadd(viand(u, viset1(0x007fffff)), viset1(0x3f3504f3)));
  const VF f = vsub(m, vset1(1.0f));  // exact
  const VF k = vsub(vcvt_float(vsra<23>(u)), vselect(tiny, vset1(23.0f), vzero()));
  const VF f2 = vmul(f, f);
  VF y = vmul(vmul(f2, f), vm_poly(f, kLogP));
  y = vfmadd(k, vset1(kVmLn2Lo), y);
  y = vfnmadd(vset1(0.5f), f2, y);
  VF r = vfmadd(k, vset1(kVmLn2Hi), vadd(f, y));
  r = vselect(veq(x, vset1(kVmInf)), x, r);
  r = vselect(veq(x, vzero()), vset1(-kVmInf), r);
  return vselect(vmask_or(vlt(x, vzero()), visnan(x)), vset1(__builtin_nanf("")), r);
}

// erfc(a) for a >= kErfSplit; a is clamped to kErfEnd.
inline VF vm_erfc_large(VF a) {
  return vm_exp(vm_poly(vmin(vset1(kErfEnd), a), kErfcLogP));
}

inline VF vm_erf(VF x) {
  const VF a = vabs(x);
  const VF small = vfmadd(x, vm_poly(vmul(x, x), kErfSmallP), x);
  const VF large = vor(vsub(vset1(1.0f), vm_erfc_large(a)), vm_sign(x));
  return vselect(vlt(a, vset1(kErfSplit)), small, large);
}

// tanh(x) = (1 - e^-2|x|) / (1 + e^-2|x|) with x's sign; the polynomial near 0, where that
// quotient would lose bits. Computed on |x| so that -0 keeps its sign.
inline VF vm_tanh(VF x) {
  const VF a = vabs(x);
  const VF a2 = vmul(a, a);
  const VF small = vfmadd(vmul(a2, a), vm_poly(a2, kTanhP), a);
  const VF e = vm_exp(vmul(vset1(-2.0f), a));
  const VF large = vdiv(vsub(vset1(1.0f), e), vadd(vset1(1.0f), e));
  return vor(vselect(vlt(a, vset1(kTanhSplit)), small, large), vm_sign(x));
}

// x / (1 + e^-z) (x = 1: the sigmoid of z) as x e^-|z| / (1 + e^-|z|) for negative z:
// e^-|z| never overflows, and the numerator is formed before the power-of-two scale of
// e^-|z| is applied, so results keep their bits where e^-|z| alone would be subnormal. x is
// clamped at -200 for the product (z is then far below -104, the quotient 0), so x = -inf
// gives -0 rather than -inf * 0.
inline VF vm_times_sigmoid(VF x, VF z) {
  VF scale;
  const VF m = vm_exp_parts(vneg(vabs(z)), &scale);
  const VF den = vadd(vset1(1.0f), vmul(m, scale));
  const VF xc = vmax(vset1(-200.0f), x);
  const VM pos = vge(z, vzero());
  const VF q = vdiv(vselect(pos, xc, vmul(xc, m)), den);
  return vselect(pos, q, vmul(q, scale));
}

inline VF vm_sigmoid(VF x) {
  return vm_times_sigmoid(vset1(1.0f), x);
}

inline VF vm_silu(VF x) {
  return vm_times_sigmoid(x, x);
}

// x * (1 + erf(x / sqrt2)) / 2. Where erf comes from erfc, 1 - erfc is never formed for
// negative x: there the result is x erfc(|x| / sqrt2) / 2 without cancellation. Below
// -kErfEnd * sqrt2 (|gelu| < 6.5e-8) the result is -0, as 1 + erf rounds to 0 in float.
inline VF vm_gelu(VF x) {
  const VF a = vabs(x);
  const VM neg = vlt(x, vzero());
  // erfc(|x| / sqrt2) = e^(-x^2/2 + P(|x|)), the exponent as an unevaluated sum hi + lo.
  const VF ac = vmin(vset1(kErfEnd * 1.41421354f), a);
  const VF sq = vmul(ac, ac);
  const VF s = vmul(vset1(-0.5f), sq);
  const VF w = vm_poly(vsub(ac, vset1(3.0f)), kGeluErfcLogP);
  const VF hi = vadd(s, w);
  // |s| >= |w| on this interval, so (s - hi) + w is hi's rounding error exactly.
  const VF lo = vfnmadd(vset1(0.5f), vmul_lo(ac, ac, sq), vadd(vsub(s, hi), w));
  VF scale;
  const VF m = vm_exp_parts<true>(hi, &scale, lo);
  const VF e = vmul(m, scale);
  VF h = vselect(neg, vmul(vset1(0.5f), e), vfnmadd(vset1(0.5f), e, vset1(1.0f)));
  h = vselect(vmask_and(neg, vgt(a, vset1(kErfEnd * 1.41421354f))), vzero(), h);
  // Near 0: (1 + erf(t)) / 2 with t = |x| / sqrt2 and erf(t) = t + t P(t^2); for negative x
  // as (1 - t) - t P(t^2), exact up to the last rounding for t >= 1/2.
  const VF t = vmul(a, vset1(kVmSqrtHalf));
  const VF tp = vmul(t, vm_poly(vmul(t, t), kErfSmallP));
  const VF hs = vmul(vset1(0.5f),
                     vselect(neg, vsub(vsub(vset1(1.0f), t), tp), vadd(vset1(1.0f), vadd(t, tp))));
  // The clamp at -8 matters only for -inf (h is 0 below -5.6): -inf * 0 would be NaN.
  return vmul(vmax(vset1(-8.0f), x), vselect(vlt(t, vset1(kErfSplit)), hs, h));
}

// x (1 + tanh(u)) / 2 with u = sqrt(2/pi) (x + 0.044715 x^3), computed as x * sigmoid(2u),
// which avoids the cancellation of 1 + tanh for negative x.
inline VF vm_gelu_tanh(VF x) {
  return vm_times_sigmoid(x, vmul(x, vfmadd(vset1(0.0713548163f), vmul(x, x), vset1(1.59576912f))));
}

// y[i] = F(x[i]); y may be x.
template <VF (*F)(VF)>
inline void vm_map(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) vstore(y + i, F(vload(x + i)));
  if (i < n) {
    const int left = static_cast<int>(n - i);
    vstore_partial(y + i, F(vload_partial(x + i, left)), left);
  }
}

void vec_exp(const float* x, float* y, int64_t n) {
  vm_map<vm_exp>(x, y, n);
}
void vec_log(const float* x, float* y, int64_t n) {
  vm_map<vm_log>(x, y, n);
}
void vec_erf(const float* x, float* y, int64_t n) {
  vm_map<vm_erf>(x, y, n);
}
void vec_tanh(const float* x, float* y, int64_t n) {
  vm_map<vm_tanh>(x, y, n);
}
void vec_sigmoid(const float* x, float* y, int64_t n) {
  vm_map<vm_sigmoid>(x, y, n);
}
void vec_gelu(const float* x, float* y, int64_t n) {
  vm_map<vm_gelu>(x, y, n);
}
void vec_gelu_tanh(const float* x, float* y, int64_t n) {
  vm_map<vm_gelu_tanh>(x, y, n);
}
void vec_silu(const float* x, float* y, int64_t n) {
  vm_map<vm_silu>(x, y, n);
}
void vec_swish(const float* x, float* y, int64_t n, float alpha) {
  const VF a = vset1(alpha);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const VF v = vload(x + i);
    vstore(y + i, vm_times_sigmoid(v, vmul(a, v)));
  }
  if (i < n) {
    const int left = static_cast<int>(n - i);
    const VF v = vload_partial(x + i, left);
    vstore_partial(y + i, vm_times_sigmoid(v, vmul(a, v)), left);
  }
}

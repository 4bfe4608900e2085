// Row kernels on the vector math of impl/vecmath.h (included before this, in the same
// namespace): softmax, log-softmax, layer and RMS normalisation, sum and max, and the level's
// VecMathKernels table. Included by each ops/math/isa_*.cpp; it includes nothing itself.

// The largest element (-inf for n == 0), without NaN handling: the row kernels turn a NaN into
// NaN outputs through their sums anyway.
inline float vm_row_max(const float* x, int64_t n) {
  VF m0 = vset1(-kVmInf), m1 = m0;
  int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    m0 = vmax(m0, vload(x + i));
    m1 = vmax(m1, vload(x + i + kLanes));
  }
  for (; i + kLanes <= n; i += kLanes) m0 = vmax(m0, vload(x + i));
  if (i < n) {
    const int left = static_cast<int>(n - i);
    m1 = vmax(m1, vselect(vlanes_below(left), vload_partial(x + i, left), vset1(-kVmInf)));
  }
  return vreduce_max(vmax(m0, m1));
}

// Sum over x[i] (Sq: x[i]^2) in per-lane partial sums.
enum class VmSum { Plain, Sq };
template <VmSum K>
inline float vm_row_sum(const float* x, int64_t n) {
  auto term = [&](VF v) {
    if constexpr (K == VmSum::Plain) return v;
    return vmul(v, v);
  };
  VF s0 = vzero(), s1 = vzero(), s2 = vzero(), s3 = vzero();
  int64_t i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    s0 = vadd(s0, term(vload(x + i)));
    s1 = vadd(s1, term(vload(x + i + kLanes)));
    s2 = vadd(s2, term(vload(x + i + 2 * kLanes)));
    s3 = vadd(s3, term(vload(x + i + 3 * kLanes)));
  }
  for (; i + kLanes <= n; i += kLanes) s0 = vadd(s0, term(vload(x + i)));
  if (i < n) {
    const int left = static_cast<int>(n - i);
    s1 = vadd(s1, vselect(vlanes_below(left), term(vload_partial(x + i, left)), vzero()));
  }
  return vreduce_add(vadd(vadd(s0, s1), vadd(s2, s3)));
}

float vec_sum(const float* x, int64_t n) {
  return vm_row_sum<VmSum::Plain>(x, n);
}

// Sums of d = x[i] - c and of d^2.
inline void vm_row_centered(const float* x, int64_t n, float c, float* sum_d, float* sum_d2) {
  const VF vc = vset1(c);
  VF s0 = vzero(), s1 = vzero(), q0 = vzero(), q1 = vzero();
  int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    const VF d0 = vsub(vload(x + i), vc), d1 = vsub(vload(x + i + kLanes), vc);
    s0 = vadd(s0, d0);
    s1 = vadd(s1, d1);
    q0 = vfmadd(d0, d0, q0);
    q1 = vfmadd(d1, d1, q1);
  }
  for (; i + kLanes <= n; i += kLanes) {
    const VF d = vsub(vload(x + i), vc);
    s0 = vadd(s0, d);
    q0 = vfmadd(d, d, q0);
  }
  if (i < n) {
    const int left = static_cast<int>(n - i);
    const VF d = vselect(vlanes_below(left), vsub(vload_partial(x + i, left), vc), vzero());
    s1 = vadd(s1, d);
    q1 = vfmadd(d, d, q1);
  }
  *sum_d = vreduce_add(vadd(s0, s1));
  *sum_d2 = vreduce_add(vadd(q0, q1));
}

// The largest element; NaN when any element is NaN, -inf for n == 0.
float vec_max(const float* x, int64_t n) {
  VF m = vset1(-kVmInf);
  VM nan = visnan(m);  // all off
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const VF v = vload(x + i);
    m = vmax(m, v);
    nan = vmask_or(nan, visnan(v));
  }
  if (i < n) {
    const int left = static_cast<int>(n - i);
    const VF v = vselect(vlanes_below(left), vload_partial(x + i, left), vset1(-kVmInf));
    m = vmax(m, v);
    nan = vmask_or(nan, visnan(v));
  }
  return vany(nan) ? __builtin_nanf("") : vreduce_max(m);
}

// y = exp(x - m) (y may be x); returns the sum. Four partial sums per lane keep the sum's
// rounding (and the dependency chain) short.
float exp_shifted_sum(const float* x, float* y, int64_t n, float mx) {
  const VF m = vset1(mx);
  VF s0 = vzero(), s1 = vzero(), s2 = vzero(), s3 = vzero();
  int64_t i = 0;
  const VF lo = vset1(kVmExpNormalLo);
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    const VF d0 = vsub(vload(x + i), m), d1 = vsub(vload(x + i + kLanes), m);
    const VF d2 = vsub(vload(x + i + 2 * kLanes), m), d3 = vsub(vload(x + i + 3 * kLanes), m);
    // x - m <= 0 (or NaN): the short exp unless a value lies below its range (masked keys'
    // -inf, far tails), whose results are subnormal or 0.
    const bool tails =
        vany(vmask_or(vmask_or(vlt(d0, lo), vlt(d1, lo)), vmask_or(vlt(d2, lo), vlt(d3, lo))));
    VF e0, e1, e2, e3;
    if (tails) {
      e0 = vm_exp(d0), e1 = vm_exp(d1), e2 = vm_exp(d2), e3 = vm_exp(d3);
    } else {
      e0 = vm_exp_normal(d0), e1 = vm_exp_normal(d1), e2 = vm_exp_normal(d2);
      e3 = vm_exp_normal(d3);
    }
    vstore(y + i, e0);
    vstore(y + i + kLanes, e1);
    vstore(y + i + 2 * kLanes, e2);
    vstore(y + i + 3 * kLanes, e3);
    s0 = vadd(s0, e0);
    s1 = vadd(s1, e1);
    s2 = vadd(s2, e2);
    s3 = vadd(s3, e3);
  }
  for (; i + kLanes <= n; i += kLanes) {
    const VF e = vm_exp(vsub(vload(x + i), m));
    vstore(y + i, e);
    s0 = vadd(s0, e);
  }
  if (i < n) {
    const int left = static_cast<int>(n - i);
    const VF e = vselect(vlanes_below(left), vm_exp(vsub(vload_partial(x + i, left), m)), vzero());
    vstore_partial(y + i, e, left);
    s1 = vadd(s1, e);
  }
  return vreduce_add(vadd(vadd(s0, s1), vadd(s2, s3)));
}

// y = exp(x - max) / sum: a row whose max is -inf or +inf, or that holds a NaN, gives NaN.
void vec_softmax(const float* x, float* y, int64_t n) {
  if (n <= 0) return;
  const VF inv = vset1(1.0f / exp_shifted_sum(x, y, n, vm_row_max(x, n)));
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) vstore(y + i, vmul(vload(y + i), inv));
  if (i < n) {
    const int left = static_cast<int>(n - i);
    vstore_partial(y + i, vmul(vload_partial(y + i, left), inv), left);
  }
}

// x = exp(x + bias - max) in place (bias may be null); the sum, 0 for a row of -inf.
float vec_softmax_numerators(float* x, const float* bias, int64_t n) {
  if (n <= 0) return 0.0f;
  float mx = 0;
  if (bias) {
    VF m0 = vset1(-kVmInf), m1 = m0;
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      const VF v = vadd(vload(x + i), vload(bias + i));
      vstore(x + i, v);
      m0 = vmax(m0, v);
    }
    if (i < n) {
      const int left = static_cast<int>(n - i);
      const VF v = vadd(vload_partial(x + i, left), vload_partial(bias + i, left));
      vstore_partial(x + i, v, left);
      m1 = vmax(m1, vselect(vlanes_below(left), v, vset1(-kVmInf)));
    }
    mx = vreduce_max(vmax(m0, m1));
  } else {
    mx = vm_row_max(x, n);
  }
  if (mx == -kVmInf) {
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) vstore(x + i, vzero());
    if (i < n) vstore_partial(x + i, vzero(), static_cast<int>(n - i));
    return 0.0f;
  }
  return exp_shifted_sum(x, x, n, mx);
}

// y = x - max - log(sum exp(x - max)), with softmax's NaN rows.
void vec_log_softmax(const float* x, float* y, int64_t n) {
  if (n <= 0) return;
  const VF m = vset1(vm_row_max(x, n));
  VF s0 = vzero(), s1 = vzero(), s2 = vzero(), s3 = vzero();
  int64_t i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    s0 = vadd(s0, vm_exp(vsub(vload(x + i), m)));
    s1 = vadd(s1, vm_exp(vsub(vload(x + i + kLanes), m)));
    s2 = vadd(s2, vm_exp(vsub(vload(x + i + 2 * kLanes), m)));
    s3 = vadd(s3, vm_exp(vsub(vload(x + i + 3 * kLanes), m)));
  }
  for (; i + kLanes <= n; i += kLanes) s0 = vadd(s0, vm_exp(vsub(vload(x + i), m)));
  if (i < n) {
    const int left = static_cast<int>(n - i);
    s1 =
        vadd(s1, vselect(vlanes_below(left), vm_exp(vsub(vload_partial(x + i, left), m)), vzero()));
  }
  const VF log_sum = vm_log(vset1(vreduce_add(vadd(vadd(s0, s1), vadd(s2, s3)))));
  for (i = 0; i + kLanes <= n; i += kLanes) {
    vstore(y + i, vsub(vsub(vload(x + i), m), log_sum));
  }
  if (i < n) {
    const int left = static_cast<int>(n - i);
    vstore_partial(y + i, vsub(vsub(vload_partial(x + i, left), m), log_sum), left);
  }
}

// y = (x - c) * inv * scale + bias over a row, scale and bias optional.
template <bool kScale, bool kBias>
inline void vm_affine(const float* x, float* y, int64_t n, float c, float inv, const float* scale,
                      const float* bias) {
  const VF vc = vset1(c), vinv = vset1(inv);
  auto one = [&](VF v, VF s, VF b) {
    const VF t = vmul(vsub(v, vc), vinv);
    if constexpr (kScale && kBias) return vfmadd(t, s, b);
    if constexpr (kScale) return vmul(t, s);
    if constexpr (kBias) return vadd(t, b);
    return t;
  };
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const VF s = kScale ? vload(scale + i) : vzero();
    const VF b = kBias ? vload(bias + i) : vzero();
    vstore(y + i, one(vload(x + i), s, b));
  }
  if (i < n) {
    const int left = static_cast<int>(n - i);
    const VF s = kScale ? vload_partial(scale + i, left) : vzero();
    const VF b = kBias ? vload_partial(bias + i, left) : vzero();
    vstore_partial(y + i, one(vload_partial(x + i, left), s, b), left);
  }
}

inline void vm_affine_any(const float* x, float* y, int64_t n, float c, float inv,
                          const float* scale, const float* bias) {
  if (scale && bias) return vm_affine<true, true>(x, y, n, c, inv, scale, bias);
  if (scale) return vm_affine<true, false>(x, y, n, c, inv, scale, bias);
  if (bias) return vm_affine<false, true>(x, y, n, c, inv, scale, bias);
  vm_affine<false, false>(x, y, n, c, inv, scale, bias);
}

inline float vm_inv_sqrt(float v) {
  return vfirst(vdiv(vset1(1.0f), vsqrt(vset1(v))));
}

// Normalises a row whose first-pass mean is mu0: the second pass sums x - mu0 (which
// corrects the first pass's rounding of the mean, and the variance with it, so rows far from
// zero keep their precision) and its square, then y = (x - mean) / sqrt(var + epsilon) *
// scale + bias. mean / inv_std receive the statistics.
inline void vm_normalize_row(const float* x, float* y, int64_t n, float mu0, const float* scale,
                             const float* bias, float epsilon, float* mean, float* inv_std) {
  const float nf = static_cast<float>(n);
  float sum_d, sum_d2;
  vm_row_centered(x, n, mu0, &sum_d, &sum_d2);
  const float shift = sum_d / nf;
  const float mu = mu0 + shift;
  const float var0 = sum_d2 / nf - shift * shift;
  const float var = var0 < 0.0f ? 0.0f : var0;  // NaN stays NaN
  const float inv = vm_inv_sqrt(var + epsilon);
  if (mean) *mean = mu;
  if (inv_std) *inv_std = inv;
  vm_affine_any(x, y, n, mu, inv, scale, bias);
}

// One row of LayerNormalization: mean and variance in two passes, then the affine pass.
void vec_layer_norm(const float* x, float* y, int64_t n, const float* scale, const float* bias,
                    float epsilon, float* mean, float* inv_std) {
  const float mu0 = vm_row_sum<VmSum::Plain>(x, n) / static_cast<float>(n);
  vm_normalize_row(x, y, n, mu0, scale, bias, epsilon, mean, inv_std);
}

// One row of SkipLayerNormalization: s = a + b (+ bias) stored to `sum` while its first-pass
// mean is summed, then the row normalised from `sum` (in cache) into y.
void vec_skip_layer_norm(const float* a, const float* b, const float* bias, float* sum, float* y,
                         int64_t n, const float* scale, const float* beta, float epsilon,
                         float* mean, float* inv_std) {
  VF s0 = vzero(), s1 = vzero();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    VF v = vadd(vload(a + i), vload(b + i));
    if (bias) v = vadd(v, vload(bias + i));
    vstore(sum + i, v);
    s0 = vadd(s0, v);
  }
  if (i < n) {
    const int left = static_cast<int>(n - i);
    VF v = vadd(vload_partial(a + i, left), vload_partial(b + i, left));
    if (bias) v = vadd(v, vload_partial(bias + i, left));
    vstore_partial(sum + i, v, left);
    s1 = vadd(s1, vselect(vlanes_below(left), v, vzero()));
  }
  const float mu0 = vreduce_add(vadd(s0, s1)) / static_cast<float>(n);
  vm_normalize_row(sum, y, n, mu0, scale, beta, epsilon, mean, inv_std);
}

// One row of RMSNormalization: x / sqrt(mean(x^2) + epsilon) * scale.
void vec_rms_norm(const float* x, float* y, int64_t n, const float* scale, float epsilon,
                  float* inv_std) {
  const float inv = vm_inv_sqrt(vm_row_sum<VmSum::Sq>(x, n) / static_cast<float>(n) + epsilon);
  if (inv_std) *inv_std = inv;
  vm_affine_any(x, y, n, 0.0f, inv, scale, nullptr);
}

constexpr VecMathKernels kVecMathKernels{.exp = vec_exp,
                                         .log = vec_log,
                                         .erf = vec_erf,
                                         .tanh = vec_tanh,
                                         .sigmoid = vec_sigmoid,
                                         .gelu = vec_gelu,
                                         .gelu_tanh = vec_gelu_tanh,
                                         .silu = vec_silu,
                                         .swish = vec_swish,
                                         .softmax = vec_softmax,
                                         .log_softmax = vec_log_softmax,
                                         .softmax_numerators = vec_softmax_numerators,
                                         .layer_norm = vec_layer_norm,
                                         .skip_layer_norm = vec_skip_layer_norm,
                                         .rms_norm = vec_rms_norm,
                                         .sum = vec_sum,
                                         .max = vec_max};

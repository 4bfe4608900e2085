// Float arithmetic on rows, y[i] = a[i * sa] op b[i * sb], written once against the level's
// vector type: both operands contiguous, or one of them a broadcast scalar (stride 0), the
// rows numpy broadcasting reduces to; other strides take a scalar loop. y may be a or b.
// And the per-channel affine row of kiln.ChannelAffine.
// Included by each ops/math/isa_*.cpp inside its namespace; includes nothing.

struct OpAdd {
  static VF v(VF a, VF b) { return vadd(a, b); }
  static float s(float a, float b) { return a + b; }
};
struct OpSub {
  static VF v(VF a, VF b) { return vsub(a, b); }
  static float s(float a, float b) { return a - b; }
};
struct OpMul {
  static VF v(VF a, VF b) { return vmul(a, b); }
  static float s(float a, float b) { return a * b; }
};
struct OpDiv {
  static VF v(VF a, VF b) { return vdiv(a, b); }
  static float s(float a, float b) { return a / b; }
};

template <typename Op>
void binary_row(const float* a, int64_t sa, const float* b, int64_t sb, float* y, int64_t n) {
  int64_t i = 0;
  if (sa == 1 && sb == 1) {
    for (; i + kLanes <= n; i += kLanes) vstore(y + i, Op::v(vload(a + i), vload(b + i)));
    if (i < n) {
      const int left = static_cast<int>(n - i);
      vstore_partial(y + i, Op::v(vload_partial(a + i, left), vload_partial(b + i, left)), left);
    }
  } else if (sa == 1 && sb == 0) {
    const VF bv = vset1(b[0]);
    for (; i + kLanes <= n; i += kLanes) vstore(y + i, Op::v(vload(a + i), bv));
    if (i < n) {
      const int left = static_cast<int>(n - i);
      vstore_partial(y + i, Op::v(vload_partial(a + i, left), bv), left);
    }
  } else if (sa == 0 && sb == 1) {
    const VF av = vset1(a[0]);
    for (; i + kLanes <= n; i += kLanes) vstore(y + i, Op::v(av, vload(b + i)));
    if (i < n) {
      const int left = static_cast<int>(n - i);
      vstore_partial(y + i, Op::v(av, vload_partial(b + i, left)), left);
    }
  } else {
    for (; i < n; ++i) y[i] = Op::s(a[i * sa], b[i * sb]);
  }
}

// max(v, 0) when kRelu (vmax returns its second operand for a NaN: 0, as Relu gives).
template <bool kRelu>
VF affine_clamp(VF v) {
  if constexpr (kRelu) return vmax(v, vzero());
  return v;
}

// x * a + b over one row with one scale and shift, four vectors a step (the row is a
// channel's plane, a few KiB: the loop is bound by the loads and stores).
template <bool kRelu>
void affine_plane(const float* x, float a, float b, float* y, int64_t n) {
  const VF av = vset1(a), bv = vset1(b);
  int64_t i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    const VF v0 = vload(x + i), v1 = vload(x + i + kLanes), v2 = vload(x + i + 2 * kLanes),
             v3 = vload(x + i + 3 * kLanes);
    vstore(y + i, affine_clamp<kRelu>(vfmadd(v0, av, bv)));
    vstore(y + i + kLanes, affine_clamp<kRelu>(vfmadd(v1, av, bv)));
    vstore(y + i + 2 * kLanes, affine_clamp<kRelu>(vfmadd(v2, av, bv)));
    vstore(y + i + 3 * kLanes, affine_clamp<kRelu>(vfmadd(v3, av, bv)));
  }
  for (; i + kLanes <= n; i += kLanes) {
    vstore(y + i, affine_clamp<kRelu>(vfmadd(vload(x + i), av, bv)));
  }
  if (i < n) {
    const int left = static_cast<int>(n - i);
    vstore_partial(y + i, affine_clamp<kRelu>(vfmadd(vload_partial(x + i, left), av, bv)), left);
  }
}

// x[i] * scale[i] + shift[i]: a row of channels.
template <bool kRelu>
void affine_channels(const float* x, const float* scale, const float* shift, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    vstore(y + i, affine_clamp<kRelu>(vfmadd(vload(x + i), vload(scale + i), vload(shift + i))));
  }
  if (i < n) {
    const int left = static_cast<int>(n - i);
    const VF v = vfmadd(vload_partial(x + i, left), vload_partial(scale + i, left),
                        vload_partial(shift + i, left));
    vstore_partial(y + i, affine_clamp<kRelu>(v), left);
  }
}

void affine_row(const float* x, const float* scale, const float* shift, int64_t ss, float* y,
                int64_t n, bool relu) {
  if (n <= 0) return;  // scale and shift may be empty
  if (ss == 0 && relu) {
    affine_plane<true>(x, scale[0], shift[0], y, n);
  } else if (ss == 0) {
    affine_plane<false>(x, scale[0], shift[0], y, n);
  } else if (relu) {
    affine_channels<true>(x, scale, shift, y, n);
  } else {
    affine_channels<false>(x, scale, shift, y, n);
  }
}

constexpr BinaryKernels kBinaryKernels{.add = binary_row<OpAdd>,
                                       .sub = binary_row<OpSub>,
                                       .mul = binary_row<OpMul>,
                                       .div = binary_row<OpDiv>,
                                       .affine = affine_row};

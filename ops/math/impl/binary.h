// Float arithmetic on rows, y[i] = a[i * sa] op b[i * sb], written once against the level's
// vector type: both operands contiguous, or one of them a broadcast scalar (stride 0), the
// rows numpy broadcasting reduces to; other strides take a scalar loop. y may be a or b.
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

constexpr BinaryKernels kBinaryKernels{.add = binary_row<OpAdd>,
                                       .sub = binary_row<OpSub>,
                                       .mul = binary_row<OpMul>,
                                       .div = binary_row<OpDiv>};

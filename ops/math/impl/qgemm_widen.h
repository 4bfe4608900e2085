// The int8 GEMM's dot-product step for levels without 8-bit multiply-adds (impl/qgemm.h):
// k in pairs, A words holding two zero-extended 16-bit values, B bytes sign-extended to 16
// bits as they are loaded, and pmaddwd summing each pair into an int32 lane. Every product
// of an unsigned and a signed 8-bit value fits 16 bits, so unlike pmaddubsw (which adds
// pairs of products in saturating 16 bits) nothing can saturate and the sums are exact.
// Included by an ops/math/isa_*.cpp inside its namespace, before impl/qgemm.h; includes
// nothing.

struct QDot {
  static constexpr int kb = 2;
  static constexpr const char* kName = "s16-k2";
  // madd needs a register for the products before it adds them, and without three-operand
  // instructions (the generic level) a copy besides.
  static constexpr int mr = kLanes == 16 ? 12 : (kLanes == 8 ? 6 : 4);
  static VI load_b(const uint8_t* p) { return vload_s8_as_s16(p); }
  static VI madd(VI acc, VI a, VI b) { return viadd(vmadd_s16(a, b), acc); }
};

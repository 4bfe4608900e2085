// float16 Add, Sub, Mul and Div (ops/elementwise/binary.cpp): widened to float, computed by the
// float row kernels and rounded back, so each element is exactly float16(float(a) op float(b)), the
// scalar result; same shapes, a bias along the rows, a column, a scalar on either side, and
// rows longer than one conversion block.
#include <random>
#include <string>
#include <vector>

#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

float apply(const std::string& op, float a, float b) {
  if (op == "Add") return a + b;
  if (op == "Sub") return a - b;
  if (op == "Mul") return a * b;
  return a / b;
}

// Element i of the broadcast of `t` (right-aligned) to `shape`, as float.
float broadcast_element(const Tensor& t, const Shape& shape, int64_t i) {
  int64_t index = 0, stride = 1;
  const size_t skip = shape.size() - t.rank();
  for (size_t d = shape.size(); d-- > 0;) {
    const int64_t coord = i % shape[d];
    i /= shape[d];
    if (d < skip) continue;
    const int64_t dim = t.dim(d - skip);
    if (dim != 1) index += coord * stride;
    stride *= dim;
  }
  return static_cast<float>(element(t, index));
}

}  // namespace

TEST_CASE("float16 Add, Sub, Mul and Div equal the float operation rounded to float16",
          "[ops][binary][float16]") {
  std::mt19937 rng(31);
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{3, 5, 17}, {3, 5, 17}}, {{2, 300}, {300}},        {{4, 70}, {4, 1}}, {{1}, {3, 9}},
      {{5, 600}, {1}},          {{2, 1, 33}, {1, 4, 33}},
  };
  for (const std::string op : {"Add", "Sub", "Mul", "Div"}) {
    for (const auto& [sa, sb] : shapes) {
      const Tensor a = random_tensor(DataType::Float16, sa, rng, -8, 8);
      const Tensor b = random_tensor(DataType::Float16, sb, rng, 0.25, 4);
      INFO(op << " " << a.describe() << ", " << b.describe());
      const Tensor y = OpTest(op, 14).input(a).input(b).run1();
      REQUIRE(y.dtype() == DataType::Float16);
      const Shape& shape = y.shape();
      for (int64_t i = 0; i < y.numel(); ++i) {
        const float want = static_cast<float>(
            float16(apply(op, broadcast_element(a, shape, i), broadcast_element(b, shape, i))));
        INFO("element " << i);
        REQUIRE(static_cast<float>(y.data<const float16>()[i]) == want);
      }
    }
  }
}

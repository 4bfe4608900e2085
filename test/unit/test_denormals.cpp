// Denormal floats (SessionOptions::denormals): flushed to zero by default on every thread of
// a run, kept with Denormals::Keep, and the caller's own floating-point mode untouched.
#include <bit>
#include <cmath>
#include <cstdint>

#include "engine/runtime/session_internal.h"
#include "engine/util/float_mode.h"
#include "test/unit/isa_test.h"
#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

int64_t count_denormals(const Tensor& t) {
  int64_t n = 0;
  const float* p = t.data<const float>();
  for (int64_t i = 0; i < t.numel(); ++i) n += fp::is_denormal(p[i]) ? 1 : 0;
  return n;
}

Session session(std::shared_ptr<ir::Graph> g, Denormals denormals, int threads,
                std::shared_ptr<Environment> env = nullptr) {
  SessionOptions so;
  so.environment = env ? env : std::make_shared<Environment>(threads);
  so.denormals = denormals;
  return session_from_model(make_model(std::move(g)), so);
}

// y = x * c, over `n` floats: with x = 1e-20 and c = 1e-20 every product is 1e-40, a denormal;
// large enough that the kernel splits it among the pool's threads.
std::shared_ptr<ir::Graph> scale_graph(int64_t n) {
  GraphBuilder b;
  b.input("x", DataType::Float, {n}, true);
  b.input("c", DataType::Float, {1}, true);
  b.node("Mul", {"x", "c"}, {"y"});
  b.output("y");
  return b.build();
}

std::vector<NamedValue> scale_feed(int64_t n, float x, float c) {
  return {{"x", Tensor::from_vector<float>({n}, std::vector<float>(static_cast<size_t>(n), x))},
          {"c", Tensor::from_vector<float>({1}, {c})}};
}

// Softmax over rows [0, -100, -100, ...]: the small probabilities, e^-100 / (1 + ...), are
// about 3.7e-44, below FLT_MIN.
std::shared_ptr<ir::Graph> softmax_graph(int64_t rows, int64_t n) {
  GraphBuilder b;
  b.input("x", DataType::Float, {rows, n}, true);
  b.node("Softmax", {"x"}, {"y"}, {int_attr("axis", -1)});
  b.output("y");
  return b.build();
}

Tensor softmax_rows(int64_t rows, int64_t n) {
  std::vector<float> v(static_cast<size_t>(rows * n), -100.0f);
  for (int64_t r = 0; r < rows; ++r) v[static_cast<size_t>(r * n)] = 0.0f;
  return Tensor::from_vector<float>({rows, n}, v);
}

constexpr int64_t kBig = 1 << 22;  // 16 MiB of floats: split among two threads

}  // namespace

KILN_ISA_TEST_CASE("the softmax kernels give 0, not denormals, in the flushing mode",
                   "[denormals][math]") {
  KILN_REQUIRE_ISA();
  const math::VecMathKernels& v = isa_kernels.vec;
  // Rows long enough for the vector loops and a scalar tail; e^-100 is about 3.7e-44.
  for (const int64_t n : {7, 16, 100}) {
    std::vector<float> x(static_cast<size_t>(n), -100.0f), y(x.size()), e(x.size());
    x[0] = 0.0f;
    for (const bool flush : {true, false}) {
      {
        const fp::ModeScope mode(fp::mode_with_flush(flush));
        v.softmax(x.data(), y.data(), n);
        e = x;
        v.softmax_numerators(e.data(), nullptr, n);
      }
      CHECK(y[0] == 1.0f);
      CHECK(e[0] == 1.0f);
      for (size_t i = 1; i < x.size(); ++i) {
        CHECK(fp::is_denormal(y[i]) == !flush);
        CHECK(fp::is_denormal(e[i]) == !flush);
        if (flush) CHECK((y[i] == 0.0f && e[i] == 0.0f));
      }
    }
  }
}

KILN_ISA_TEST_CASE("float16 to float is exact for subnormal halves in the flushing mode",
                   "[denormals][math]") {
  KILN_REQUIRE_ISA();
  // Every half with a zero exponent field, both signs: m * 2^-24, normal floats all, though a
  // conversion that moved the bits into place first would pass through a denormal float.
  std::vector<uint16_t> halves;
  for (uint16_t m = 0; m < 0x400; ++m) {
    halves.push_back(m);
    halves.push_back(static_cast<uint16_t>(0x8000u | m));
  }
  std::vector<float> out(halves.size());
  {
    const fp::ModeScope flush(fp::mode_with_flush(true));
    isa_kernels.convert.f16_to_f32(halves.data(), out.data(), static_cast<int64_t>(out.size()));
  }
  for (size_t i = 0; i < halves.size(); ++i) {
    const float magnitude = std::ldexp(static_cast<float>(halves[i] & 0x3FF), -24);
    const float want = (halves[i] & 0x8000) ? -magnitude : magnitude;
    CHECK(std::bit_cast<uint32_t>(out[i]) == std::bit_cast<uint32_t>(want));
  }
}

TEST_CASE("a run flushes denormals by default, as results and as inputs, on every thread",
          "[denormals]") {
  Session flush = session(scale_graph(kBig), Denormals::Flush, 2);
  // Results: 1e-20 * 1e-20 underflows to a denormal, flushed to zero.
  auto out = flush.run(scale_feed(kBig, 1e-20f, 1e-20f));
  const Tensor& y = out[0].value.tensor();
  CHECK(count_denormals(y) == 0);
  CHECK(y.data<const float>()[0] == 0.0f);
  CHECK(y.data<const float>()[kBig - 1] == 0.0f);
  // Inputs: a denormal reads as zero, so 1e-40 * 2 is 0, not 2e-40.
  out = flush.run(scale_feed(kBig, 1e-40f, 2.0f));
  CHECK(count_denormals(out[0].value.tensor()) == 0);
  CHECK(out[0].value.tensor().data<const float>()[kBig / 2] == 0.0f);

  Session softmax = session(softmax_graph(64, 1000), Denormals::Flush, 2);
  out = softmax.run({{"x", softmax_rows(64, 1000)}});
  CHECK(count_denormals(out[0].value.tensor()) == 0);
  CHECK(out[0].value.tensor().data<const float>()[0] == 1.0f);
}

TEST_CASE("Denormals::Keep keeps them, in the same environment after a flushing run",
          "[denormals]") {
  auto env = std::make_shared<Environment>(2);
  Session flush = session(scale_graph(kBig), Denormals::Flush, 2, env);
  Session keep = session(scale_graph(kBig), Denormals::Keep, 2, env);
  for (int round = 0; round < 2; ++round) {
    auto flushed = flush.run(scale_feed(kBig, 1e-20f, 1e-20f));
    CHECK(count_denormals(flushed[0].value.tensor()) == 0);
    // The pool's workers ran the flushing run's tasks: none keeps that mode for this one.
    auto kept = keep.run(scale_feed(kBig, 1e-20f, 1e-20f));
    CHECK(count_denormals(kept[0].value.tensor()) == kBig);
    kept = keep.run(scale_feed(kBig, 1e-40f, 2.0f));
    CHECK(kept[0].value.tensor().data<const float>()[kBig - 1] == 1e-40f * 2.0f);
  }
  Session softmax = session(softmax_graph(64, 1000), Denormals::Keep, 2, env);
  auto out = softmax.run({{"x", softmax_rows(64, 1000)}});
  CHECK(count_denormals(out[0].value.tensor()) == 64 * 999);
}

TEST_CASE("run() leaves the caller's floating-point mode as it was", "[denormals]") {
  Session flush = session(scale_graph(1024), Denormals::Flush, 1);
  Session keep = session(scale_graph(1024), Denormals::Keep, 1);
  const unsigned own = fp::mode();
  for (const bool caller_flushes : {false, true}) {
    const fp::ModeScope caller(fp::mode_with_flush(caller_flushes));
    const unsigned before = fp::mode();
    auto out = flush.run(scale_feed(1024, 1e-20f, 1e-20f));
    CHECK(count_denormals(out[0].value.tensor()) == 0);
    CHECK(fp::mode() == before);
    out = keep.run(scale_feed(1024, 1e-20f, 1e-20f));
    CHECK(count_denormals(out[0].value.tensor()) == 1024);
    CHECK(fp::mode() == before);
    CHECK(fp::flushing() == caller_flushes);
  }
  CHECK(fp::mode() == own);
}

TEST_CASE("count_denormals counts the denormal floats the nodes output", "[denormals]") {
  for (const Denormals mode : {Denormals::Keep, Denormals::Flush}) {
    SessionOptions so;
    so.environment = std::make_shared<Environment>(2);
    so.denormals = mode;
    so.count_denormals = true;
    so.profile = true;
    Session s = session_from_model(make_model(scale_graph(kBig)), so);
    RunStats stats;
    std::vector<NodeEvent> events;
    RunOptions options;
    s.run(scale_feed(kBig, 1e-20f, 1e-20f), options, &stats, &events);
    const uint64_t want = mode == Denormals::Keep ? kBig : 0;
    CHECK(stats.denormals_produced == want);
    REQUIRE(events.size() == 1);
    CHECK(events[0].denormals == want);
  }
  // Off by default: nothing is counted.
  Session plain = session(scale_graph(1024), Denormals::Keep, 1);
  RunStats stats;
  RunOptions options;
  plain.run(scale_feed(1024, 1e-20f, 1e-20f), options, &stats);
  CHECK(stats.denormals_produced == 0);
}

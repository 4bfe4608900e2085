// Signal (DFT, STFT, windows, mel matrix), string, TfIdf, ai.onnx.ml, training and random
// ops against naive references, formulas and hand-worked cases.
#include <cmath>
#include <complex>
#include <limits>
#include <numbers>

#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

using cd = std::complex<double>;

// Naive O(n^2) DFT of one line, the sign and 1/n as ONNX's DFT op defines them.
std::vector<cd> naive_dft(const std::vector<cd>& x, bool inverse) {
  const size_t n = x.size();
  std::vector<cd> y(n);
  for (size_t k = 0; k < n; ++k) {
    cd acc(0, 0);
    for (size_t j = 0; j < n; ++j) {
      const double a = (inverse ? 2 : -2) * std::numbers::pi * static_cast<double>(j * k % n) /
                       static_cast<double>(n);
      acc += x[j] * cd(std::cos(a), std::sin(a));
    }
    y[k] = inverse ? acc / static_cast<double>(n) : acc;
  }
  return y;
}

// Reference for DFT over `axis` of a [.., n, .., comps] float tensor, with the signal cut or
// zero-padded to `len` and (forward) only the first len/2+1 bins kept when onesided.
Tensor naive_dft_tensor(const Tensor& x, int64_t axis, int64_t len, bool inverse, bool onesided) {
  const Shape& s = x.shape();
  const int64_t r = static_cast<int64_t>(s.size());
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= s[d];
  for (int64_t d = axis + 1; d < r - 1; ++d) inner *= s[d];
  const int64_t n = s[axis], comps = s[r - 1];
  const int64_t n_out = onesided && !inverse ? len / 2 + 1 : len;
  Shape os = s;
  os[axis] = n_out;
  os[r - 1] = 2;
  Tensor y = Tensor::zeros(DataType::Float, os);
  const float* in = x.data<const float>();
  float* out = y.data<float>();
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      std::vector<cd> line(static_cast<size_t>(len), cd(0, 0));
      for (int64_t k = 0; k < std::min(n, len); ++k) {
        const float* p = in + ((o * n + k) * inner + i) * comps;
        line[k] = cd(p[0], comps == 2 ? p[1] : 0.0f);
      }
      const std::vector<cd> f = naive_dft(line, inverse);
      for (int64_t k = 0; k < n_out; ++k) {
        float* q = out + ((o * n_out + k) * inner + i) * 2;
        q[0] = static_cast<float>(f[k].real());
        q[1] = static_cast<float>(f[k].imag());
      }
    }
  }
  return y;
}

Tensor i64(int64_t v) {
  return Tensor::scalar<int64_t>(v);
}

std::vector<std::string> strings(const Tensor& t) {
  return t.to_vector<std::string>();
}

Tensor str_tensor(Shape shape, std::vector<std::string> v) {
  return Tensor::from_vector<std::string>(std::move(shape), v);
}

}  // namespace

// ---- DFT / STFT ----

TEST_CASE("DFT matches a naive DFT for power-of-two and other lengths", "[misc]") {
  std::mt19937 rng(11);
  const int64_t lengths[] = {1, 2, 3, 5, 7, 8, 12, 16, 17, 31, 64, 100};
  for (int64_t n : lengths) {
    for (int comps : {1, 2}) {
      for (bool inverse : {false, true}) {
        const int64_t batch = 1 + static_cast<int64_t>(rng() % 2), other = 1 + rng() % 3;
        Tensor x = random_tensor(DataType::Float, {batch, n, other, comps}, rng);
        INFO("n=" << n << " comps=" << comps << " inverse=" << inverse);
        Tensor y20 = OpTest("DFT", 20)
                         .input(x)
                         .no_input()
                         .input(i64(1))
                         .attr("inverse", int64_t{inverse})
                         .run1();
        require_close(y20, naive_dft_tensor(x, 1, n, inverse, false), 1e-4, 1e-4);
        Tensor y17 =
            OpTest("DFT", 17).input(x).attr("axis", 1).attr("inverse", int64_t{inverse}).run1();
        require_close(y17, naive_dft_tensor(x, 1, n, inverse, false), 1e-4, 1e-4);
      }
    }
  }
}

TEST_CASE("DFT of doubles keeps double precision for prime and power-of-two lengths", "[misc]") {
  std::mt19937 rng(13);
  for (int64_t n : {8, 97, 128, 250}) {
    for (bool inverse : {false, true}) {
      Tensor x = random_tensor(DataType::Double, {1, n, 2}, rng);
      const Tensor y = OpTest("DFT", 20)
                           .input(x)
                           .no_input()
                           .input(i64(1))
                           .attr("inverse", int64_t{inverse})
                           .run1();
      REQUIRE(y.dtype() == DataType::Double);
      std::vector<cd> line(static_cast<size_t>(n));
      for (int64_t k = 0; k < n; ++k)
        line[k] = cd(x.data<double>()[2 * k], x.data<double>()[2 * k + 1]);
      const std::vector<cd> want = naive_dft(line, inverse);
      double err = 0;
      for (int64_t k = 0; k < n; ++k) {
        err = std::max(
            err, std::abs(cd(y.data<double>()[2 * k], y.data<double>()[2 * k + 1]) - want[k]));
      }
      INFO("n=" << n << " inverse=" << inverse);
      CHECK(err < 1e-12);
    }
  }
}

TEST_CASE("DFT axis, dft_length and onesided", "[misc]") {
  std::mt19937 rng(5);
  Tensor x = random_tensor(DataType::Float, {2, 6, 9, 1}, rng);
  // Default axis of opset 20 is -2: the last signal axis.
  require_close(OpTest("DFT", 20).input(x).run1(), naive_dft_tensor(x, 2, 9, false, false), 1e-4,
                1e-4);
  require_close(OpTest("DFT", 20).input(x).no_input().input(i64(-3)).run1(),
                naive_dft_tensor(x, 1, 6, false, false), 1e-4, 1e-4);
  // Padding and truncation to dft_length.
  for (int64_t len : {4, 6, 13, 16}) {
    INFO("len=" << len);
    require_close(OpTest("DFT", 20).input(x).input(i64(len)).input(i64(1)).run1(),
                  naive_dft_tensor(x, 1, len, false, false), 1e-4, 1e-4);
    require_close(OpTest("DFT", 17).input(x).input(i64(len)).attr("onesided", 1).run1(),
                  naive_dft_tensor(x, 1, len, false, true), 1e-4, 1e-4);
  }
}

TEST_CASE("inverse onesided DFT undoes a onesided forward DFT", "[misc]") {
  std::mt19937 rng(8);
  for (int64_t n : {6, 7, 8, 15}) {
    Tensor x = random_tensor(DataType::Float, {2, n, 3, 1}, rng);
    Tensor half = OpTest("DFT", 20).input(x).no_input().input(i64(1)).attr("onesided", 1).run1();
    REQUIRE(half.dim(1) == n / 2 + 1);
    OpTest inv("DFT", 20);
    inv.input(half).attr("inverse", 1).attr("onesided", 1);
    if (n % 2 == 1) {
      inv.input(i64(n));
    } else {
      inv.no_input();  // the default length is 2 * (bins - 1)
    }
    Tensor back = inv.input(i64(1)).run1();
    INFO("n=" << n);
    REQUIRE(back.shape() == x.shape());
    require_close(back, x, 1e-4, 1e-4);
  }
}

TEST_CASE("DFT rejects bad axes, lengths and shapes", "[misc]") {
  std::mt19937 rng(1);
  Tensor x = random_tensor(DataType::Float, {1, 4, 2}, rng);
  REQUIRE_THROWS_AS(OpTest("DFT", 20).input(x).no_input().input(i64(2)).run(), Error);
  REQUIRE_THROWS_AS(OpTest("DFT", 20).input(x).no_input().input(i64(-1)).run(), Error);
  REQUIRE_THROWS_AS(OpTest("DFT", 20).input(x).input(i64(0)).run(), Error);
  REQUIRE_THROWS_AS(OpTest("DFT", 20).input(x).input(i64(-4)).run(), Error);
  REQUIRE_THROWS_AS(OpTest("DFT", 17).input(x).attr("axis", 5).run(), Error);
  Tensor bad = random_tensor(DataType::Float, {1, 4, 3}, rng);
  REQUIRE_THROWS_AS(OpTest("DFT", 20).input(bad).run(), Error);
}

TEST_CASE("STFT frames, windows and transforms the signal", "[misc]") {
  std::mt19937 rng(3);
  const int64_t n = 40, frame = 10, step = 6;
  Tensor x = random_tensor(DataType::Float, {2, n, 1}, rng);
  Tensor w = random_tensor(DataType::Float, {frame}, rng, 0, 1);
  Tensor y = OpTest("STFT", 17).input(x).input(i64(step)).input(w).run1();
  const int64_t frames = (n - frame) / step + 1, bins = frame / 2 + 1;
  REQUIRE(y.shape() == Shape{2, frames, bins, 2});
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t f = 0; f < frames; ++f) {
      std::vector<cd> line(frame);
      for (int64_t k = 0; k < frame; ++k) {
        line[k] = x.data<float>()[b * n + f * step + k] * w.data<float>()[k];
      }
      const auto ref = naive_dft(line, false);
      for (int64_t k = 0; k < bins; ++k) {
        const float* q = y.data<float>() + ((b * frames + f) * bins + k) * 2;
        CHECK(std::abs(q[0] - ref[k].real()) < 1e-4);
        CHECK(std::abs(q[1] - ref[k].imag()) < 1e-4);
      }
    }
  }
  // frame_length without a window is a rectangular window; onesided=0 keeps every bin.
  Tensor full = OpTest("STFT", 17)
                    .input(x)
                    .input(i64(step))
                    .no_input()
                    .input(i64(frame))
                    .attr("onesided", 0)
                    .run1();
  REQUIRE(full.shape() == Shape{2, frames, frame, 2});
  REQUIRE_THROWS_AS(OpTest("STFT", 17).input(x).input(i64(0)).input(w).run(), Error);
  REQUIRE_THROWS_AS(OpTest("STFT", 17).input(x).input(i64(2)).no_input().input(i64(n + 1)).run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("STFT", 17).input(x).input(i64(2)).input(w).input(i64(frame - 1)).run(),
                    Error);
}

// ---- windows and mel ----

TEST_CASE("window functions follow their formulas", "[misc]") {
  struct Case {
    const char* op;
    double a0, a1, a2;
  };
  const Case cases[] = {{"HannWindow", 0.5, 0.5, 0},
                        {"HammingWindow", 25.0 / 46, 21.0 / 46, 0},
                        {"BlackmanWindow", 0.42, 0.5, 0.08}};
  for (const Case& c : cases) {
    for (int periodic : {0, 1}) {
      for (int64_t size : {2, 7, 10}) {
        Tensor y = OpTest(c.op, 17)
                       .input(Tensor::scalar<int32_t>(static_cast<int32_t>(size)))
                       .attr("periodic", periodic)
                       .attr("output_datatype", 11)
                       .run1();
        REQUIRE(y.dtype() == DataType::Double);
        REQUIRE(y.numel() == size);
        const double n = periodic ? size : size - 1;
        for (int64_t i = 0; i < size; ++i) {
          const double x = 2 * std::numbers::pi * i / n;
          CHECK(std::abs(y.data<double>()[i] -
                         (c.a0 - c.a1 * std::cos(x) + c.a2 * std::cos(2 * x))) < 1e-12);
        }
      }
    }
  }
  REQUIRE_THROWS_AS(OpTest("HannWindow", 17).input(i64(-1)).run(), Error);
  REQUIRE_THROWS_AS(OpTest("HannWindow", 17).input(i64(4)).attr("output_datatype", 8).run(), Error);
}

TEST_CASE("MelWeightMatrix places triangular filters like the reference", "[misc]") {
  Tensor y = OpTest("MelWeightMatrix", 17)
                 .input(i64(3))
                 .input(i64(32))
                 .input(i64(16000))
                 .input(Tensor::scalar<float>(0))
                 .input(Tensor::scalar<float>(8000))
                 .run1();
  REQUIRE(y.shape() == Shape{17, 3});
  std::vector<float> expected(17 * 3, 0.0f);
  const float rows[9][3] = {
      {1, 0, 0}, {0.5f, 0.5f, 0}, {0, 1, 0},    {0, 2.f / 3, 1.f / 3}, {0, 1.f / 3, 2.f / 3},
      {0, 0, 1}, {0, 0, 0.75f},   {0, 0, 0.5f}, {0, 0, 0.25f}};
  for (int r = 0; r < 9; ++r) {
    for (int c = 0; c < 3; ++c) expected[r * 3 + c] = rows[r][c];
  }
  require_close(y, Tensor::from_vector<float>({17, 3}, expected));
  REQUIRE_THROWS_AS(OpTest("MelWeightMatrix", 17)
                        .input(i64(3))
                        .input(i64(32))
                        .input(i64(16000))
                        .input(Tensor::scalar<float>(0))
                        .input(Tensor::scalar<float>(30000))
                        .run(),
                    Error);
}

// ---- strings ----

TEST_CASE("StringNormalizer removes stopwords and changes case", "[misc]") {
  Tensor x = str_tensor({1, 4}, {"Monday", "tuesday", "monday", "Wednesday"});
  Tensor y = OpTest("StringNormalizer", 10)
                 .input(x)
                 .attr("case_change_action", "UPPER")
                 .attr("stopwords", std::vector<std::string>{"monday"})
                 .run1();
  CHECK(y.shape() == Shape{1, 2});
  CHECK(strings(y) == std::vector<std::string>{"TUESDAY", "WEDNESDAY"});
  Tensor z = OpTest("StringNormalizer", 10)
                 .input(str_tensor({3}, {"Monday", "monday", "Été"}))
                 .attr("case_change_action", "LOWER")
                 .attr("is_case_sensitive", 1)
                 .attr("stopwords", std::vector<std::string>{"monday"})
                 .run1();
  CHECK(strings(z) == std::vector<std::string>{"monday", "été"});
  Tensor e = OpTest("StringNormalizer", 10)
                 .input(str_tensor({2}, {"a", "A"}))
                 .attr("stopwords", std::vector<std::string>{"a"})
                 .run1();
  CHECK(e.shape() == Shape{1});
  CHECK(strings(e) == std::vector<std::string>{""});
  REQUIRE_THROWS_AS(
      OpTest("StringNormalizer", 10).input(str_tensor({2, 2}, {"a", "b", "c", "d"})).run(), Error);
  REQUIRE_THROWS_AS(
      OpTest("StringNormalizer", 10).input(x).attr("case_change_action", "TITLE").run(), Error);
}

TEST_CASE("StringConcat broadcasts and StringSplit splits like Python", "[misc]") {
  Tensor c = OpTest("StringConcat", 20)
                 .input(str_tensor({2, 1}, {"a", "b"}))
                 .input(str_tensor({3}, {"x", "", "z"}))
                 .run1();
  CHECK(c.shape() == Shape{2, 3});
  CHECK(strings(c) == std::vector<std::string>{"ax", "a", "az", "bx", "b", "bz"});

  auto outs = OpTest("StringSplit", 20)
                  .input(str_tensor({3}, {" a  b c ", "", "d"}))
                  .attr("maxsplit", 1)
                  .outputs(2)
                  .run();
  CHECK(outs[0].tensor().shape() == Shape{3, 2});
  CHECK(strings(outs[0].tensor()) == std::vector<std::string>{"a", "b c ", "", "", "d", ""});
  CHECK(outs[1].tensor().to_vector<int64_t>() == std::vector<int64_t>{2, 0, 1});

  auto d = OpTest("StringSplit", 20)
               .input(str_tensor({2}, {"a--b-", ""}))
               .attr("delimiter", "-")
               .outputs(2)
               .run();
  CHECK(strings(d[0].tensor()) == std::vector<std::string>{"a", "", "b", "", "", "", "", ""});
  CHECK(d[1].tensor().to_vector<int64_t>() == std::vector<int64_t>{4, 1});
}

TEST_CASE("RegexFullMatch matches whole strings with RE2 syntax", "[misc]") {
  auto match = [](const std::string& pattern, std::vector<std::string> in) {
    const int64_t n = static_cast<int64_t>(in.size());
    Tensor y =
        OpTest("RegexFullMatch", 20).input(str_tensor({n}, in)).attr("pattern", pattern).run1();
    std::vector<bool> out;
    for (int64_t i = 0; i < n; ++i) out.push_back(y.data<bool>()[i]);
    return out;
  };
  CHECK(match("www\\.[\\w.-]+\\.\\bcom\\b", {"www.google.com", "www.bbc.co.uk", "xwww.a.com"}) ==
        std::vector<bool>{true, false, false});
  CHECK(match("a.c", {"abc",
                      "a\xC3\xA9"
                      "c",
                      "ac", "a\nc"}) == std::vector<bool>{true, true, false, false});
  CHECK(match("(?i)hello", {"HeLLo", "help"}) == std::vector<bool>{true, false});
  CHECK(match("(?P<year>\\d{4})-\\d\\d", {"2024-01", "24-01"}) == std::vector<bool>{true, false});
  CHECK(match("\\Qa.b\\E", {"a.b", "axb"}) == std::vector<bool>{true, false});
  // Long inputs do not exhaust the stack.
  CHECK(match("(a|b)*c", {std::string(200000, 'a') + "c"}) == std::vector<bool>{true});
  REQUIRE_THROWS_AS(
      OpTest("RegexFullMatch", 20).input(str_tensor({1}, {"aa"})).attr("pattern", "(a)\\1").run(),
      Error);
  REQUIRE_THROWS_AS(
      OpTest("RegexFullMatch", 20).input(str_tensor({1}, {"a"})).attr("pattern", "(a").run(),
      Error);
  REQUIRE_THROWS_AS(
      OpTest("RegexFullMatch", 20).input(str_tensor({1}, {"a"})).attr("pattern", "\\pL").run(),
      Error);
  REQUIRE_THROWS_AS(
      OpTest("RegexFullMatch", 20).input(str_tensor({1}, {"a"})).attr("pattern", "a{2,1001}").run(),
      Error);
  REQUIRE_THROWS_AS(OpTest("RegexFullMatch", 20)
                        .input(str_tensor({1}, {"a"}))
                        .attr("pattern", std::string(20000, 'a'))
                        .run(),
                    Error);
  CHECK(match("a{2,1000}", {"aaa", "a"}) == std::vector<bool>{true, false});
}

// ---- TfIdfVectorizer ----

TEST_CASE("TfIdfVectorizer counts pooled n-grams with skips", "[misc]") {
  // Pool: unigrams {2, 3}, bigrams {(5, 6), (7, 8)}; output columns in reverse order.
  auto make = [](const char* mode, int64_t min_n, int64_t skip) {
    OpTest t("TfIdfVectorizer", 9);
    t.attr("mode", mode)
        .attr("min_gram_length", min_n)
        .attr("max_gram_length", int64_t{2})
        .attr("max_skip_count", skip)
        .attr("ngram_counts", std::vector<int64_t>{0, 2})
        .attr("ngram_indexes", std::vector<int64_t>{3, 2, 1, 0})
        .attr("pool_int64s", std::vector<int64_t>{2, 3, 5, 6, 7, 8});
    return t;
  };
  Tensor x = Tensor::from_vector<int32_t>({2, 6}, {2, 5, 6, 2, 7, 8, 5, 9, 6, 3, 3, 3});
  CHECK(make("TF", 1, 0).input(x).run1().to_vector<float>() ==
        std::vector<float>{1, 1, 0, 2, 0, 0, 3, 0});
  CHECK(make("TF", 1, 1).input(x).run1().to_vector<float>() ==
        std::vector<float>{1, 1, 0, 2, 0, 1, 3, 0});
  CHECK(make("TF", 2, 1).input(x).run1().to_vector<float>() ==
        std::vector<float>{1, 1, 0, 0, 0, 1, 0, 0});
  CHECK(make("IDF", 1, 0)
            .attr("weights", std::vector<float>{0.5f, 1, 2, 4})
            .input(x)
            .run1()
            .to_vector<float>() == std::vector<float>{0.5f, 1, 0, 4, 0, 0, 2, 0});
  CHECK(make("TFIDF", 1, 0)
            .attr("weights", std::vector<float>{0.5f, 1, 2, 4})
            .input(x)
            .run1()
            .to_vector<float>() == std::vector<float>{0.5f, 1, 0, 8, 0, 0, 6, 0});

  Tensor s = str_tensor({5}, {"a", "b", "a", "b", "c"});
  Tensor ys = OpTest("TfIdfVectorizer", 9)
                  .attr("mode", "TF")
                  .attr("min_gram_length", int64_t{1})
                  .attr("max_gram_length", int64_t{2})
                  .attr("max_skip_count", int64_t{0})
                  .attr("ngram_counts", std::vector<int64_t>{0, 1})
                  .attr("ngram_indexes", std::vector<int64_t>{0, 1})
                  .attr("pool_strings", std::vector<std::string>{"c", "a", "b"})
                  .input(s)
                  .run1();
  CHECK(ys.shape() == Shape{2});
  CHECK(ys.to_vector<float>() == std::vector<float>{1, 2});
  REQUIRE_THROWS_AS(make("BM25", 1, 0).input(x).run(), Error);
  REQUIRE_THROWS_AS(make("TF", 3, 0).input(x).run(), Error);
  REQUIRE_THROWS_AS(make("TF", 1, 0).input(s).run(), Error);
}

// ---- ai.onnx.ml ----

TEST_CASE("LabelEncoder maps keys to values with defaults", "[misc]") {
  Tensor x = str_tensor({4}, {"a", "c", "z", "b"});
  Tensor y = OpTest("LabelEncoder", 2, "ai.onnx.ml")
                 .attr("keys_strings", std::vector<std::string>{"a", "b", "c"})
                 .attr("values_int64s", std::vector<int64_t>{7, 8, 9})
                 .input(x)
                 .run1();
  CHECK(y.to_vector<int64_t>() == std::vector<int64_t>{7, 9, -1, 8});

  Tensor f = Tensor::from_vector<float>({3}, {1.5f, NAN, 2.0f});
  Tensor ys = OpTest("LabelEncoder", 4, "ai.onnx.ml")
                  .attr("keys_floats", std::vector<float>{1.5f, NAN})
                  .attr("values_strings", std::vector<std::string>{"x", "nan"})
                  .attr("default_string", "?")
                  .input(f)
                  .run1();
  CHECK(strings(ys) == std::vector<std::string>{"x", "nan", "?"});

  Tensor yt = OpTest("LabelEncoder", 4, "ai.onnx.ml")
                  .attr("keys_tensor", Tensor::from_vector<int32_t>({2}, {3, 4}))
                  .attr("values_tensor", Tensor::from_vector<double>({2}, {0.25, 0.5}))
                  .attr("default_tensor", Tensor::from_vector<double>({1}, {-2}))
                  .input(Tensor::from_vector<int32_t>({3}, {4, 3, 5}))
                  .run1();
  CHECK(yt.to_vector<double>() == std::vector<double>{0.5, 0.25, -2});
  REQUIRE_THROWS_AS(OpTest("LabelEncoder", 2, "ai.onnx.ml")
                        .attr("keys_strings", std::vector<std::string>{"a", "b"})
                        .attr("values_int64s", std::vector<int64_t>{1})
                        .input(x)
                        .run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("LabelEncoder", 2, "ai.onnx.ml")
                        .attr("keys_strings", std::vector<std::string>{"a"})
                        .attr("values_int64s", std::vector<int64_t>{1})
                        .input(Tensor::from_vector<int64_t>({1}, {1}))
                        .run(),
                    Error);
}

namespace {

// One tree: node 0 (x0 <= 1) -> true: node 1 (x1 in {2, 3}) / false: leaf 2.
// Node 1 -> true: leaf 0 / false: leaf 1.
// A second tree rooted at node 1 is used for the aggregation tests.
OpTest tree_test(std::vector<int64_t> true_ids = {1, 0}, std::vector<int64_t> true_leafs = {0, 1},
                 std::vector<int64_t> roots = {0}) {
  OpTest t("TreeEnsemble", 5, "ai.onnx.ml");
  t.attr("n_targets", int64_t{2})
      .attr("tree_roots", std::move(roots))
      .attr("nodes_featureids", std::vector<int64_t>{0, 1})
      .attr("nodes_modes", Tensor::from_vector<uint8_t>({2}, {0, 6}))
      .attr("nodes_splits", Tensor::from_vector<float>({2}, {1, 0}))
      .attr("membership_values", Tensor::from_vector<float>({2}, {2, 3}))
      .attr("nodes_truenodeids", std::move(true_ids))
      .attr("nodes_trueleafs", std::move(true_leafs))
      .attr("nodes_falsenodeids", std::vector<int64_t>{2, 1})
      .attr("nodes_falseleafs", std::vector<int64_t>{1, 1})
      .attr("leaf_targetids", std::vector<int64_t>{0, 1, 0})
      .attr("leaf_weights", Tensor::from_vector<float>({3}, {10, 20, 30}));
  return t;
}

}  // namespace

TEST_CASE("TreeEnsemble walks trees and aggregates leaves", "[misc]") {
  Tensor x = Tensor::from_vector<float>({4, 2}, {0, 2, 1, 5, 4, 3, NAN, 3});
  Tensor y = tree_test().input(x).run1();
  CHECK(y.to_vector<float>() == std::vector<float>{10, 0, 0, 20, 30, 0, 30, 0});
  Tensor logistic = tree_test().attr("post_transform", int64_t{2}).input(x).run1();
  CHECK(std::abs(logistic.data<float>()[0] - 1 / (1 + std::exp(-10.0))) < 1e-6);
  CHECK(std::abs(logistic.data<float>()[1] - 0.5) < 1e-6);
  // Node 1 pointing back to node 0 is a cycle.
  // Two trees (roots 0 and 1) over the first three rows, per aggregate function.
  Tensor x3 = Tensor::from_vector<float>({3, 2}, {0, 2, 1, 5, 4, 3});
  const float big = std::numeric_limits<float>::max();
  const std::vector<std::vector<float>> expected = {{10, 0, 0, 20, 20, 0},            // AVERAGE
                                                    {20, 0, 0, 40, 40, 0},            // SUM
                                                    {10, big, big, 20, 10, big},      // MIN
                                                    {10, -big, -big, 20, 30, -big}};  // MAX
  for (int64_t agg = 0; agg < 4; ++agg) {
    INFO("aggregate_function " << agg);
    Tensor ya = tree_test({1, 0}, {0, 1}, {0, 1}).attr("aggregate_function", agg).input(x3).run1();
    CHECK(ya.to_vector<float>() == expected[static_cast<size_t>(agg)]);
  }
  REQUIRE_THROWS_AS(tree_test({1, 0}, {0, 0}).input(x).run(), Error);
  REQUIRE_THROWS_AS(tree_test().input(Tensor::from_vector<float>({1, 1}, {0})).run(), Error);
  REQUIRE_THROWS_AS(tree_test({1, 7}, {0, 1}).input(x).run(), Error);
}

TEST_CASE("Binarizer and ArrayFeatureExtractor", "[misc]") {
  Tensor b = OpTest("Binarizer", 1, "ai.onnx.ml")
                 .attr("threshold", 0.5f)
                 .input(Tensor::from_vector<float>({4}, {0.2f, 0.5f, 0.7f, -3}))
                 .run1();
  CHECK(b.to_vector<float>() == std::vector<float>{0, 0, 1, 0});
  Tensor x = Tensor::from_vector<int32_t>({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor y = OpTest("ArrayFeatureExtractor", 1, "ai.onnx.ml")
                 .input(x)
                 .input(Tensor::from_vector<int64_t>({3}, {2, 0, 2}))
                 .run1();
  CHECK(y.shape() == Shape{2, 3});
  CHECK(y.to_vector<int32_t>() == std::vector<int32_t>{3, 1, 3, 6, 4, 6});
  Tensor v = OpTest("ArrayFeatureExtractor", 1, "ai.onnx.ml")
                 .input(str_tensor({3}, {"a", "b", "c"}))
                 .input(Tensor::from_vector<int64_t>({1}, {1}))
                 .run1();
  CHECK(v.shape() == Shape{1, 1});
  CHECK(strings(v) == std::vector<std::string>{"b"});
  REQUIRE_THROWS_AS(OpTest("ArrayFeatureExtractor", 1, "ai.onnx.ml")
                        .input(x)
                        .input(Tensor::from_vector<int64_t>({1}, {3}))
                        .run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("ArrayFeatureExtractor", 1, "ai.onnx.ml")
                        .input(x)
                        .input(Tensor::from_vector<int64_t>({1}, {-1}))
                        .run(),
                    Error);
}

// ---- training ----

TEST_CASE("optimisers follow their update formulas", "[misc]") {
  std::mt19937 rng(9);
  const char* domain = "ai.onnx.preview.training";
  Tensor x1 = random_tensor(DataType::Float, {3}, rng),
         x2 = random_tensor(DataType::Float, {2, 2}, rng);
  Tensor g1 = random_tensor(DataType::Float, {3}, rng),
         g2 = random_tensor(DataType::Float, {2, 2}, rng);
  Tensor s1 = random_tensor(DataType::Float, {3}, rng, 0.1, 1);
  Tensor s2 = random_tensor(DataType::Float, {2, 2}, rng, 0.1, 1);
  Tensor h1 = random_tensor(DataType::Float, {3}, rng, 0.1, 1);
  Tensor h2 = random_tensor(DataType::Float, {2, 2}, rng, 0.1, 1);
  const double lr = 0.1, norm = 0.01;
  const int64_t step = 3;
  auto el = [](const Tensor& t, int64_t i) { return static_cast<double>(t.data<float>()[i]); };

  SECTION("Adagrad") {
    auto adagrad = [&] {
      OpTest t("Adagrad", 1, domain);
      t.attr("decay_factor", 0.2f)
          .attr("epsilon", 1e-3f)
          .attr("norm_coefficient", static_cast<float>(norm))
          .input(Tensor::scalar<float>(lr))
          .input(i64(step))
          .input(x1)
          .input(x2)
          .input(g1)
          .input(g2)
          .input(s1)
          .input(s2)
          .outputs(4);
      return t;
    };
    auto out = adagrad().run();
    const double r = lr / (1 + step * 0.2);
    for (int64_t i = 0; i < 4; ++i) {
      const double g = norm * el(x2, i) + el(g2, i);
      const double h = el(s2, i) + g * g;
      CHECK(std::abs(out[3].tensor().data<float>()[i] - h) < 1e-5);
      CHECK(std::abs(out[1].tensor().data<float>()[i] -
                     (el(x2, i) - r * g / (std::sqrt(h) + 1e-3))) < 1e-5);
    }
    // Without the first state's new value: it is not computed into scratch, and the others
    // are the same.
    OpTest without = adagrad();
    without.skip_output(2);
    const std::vector<Value> some = without.run();  // outputs 0, 1 and 3
    CHECK(without.stats().unplanned_scratch == 0);
    REQUIRE(some.size() == 3);
    require_close(some[0].tensor(), out[0].tensor(), 0, 0);
    require_close(some[1].tensor(), out[1].tensor(), 0, 0);
    require_close(some[2].tensor(), out[3].tensor(), 0, 0);
  }
  SECTION("Adam") {
    const double alpha = 0.8, beta = 0.9, eps = 1e-4, post = 0.05;
    auto out = OpTest("Adam", 1, domain)
                   .attr("alpha", static_cast<float>(alpha))
                   .attr("beta", static_cast<float>(beta))
                   .attr("epsilon", static_cast<float>(eps))
                   .attr("norm_coefficient", static_cast<float>(norm))
                   .attr("norm_coefficient_post", static_cast<float>(post))
                   .input(Tensor::scalar<float>(lr))
                   .input(i64(step))
                   .input(x1)
                   .input(x2)
                   .input(g1)
                   .input(g2)
                   .input(s1)
                   .input(s2)
                   .input(h1)
                   .input(h2)
                   .outputs(6)
                   .run();
    const double a = static_cast<float>(alpha), b = static_cast<float>(beta);
    const double r = lr * std::sqrt(1 - std::pow(b, step)) / (1 - std::pow(a, step));
    for (int64_t i = 0; i < 3; ++i) {
      const double g = norm * el(x1, i) + el(g1, i);
      const double v = a * el(s1, i) + (1 - a) * g;
      const double h = b * el(h1, i) + (1 - b) * g * g;
      const double xn = (1 - static_cast<float>(post)) *
                        (el(x1, i) - r * v / (std::sqrt(h) + static_cast<float>(eps)));
      CHECK(std::abs(out[2].tensor().data<float>()[i] - v) < 1e-5);
      CHECK(std::abs(out[4].tensor().data<float>()[i] - h) < 1e-5);
      CHECK(std::abs(out[0].tensor().data<float>()[i] - xn) < 1e-5);
    }
  }
  SECTION("Momentum, standard and Nesterov") {
    for (const char* mode : {"standard", "nesterov"}) {
      const double alpha = static_cast<float>(0.9), beta = static_cast<float>(0.7);
      auto out = OpTest("Momentum", 1, domain)
                     .attr("alpha", static_cast<float>(alpha))
                     .attr("beta", static_cast<float>(beta))
                     .attr("norm_coefficient", static_cast<float>(norm))
                     .attr("mode", mode)
                     .input(Tensor::scalar<float>(lr))
                     .input(i64(step))
                     .input(x1)
                     .input(g1)
                     .input(s1)
                     .outputs(2)
                     .run();
      for (int64_t i = 0; i < 3; ++i) {
        const double g = norm * el(x1, i) + el(g1, i);
        const double v = alpha * el(s1, i) + beta * g;
        const double xn =
            std::string(mode) == "standard" ? el(x1, i) - lr * v : el(x1, i) - lr * (g + alpha * v);
        CHECK(std::abs(out[1].tensor().data<float>()[i] - v) < 1e-5);
        CHECK(std::abs(out[0].tensor().data<float>()[i] - xn) < 1e-5);
      }
    }
  }
  SECTION("errors") {
    REQUIRE_THROWS_AS(OpTest("Momentum", 1, domain)
                          .attr("alpha", 0.9f)
                          .attr("beta", 0.1f)
                          .attr("norm_coefficient", 0.0f)
                          .attr("mode", "heavy")
                          .input(Tensor::scalar<float>(lr))
                          .input(i64(0))
                          .input(x1)
                          .input(g1)
                          .input(s1)
                          .outputs(2)
                          .run(),
                      Error);
    REQUIRE_THROWS_AS(OpTest("Adagrad", 1, domain)
                          .input(Tensor::scalar<float>(lr))
                          .input(i64(0))
                          .input(x1)
                          .input(g2)
                          .input(s1)
                          .outputs(2)
                          .run(),
                      Error);
    REQUIRE_THROWS_AS(OpTest("Adagrad", 1, domain)
                          .input(Tensor::scalar<float>(lr))
                          .input(i64(0))
                          .input(x1)
                          .input(g1)
                          .input(s1)
                          .input(s2)
                          .outputs(2)
                          .run(),
                      Error);
  }
}

// ---- random ----

TEST_CASE("random ops are seeded, in range and roughly distributed", "[misc]") {
  auto uniform = [](float seed) {
    return OpTest("RandomUniform", 1)
        .attr("shape", std::vector<int64_t>{4000})
        .attr("low", -2.0f)
        .attr("high", 3.0f)
        .attr("seed", seed)
        .run1();
  };
  Tensor a = uniform(1), b = uniform(1), c = uniform(2);
  CHECK(a.to_vector<float>() == b.to_vector<float>());
  CHECK(a.to_vector<float>() != c.to_vector<float>());
  double sum = 0;
  for (float v : a.to_vector<float>()) {
    REQUIRE(v >= -2.0f);
    REQUIRE(v <= 3.0f);
    sum += v;
  }
  CHECK(std::abs(sum / 4000 - 0.5) < 0.1);

  Tensor n = OpTest("RandomNormalLike", 1)
                 .attr("mean", 1.0f)
                 .attr("scale", 2.0f)
                 .attr("seed", 3.0f)
                 .attr("dtype", int64_t{11})
                 .input(Tensor::zeros(DataType::Float, {100, 50}))
                 .run1();
  REQUIRE(n.dtype() == DataType::Double);
  double m = 0, sq = 0;
  for (double v : n.to_vector<double>()) {
    m += v;
    sq += v * v;
  }
  m /= 5000;
  CHECK(std::abs(m - 1) < 0.1);
  CHECK(std::abs(std::sqrt(sq / 5000 - m * m) - 2) < 0.1);

  Tensor bern = OpTest("Bernoulli", 15)
                    .attr("seed", 0.0f)
                    .attr("dtype", int64_t{9})
                    .input(Tensor::from_vector<float>({4}, {0, 1, 0, 1}))
                    .run1();
  CHECK(bern.dtype() == DataType::Bool);
  CHECK(bern.to_vector<bool>() == std::vector<bool>{false, true, false, true});

  Tensor mult = OpTest("Multinomial", 7)
                    .attr("sample_size", int64_t{20})
                    .attr("seed", 5.0f)
                    .input(Tensor::from_vector<float>({2, 3}, {0, 50, 0, -INFINITY, -INFINITY, 0}))
                    .run1();
  CHECK(mult.dtype() == DataType::Int32);
  const auto mv = mult.to_vector<int32_t>();
  for (int i = 0; i < 20; ++i) {
    CHECK(mv[i] == 1);
    CHECK(mv[20 + i] == 2);
  }
  REQUIRE_THROWS_AS(OpTest("RandomUniform", 1).attr("shape", std::vector<int64_t>{-1}).run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("RandomUniform", 1)
                        .attr("shape", std::vector<int64_t>{2})
                        .attr("dtype", int64_t{7})
                        .run(),
                    Error);
  REQUIRE_THROWS_AS(OpTest("Multinomial", 7)
                        .input(Tensor::from_vector<float>({1, 2}, {-INFINITY, -INFINITY}))
                        .run(),
                    Error);
}

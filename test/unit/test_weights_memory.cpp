// Weights memory: giving the pages of mapped weights back (release_pages, and after each
// weight's last use with release_weights_after_use), and hollow constants (a session planned
// from shapes whose weights arrive later through set_constant).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "engine/runtime/page_release.h"
#include "engine/runtime/session_internal.h"
#include "proto/loader.h"
#include "proto/testing/model_writer.h"
#include "test/unit/op_test.h"
#include "test/unit/temp_dir.h"

using namespace kiln;
using namespace kiln::testing;
using namespace kiln::proto::testing;
namespace fs = std::filesystem;

namespace {

const size_t kPage = page_size();

// Float i of the test pattern: small halves, so that the sums and products the tests
// compute are exact in float.
float pattern(size_t i) {
  return static_cast<float>(i % 251) * 0.5f;
}

std::vector<float> pattern_range(size_t first_float, size_t count) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = pattern(first_float + i);
  return v;
}

// A file of `bytes` bytes holding the pattern, mapped as the loader maps models.
struct MappedPattern {
  std::shared_ptr<void> mapping;
  const std::byte* base = nullptr;
  MappedPattern(const TempDir& dir, size_t bytes) {
    const std::vector<float> v = pattern_range(0, bytes / sizeof(float));
    const std::string path =
        dir.file("pattern.bin", std::string(reinterpret_cast<const char*>(v.data()), bytes));
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    REQUIRE(p != MAP_FAILED);
    mapping = std::shared_ptr<void>(p, [bytes](void* q) { ::munmap(q, bytes); });
    base = static_cast<const std::byte*>(p);
  }
  // Floats [first, first + count) of the file as a mapped weight.
  Tensor weight(size_t first, size_t count, Shape shape = {}) const {
    if (shape.empty()) shape = {static_cast<int64_t>(count)};
    return Tensor(
        DataType::Float, shape,
        Storage::file_mapping(base + first * sizeof(float), count * sizeof(float), mapping));
  }
};

// Records each madvise call and forwards it (or fails it) while in scope.
struct MadviseRecorder {
  struct Call {
    uintptr_t addr;
    size_t length;
  };
  static inline std::vector<Call> calls;
  static inline bool fail = false;
  static int record(void* addr, size_t length, int advice) {
    calls.push_back({reinterpret_cast<uintptr_t>(addr), length});
    if (fail) {
      errno = EAGAIN;
      return -1;
    }
    return ::madvise(addr, length, advice);
  }
  detail::MadviseFunction previous;
  explicit MadviseRecorder(bool failing = false) {
    calls.clear();
    fail = failing;
    previous = detail::replace_madvise_for_testing(&record);
  }
  ~MadviseRecorder() { detail::replace_madvise_for_testing(previous); }
};

size_t round_up(size_t x) {
  return (x + kPage - 1) / kPage * kPage;
}
size_t round_down(size_t x) {
  return x / kPage * kPage;
}

// An external-data file holding one float tensor per (offset, count), each with the pattern
// starting at its own offset / 4 (so every weight's values are known).
std::string blob_with(const std::vector<std::pair<size_t, size_t>>& tensors) {
  size_t size = 0;
  for (auto [offset, count] : tensors) size = std::max(size, offset + count * sizeof(float));
  std::string blob(size, '\0');
  for (auto [offset, count] : tensors) {
    const std::vector<float> v = pattern_range(offset / sizeof(float), count);
    std::memcpy(blob.data() + offset, v.data(), count * sizeof(float));
  }
  return blob;
}

TensorSpec external(const std::string& name, size_t offset, size_t count,
                    const std::string& location = "weights.bin") {
  TensorSpec t;
  t.name = name;
  t.dims = {static_cast<int64_t>(count)};
  t.store = TensorSpec::Store::External;
  t.location = location;
  t.offset = std::to_string(offset);
  t.length = std::to_string(count * sizeof(float));
  return t;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<float> ones(size_t n) {
  return std::vector<float>(n, 1.0f);
}

}  // namespace

TEST_CASE("release_pages rounds the range inwards to whole pages and counts exactly",
          "[weights-memory]") {
  TempDir dir;
  const size_t floats_per_page = kPage / sizeof(float);
  MappedPattern file(dir, 8 * kPage);
  PageReleaseCounters counters;
  MadviseRecorder recorder;

  // Half a page in, three pages long: only pages 1 and 2 lie wholly inside.
  const Tensor w = file.weight(floats_per_page / 2, 3 * floats_per_page);
  PageRelease r = release_pages(w, &counters);
  CHECK(r.status == PageRelease::Status::Released);
  CHECK(r.bytes == 2 * kPage);
  REQUIRE(recorder.calls.size() == 1);
  CHECK(recorder.calls[0].addr == reinterpret_cast<uintptr_t>(file.base) + kPage);
  CHECK(recorder.calls[0].length == 2 * kPage);
  CHECK(counters.calls == 1);
  CHECK(counters.bytes_released == 2 * kPage);
  CHECK(counters.failures == 0);
  // The data reads back from the file afterwards.
  CHECK(w.to_vector<float>() == pattern_range(floats_per_page / 2, 3 * floats_per_page));

  // Page-aligned at both ends: every page goes.
  r = release_pages(file.weight(2 * floats_per_page, 3 * floats_per_page), &counters);
  CHECK(r.bytes == 3 * kPage);
  CHECK(recorder.calls.back().addr == reinterpret_cast<uintptr_t>(file.base) + 2 * kPage);

  // Smaller than a page, one page long but straddling a boundary, and 4 bytes short of a
  // page at each end: no whole page, no call.
  for (auto [first, count] : {std::pair<size_t, size_t>{25, 250},
                              {floats_per_page / 2, floats_per_page},
                              {1, 2 * floats_per_page - 2}}) {
    r = release_pages(file.weight(first, count), &counters);
    CHECK(r.status == PageRelease::Status::NoWholePage);
    CHECK(r.bytes == 0);
  }
  // Exactly one aligned page.
  r = release_pages(file.weight(floats_per_page, floats_per_page), &counters);
  CHECK(r.bytes == kPage);
  CHECK(counters.calls == 3);
  CHECK(counters.bytes_released == 6 * kPage);
  CHECK(recorder.calls.size() == 3);
  CHECK(file.weight(0, 2 * floats_per_page).to_vector<float>() ==
        pattern_range(0, 2 * floats_per_page));
}

TEST_CASE("release_pages refuses memory that is not a read-only file mapping", "[weights-memory]") {
  const Tensor heap = Tensor::from_vector<float>({2}, {1, 2});
  CHECK_FALSE(pages_releasable(heap));
  CHECK_THAT(error_of([&] { release_pages(heap); }), Catch::Contains("heap memory"));
  std::vector<float> mine(4096, 1.0f);
  const Tensor borrowed = Tensor::borrow(DataType::Float, {4096}, mine.data());
  CHECK_FALSE(pages_releasable(borrowed));
  CHECK_THAT(error_of([&] { release_pages(borrowed); }),
             Catch::Contains("not a read-only file mapping"));
  CHECK_THAT(error_of([&] { release_pages(Tensor()); }), Catch::Contains("has no data"));
  CHECK(mine[0] == 1.0f);
}

TEST_CASE("a failed madvise is reported and counted, never thrown", "[weights-memory]") {
  TempDir dir;
  MappedPattern file(dir, 4 * kPage);
  MadviseRecorder recorder(/*failing=*/true);
  PageReleaseCounters counters;
  const Tensor w = file.weight(0, kPage / sizeof(float));  // the first page
  const PageRelease r = release_pages(w, &counters);
  CHECK(r.status == PageRelease::Status::Failed);
  CHECK_FALSE(r.ok());
  CHECK(r.error == EAGAIN);
  CHECK(r.bytes == kPage);
  CHECK_THAT(r.describe(), Catch::Contains("failed"));
  CHECK(counters.calls == 1);
  CHECK(counters.failures == 1);
  CHECK(counters.bytes_released == 0);
  CHECK(w.to_vector<float>() == pattern_range(0, kPage / sizeof(float)));
}

TEST_CASE("a weight loaded from a file reads back correctly after its pages are released",
          "[weights-memory]") {
  TempDir dir;
  const size_t n = 3 * kPage / sizeof(float) + 123;  // several pages, not a whole number
  ModelSpec m;
  m.inputs = {{"x", {static_cast<int64_t>(n)}}};
  TensorSpec w;
  w.name = "w";
  w.dims = {static_cast<int64_t>(n)};
  w.values = pattern_range(0, n);
  m.initializers = {w};
  m.nodes = {{"Add", {"x", "w"}, {"y"}, "add", {}}};
  m.outputs = {"y"};
  // Lengthen the weight's name until its raw data is float-aligned in the file, so that it
  // is used in place from the mapping.
  std::vector<uint8_t> head(16);
  std::memcpy(head.data(), w.values.data(), head.size());
  std::string bytes;
  for (int pad = 0; pad < 8; ++pad) {
    m.initializers[0].name = "w" + std::string(static_cast<size_t>(pad), '_');
    m.nodes[0].inputs[1] = m.initializers[0].name;
    bytes = model_bytes(m);
    if (find_bytes(bytes, head) % 4 == 0) break;
  }
  REQUIRE(find_bytes(bytes, head) % 4 == 0);
  const std::string path = dir.file("model.onnx", bytes);
  LoadStats stats;
  ir::Model model = proto::load_model_file(path, stats);
  CHECK(stats.weights_mapped_bytes == n * sizeof(float));
  const Tensor weight = model.graph->value(model.graph->initializers.at(0)).constant;
  REQUIRE(pages_releasable(weight));
  PageReleaseCounters counters;
  const PageRelease r = release_pages(weight, &counters);
  CHECK(r.status == PageRelease::Status::Released);
  CHECK(counters.bytes_released >= 2 * kPage);
  Session s = session_from_model(std::move(model));
  auto out = s.run({{"x", Tensor::from_vector<float>({static_cast<int64_t>(n)}, ones(n))}});
  const std::vector<float> y = out.at(0).value.tensor().to_vector<float>();
  for (size_t i = 0; i < n; ++i) REQUIRE(y[i] == pattern(i) + 1.0f);
}

TEST_CASE("the file pages behind a copied (misaligned) weight are released as it is copied",
          "[weights-memory]") {
  TempDir dir;
  // 2.5 MiB and a bit: copied (and released) in several chunks.
  const size_t n = (size_t{5} << 17) + 7;
  ModelSpec m;
  m.inputs = {{"x", {static_cast<int64_t>(n)}}};
  TensorSpec w;
  w.name = "w";
  w.dims = {static_cast<int64_t>(n)};
  w.values = pattern_range(0, n);
  m.initializers = {w};
  m.nodes = {{"Add", {"x", "w"}, {"y"}, "add", {}}};
  m.outputs = {"y"};
  std::vector<uint8_t> head(16);
  std::memcpy(head.data(), w.values.data(), head.size());
  std::string bytes;
  for (int pad = 0; pad < 8; ++pad) {
    m.initializers[0].name = "w" + std::string(static_cast<size_t>(pad), '_');
    m.nodes[0].inputs[1] = m.initializers[0].name;
    bytes = model_bytes(m);
    if (find_bytes(bytes, head) % 4 != 0) break;
  }
  const size_t offset = find_bytes(bytes, head);
  REQUIRE(offset % 4 != 0);
  Session s(dir.file("model.onnx", bytes));
  CHECK(s.load_stats().weights_copied_bytes == n * sizeof(float));
  CHECK(s.load_stats().weights_source_bytes_released ==
        round_down(offset + n * sizeof(float)) - round_up(offset));
  auto out = s.run({{"x", Tensor::from_vector<float>({static_cast<int64_t>(n)}, ones(n))}});
  std::vector<float> expected = pattern_range(0, n);
  for (float& v : expected) v += 1.0f;
  CHECK(out.at(0).value.tensor().to_vector<float>() == expected);
}

TEST_CASE("release_weights_after_use releases each weight after its last use, every run",
          "[weights-memory]") {
  TempDir dir;
  const size_t fpp = kPage / sizeof(float);
  const size_t n = 3 * fpp;
  // Three weights in one external file at offsets that are not page multiples.
  const size_t o1 = 64, o2 = o1 + n * 4 + 256, o3 = o2 + n * 4 + 4096 + 8;
  dir.file("weights.bin", blob_with({{o1, n}, {o2, n}, {o3, n}}));
  ModelSpec m;
  m.inputs = {{"x", {static_cast<int64_t>(n)}}};
  m.initializers = {external("w1", o1, n), external("w2", o2, n), external("w3", o3, n)};
  // w1 is read again after w2's only reader: w2 goes first, then w1, then w3.
  m.nodes = {{"Add", {"x", "w1"}, {"a"}, "a", {}},
             {"Add", {"a", "w2"}, {"b"}, "b", {}},
             {"Add", {"b", "w1"}, {"c"}, "c", {}},
             {"Add", {"c", "w3"}, {"y"}, "y", {}}};
  m.outputs = {"y"};
  const std::string path = dir.file("model.onnx", model_bytes(m));
  auto interior = [&](size_t offset) { return round_down(offset + n * 4) - round_up(offset); };
  const uint64_t expected_bytes = interior(o1) + interior(o2) + interior(o3);

  SessionOptions so;
  so.release_weights_after_use = true;
  Session s(path, so);
  MadviseRecorder recorder;
  for (int run = 0; run < 2; ++run) {
    recorder.calls.clear();
    auto out = s.run({{"x", Tensor::from_vector<float>({static_cast<int64_t>(n)}, ones(n))}});
    const std::vector<float> y = out.at(0).value.tensor().to_vector<float>();
    for (size_t i = 0; i < n; ++i) {
      REQUIRE(y[i] == 1.0f + 2 * pattern(o1 / 4 + i) + pattern(o2 / 4 + i) + pattern(o3 / 4 + i));
    }
    const RunStats& st = s.last_run_stats();
    CHECK(st.weight_pages.calls == 3);
    CHECK(st.weight_pages.bytes_released == expected_bytes);
    CHECK(st.weight_pages.failures == 0);
    CHECK(st.weight_release_error.empty());
    // Order w2, w1, w3; addresses are the file offsets rounded up, from one mapping.
    REQUIRE(recorder.calls.size() == 3);
    const uintptr_t base = recorder.calls[1].addr - round_up(o1);
    CHECK(recorder.calls[0].addr == base + round_up(o2));
    CHECK(recorder.calls[2].addr == base + round_up(o3));
    CHECK(recorder.calls[0].length == interior(o2));
  }

  // Off by default: nothing is released.
  Session plain(path);
  plain.run({{"x", Tensor::from_vector<float>({static_cast<int64_t>(n)}, ones(n))}});
  CHECK(plain.last_run_stats().weight_pages.calls == 0);
}

TEST_CASE("a failed release leaves the run going, counted and described", "[weights-memory]") {
  TempDir dir;
  const size_t n = 2 * kPage / sizeof(float);
  dir.file("weights.bin", blob_with({{0, n}}));
  ModelSpec m;
  m.inputs = {{"x", {static_cast<int64_t>(n)}}};
  m.initializers = {external("w", 0, n)};
  m.nodes = {{"Add", {"x", "w"}, {"y"}, "add", {}}};
  m.outputs = {"y"};
  SessionOptions so;
  so.release_weights_after_use = true;
  Session s(dir.file("model.onnx", model_bytes(m)), so);
  MadviseRecorder recorder(/*failing=*/true);
  auto out = s.run({{"x", Tensor::from_vector<float>({static_cast<int64_t>(n)}, ones(n))}});
  CHECK(out.at(0).value.tensor().to_vector<float>()[5] == 1.0f + pattern(5));
  const RunStats& st = s.last_run_stats();
  CHECK(st.weight_pages.calls == 1);
  CHECK(st.weight_pages.failures == 1);
  CHECK(st.weight_pages.bytes_released == 0);
  CHECK_THAT(st.weight_release_error, Catch::Contains("weight 'w'"));
  CHECK_THAT(st.weight_release_error, Catch::Contains("failed"));
}

TEST_CASE(
    "weights captured by a nested graph are released after the outer node, views of a "
    "weight keep it resident",
    "[weights-memory]") {
  TempDir dir;
  const size_t fpp = kPage / sizeof(float);
  const size_t n = 2 * fpp;
  const auto ni = static_cast<int64_t>(n);
  MappedPattern file(dir, 16 * kPage);
  // Page-aligned weights of two pages each at pages 0, 4, 8, 12.
  const Tensor w1 = file.weight(0, n), w2 = file.weight(4 * fpp, n), w3 = file.weight(8 * fpp, n),
               w4 = file.weight(12 * fpp, n, {2, ni / 2});
  auto page_of = [&](uintptr_t addr) {
    return (addr - reinterpret_cast<uintptr_t>(file.base)) / kPage;
  };

  GraphBuilder then_b("then");
  then_b.node("Mul", {"a", "w2"}, {"t"});
  then_b.output("t");
  GraphBuilder else_b("else");
  else_b.node("Sub", {"a", "w2"}, {"e"});
  else_b.output("e");
  GraphBuilder main("main");
  main.input("x", DataType::Float, {ni});
  main.input("cond", DataType::Bool, {}, true);
  main.initializer("w1", w1).initializer("w2", w2).initializer("w3", w3).initializer("w4", w4);
  main.initializer("flat", Tensor::from_vector<int64_t>({1}, {ni}));
  // w4 is read only through its reshaped view r, which the last node reads.
  main.node("Reshape", {"w4", "flat"}, {"r"});
  main.node("Add", {"x", "w1"}, {"a"});
  main.node("If", {"cond"}, {"b"},
            {graph_attr("then_branch", then_b.build()), graph_attr("else_branch", else_b.build())});
  main.node("Add", {"b", "w3"}, {"c"});
  main.node("Add", {"c", "r"}, {"y"});
  main.output("y");
  SessionOptions so;
  so.environment = std::make_shared<Environment>(1);
  so.release_weights_after_use = true;
  Session s = session_from_model(make_model(main.build()), so);

  MadviseRecorder recorder;
  auto out = s.run(
      {{"x", Tensor::from_vector<float>({ni}, ones(n))}, {"cond", Tensor::scalar<bool>(true)}});
  const std::vector<float> y = out.at(0).value.tensor().to_vector<float>();
  for (size_t i = 0; i < n; ++i) {
    REQUIRE(y[i] == (1.0f + pattern(i)) * pattern(4 * fpp + i) + pattern(8 * fpp + i) +
                        pattern(12 * fpp + i));
  }
  // w1 after its Add, w2 after the If (its branch read it), w3 and w4 with the last nodes.
  std::vector<uintptr_t> pages;
  for (const auto& c : recorder.calls) pages.push_back(page_of(c.addr));
  CHECK(pages == std::vector<uintptr_t>{0, 4, 8, 12});
  CHECK(s.last_run_stats().weight_pages.calls == 4);
  CHECK(s.last_run_stats().weight_pages.bytes_released == 8 * kPage);
}

TEST_CASE("a missing external data file is a load error unless weights may come later",
          "[weights-memory]") {
  TempDir dir;
  ModelSpec m;
  m.inputs = {{"x", {4}}};
  m.initializers = {external("w", 0, 4, "later.bin")};
  m.nodes = {{"Add", {"x", "w"}, {"y"}, "add", {}}};
  m.outputs = {"y"};
  const std::string path = dir.file("model.onnx", model_bytes(m));
  const std::string err = error_of([&] { Session s(path); });
  CHECK_THAT(err, Catch::Contains("model.onnx"));
  CHECK_THAT(err, Catch::Contains("tensor 'w'"));
  CHECK_THAT(err, Catch::Contains("cannot open"));

  SessionOptions so;
  so.defer_missing_weights = true;
  Session s(path, so);
  CHECK(s.load_stats().weights_deferred_count == 1);
  CHECK(s.load_stats().weights_deferred_bytes == 16);
  CHECK(s.load_stats().weights_bytes == 0);
  REQUIRE(s.missing_constants().size() == 1);
  CHECK(s.missing_constants()[0].describe() == "w: float32[4]");

  auto x = [] { return Tensor::from_vector<float>({4}, {1, 2, 3, 4}); };
  const std::string run_err = error_of([&] { s.run({{"x", x()}}); });
  CHECK_THAT(run_err, Catch::Contains("1 constant(s) have no data yet"));
  CHECK_THAT(run_err, Catch::Contains("w: float32[4]"));
  CHECK_THAT(run_err, Catch::Contains("set_constant"));

  const std::vector<float> w = {10, 20, 30, 40};
  CHECK_THAT(error_of([&] { s.set_constant("w", w.data(), 12); }),
             Catch::Contains("float32[4] takes 16 bytes, given 12"));
  CHECK_THAT(error_of([&] { s.set_constant("nope", w.data(), 16); }),
             Catch::Contains("no value of that name"));
  CHECK_THAT(error_of([&] { s.set_constant("x", w.data(), 16); }),
             Catch::Contains("not a hollow constant"));
  CHECK_THAT(error_of([&] { s.set_constant("y", w.data(), 16); }),
             Catch::Contains("not a hollow constant"));
  s.set_constant("w", w.data(), 16);
  CHECK(s.missing_constants().empty());
  CHECK(s.load_stats().weights_copied_count == 1);
  CHECK(s.load_stats().weights_copied_bytes == 16);
  CHECK(s.load_stats().weights_bytes == 16);
  auto out = s.run({{"x", x()}});
  CHECK(out.at(0).value.tensor().to_vector<float>() == std::vector<float>{11, 22, 33, 44});
  CHECK_THAT(error_of([&] { s.set_constant("w", w.data(), 16); }),
             Catch::Contains("already given"));
}

TEST_CASE("hollow constants next to loaded ones, a loaded one cannot be replaced",
          "[weights-memory]") {
  TempDir dir;
  dir.file("weights.bin", blob_with({{0, 4}}));
  ModelSpec m;
  m.inputs = {{"x", {4}}};
  m.initializers = {external("w", 0, 4), external("v", 0, 4, "missing/v.bin")};
  m.nodes = {{"Add", {"x", "w"}, {"a"}, "a", {}}, {"Mul", {"a", "v"}, {"y"}, "y", {}}};
  m.outputs = {"y"};
  SessionOptions so;
  so.defer_missing_weights = true;
  Session s(dir.file("model.onnx", model_bytes(m)), so);
  CHECK(s.load_stats().weights_mapped_bytes == 16);
  CHECK(s.load_stats().weights_deferred_count == 1);
  const std::vector<float> v = {2, 2, 2, 2};
  CHECK_THAT(error_of([&] { s.set_constant("w", v.data(), 16); }),
             Catch::Contains("its data was loaded with the model"));
  s.set_constant("v", v.data(), 16);
  auto out = s.run({{"x", Tensor::from_vector<float>({4}, {1, 1, 1, 1})}});
  CHECK(out.at(0).value.tensor().to_vector<float>() ==
        std::vector<float>{2 * (1 + pattern(0)), 2 * (1 + pattern(1)), 2 * (1 + pattern(2)),
                           2 * (1 + pattern(3))});
}

TEST_CASE("a model built in memory declares its weights and receives them later",
          "[weights-memory]") {
  // External data with no folder to resolve it against: with defer_missing_weights every
  // external initializer is hollow, whatever its location says.
  ModelSpec m;
  m.inputs = {{"x", {2, 3}}};
  TensorSpec axes = external("axes", 0, 1, "pending");
  axes.dtype = DataType::Int64;
  axes.length = "8";
  m.initializers = {external("w", 0, 6, "pending"), axes};
  m.initializers[0].dims = {2, 3};
  // ReduceSum reads constant axes when its kernel is created: a hollow one must not be
  // presented as known then, or the kernel would read bytes that do not exist yet.
  m.nodes = {{"Mul", {"x", "w"}, {"p"}, "mul", {}},
             {"ReduceSum", {"p", "axes"}, {"y"}, "sum", {{"keepdims", 0}}}};
  m.outputs = {"y"};
  const std::string bytes = model_bytes(m);
  CHECK_THAT(error_of([&] { Session::from_memory(bytes.data(), bytes.size()); }),
             Catch::Contains("cannot be resolved for a model loaded from memory"));
  SessionOptions so;
  so.defer_missing_weights = true;
  Session s = Session::from_memory(bytes.data(), bytes.size(), so);
  CHECK(s.missing_constants().size() == 2);
  CHECK(s.load_stats().weights_deferred_bytes == 24 + 8);
  const std::vector<float> w = {1, 2, 3, 4, 5, 6};
  s.set_constant("w", w.data(), w.size() * sizeof(float));
  const std::string err = error_of([&] {
    s.run({{"x", Tensor::from_vector<float>({2, 3}, ones(6))}});
  });
  CHECK_THAT(err, Catch::Contains("axes: int64[1]"));
  CHECK_THAT(err, !Catch::Contains("w: float32"));
  const int64_t axis = 1;
  s.set_constant("axes", &axis, sizeof(axis));
  auto out = s.run({{"x", Tensor::from_vector<float>({2, 3}, ones(6))}});
  CHECK(out.at(0).value.tensor().to_vector<float>() == std::vector<float>{6, 15});
  CHECK(s.load_stats().weights_copied_bytes == 32);
}

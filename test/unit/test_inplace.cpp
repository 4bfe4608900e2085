// In-place execution, proved with exact counters: a KV cache given with spare capacity is
// extended by Concat in O(1) (only the new token's bytes are copied), through a Shape reader
// in either order, through an If capture, and across Loop iterations; values the graph
// still needs are never written.
#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

constexpr int64_t kHeads = 4, kHeadDim = 16, kCapacity = 64;
constexpr uint64_t kTokenBytes = kHeads * kHeadDim * sizeof(float);  // one token, one cache

// A [1, H, len, D] cache with room for kCapacity tokens, filled with its position index.
Tensor kv_cache(int64_t len) {
  Tensor t = Tensor::with_capacity(DataType::Float, {1, kHeads, len, kHeadDim}, 2, kCapacity);
  for (int64_t h = 0; h < kHeads; ++h) {
    for (int64_t s = 0; s < len; ++s) {
      for (int64_t d = 0; d < kHeadDim; ++d) {
        t.data<float>()[(h * kCapacity + s) * kHeadDim + d] = static_cast<float>(s);
      }
    }
  }
  return t;
}

Tensor new_token(float value) {
  return Tensor::from_vector<float>({1, kHeads, 1, kHeadDim},
                                    std::vector<float>(kHeads * kHeadDim, value));
}

// Checks that `t` holds positions 0..len-2 and then `last`.
void require_cache(const Tensor& t, int64_t len, float last) {
  REQUIRE(t.shape() == Shape{1, kHeads, len, kHeadDim});
  const auto v = t.to_vector<float>();
  for (int64_t h = 0; h < kHeads; ++h) {
    for (int64_t s = 0; s < len; ++s) {
      const float want = s == len - 1 ? last : static_cast<float>(s);
      REQUIRE(v[static_cast<size_t>((h * len + s) * kHeadDim)] == want);
    }
  }
}

}  // namespace

TEST_CASE(
    "Concat appends into spare capacity, copying only the new token, whatever the order of a Shape "
    "reader",
    "[inplace][concat]") {
  for (bool shape_first : {true, false}) {
    GraphBuilder b;
    b.input("past", DataType::Float, {1, kHeads, -1, kHeadDim});
    b.input("new", DataType::Float, {1, kHeads, 1, kHeadDim});
    if (shape_first) b.node("Shape", {"past"}, {"past_shape"});
    b.node("Concat", {"past", "new"}, {"present"}, {int_attr("axis", 2)});
    if (!shape_first) b.node("Shape", {"past"}, {"past_shape"});
    b.output("present").output("past_shape");
    Session s = make_session(b.build());
    Tensor past = kv_cache(10);
    const std::byte* storage = past.raw_data();
    auto out = s.run({{"past", std::move(past)}, {"new", new_token(99)}});
    INFO("shape_first " << shape_first);
    const Tensor& present = out[0].value.tensor();
    require_cache(present, 11, 99);
    CHECK(present.raw_data() == storage);  // the caller's buffer, extended
    CHECK(s.last_run_stats().bytes_copied == kTokenBytes);
    CHECK(s.last_run_stats().bytes_copied_concat == kTokenBytes);
    CHECK(s.last_run_stats().in_place_ops == 1);
    CHECK(out[1].value.tensor().to_vector<int64_t>() ==
          std::vector<int64_t>{1, kHeads, 10, kHeadDim});
  }
}

TEST_CASE("appending costs the same at every cache length, and the result feeds the next step",
          "[inplace][concat]") {
  GraphBuilder b;
  b.input("past", DataType::Float, {1, kHeads, -1, kHeadDim});
  b.input("new", DataType::Float, {1, kHeads, 1, kHeadDim});
  b.node("Concat", {"past", "new"}, {"present"}, {int_attr("axis", 2)});
  b.output("present");
  Session s = make_session(b.build());
  Tensor cache = kv_cache(1);
  for (int64_t step = 1; step < kCapacity; ++step) {
    auto out = s.run({{"past", std::move(cache)}, {"new", new_token(static_cast<float>(step))}});
    cache = std::move(out[0].value.tensor());
    REQUIRE(s.last_run_stats().bytes_copied == kTokenBytes);
    REQUIRE(s.last_run_stats().allocations == 0);
  }
  CHECK(cache.dim(2) == kCapacity);
  const auto v = cache.to_vector<float>();
  for (int64_t p = 0; p < kCapacity; ++p)
    CHECK(v[static_cast<size_t>(p * kHeadDim)] == static_cast<float>(p));
}

TEST_CASE("when the room runs out the cache moves once into twice the capacity",
          "[inplace][concat]") {
  GraphBuilder b;
  b.input("past", DataType::Float, {1, kHeads, -1, kHeadDim});
  b.input("new", DataType::Float, {1, kHeads, 2, kHeadDim});
  b.node("Concat", {"past", "new"}, {"present"}, {int_attr("axis", 2)});
  b.output("present");
  Session s = make_session(b.build());
  // 63 of 64 used, 2 more needed.
  Tensor past = kv_cache(kCapacity - 1);
  auto out = s.run({{"past", std::move(past)},
                    {"new", Tensor::zeros(DataType::Float, {1, kHeads, 2, kHeadDim})}});
  const Tensor& grown = out[0].value.tensor();
  CHECK(grown.dim(2) == kCapacity + 1);
  CHECK(grown.strides()[1] == 2 * kCapacity * kHeadDim);  // capacity doubled
  CHECK(s.last_run_stats().bytes_copied == (kCapacity - 1) * kTokenBytes + 2 * kTokenBytes);
}

TEST_CASE("a contiguous owned input with no room is copied as usual", "[inplace][concat]") {
  Tensor a = Tensor::from_vector<float>({2, 2}, {1, 2, 3, 4});
  Tensor c = Tensor::from_vector<float>({2, 1}, {5, 6});
  OpTest t("Concat", 13);
  t.input(a).input(c).attr("axis", 1).owned_inputs();
  CHECK(t.run1().to_vector<float>() == std::vector<float>{1, 2, 5, 3, 4, 6});
  CHECK(t.stats().bytes_copied == 6 * sizeof(float));
  CHECK(t.stats().in_place_ops == 0);
}

namespace {

// main(past, new, use_cache): present = If(use_cache, then: Concat(past, new), else: new).
// With `reread`, the outer graph also reads `past` after the If.
std::shared_ptr<ir::Graph> if_kv_graph(bool reread) {
  GraphBuilder then_b("with_past");
  then_b.node("Shape", {"past"}, {"past_len"});
  then_b.node("Concat", {"past", "new"}, {"present"}, {int_attr("axis", 2)});
  then_b.output("present");
  GraphBuilder else_b("no_past");
  else_b.node("Identity", {"new"}, {"fresh"});
  else_b.output("fresh");
  GraphBuilder m("main");
  m.input("past", DataType::Float, {1, kHeads, -1, kHeadDim});
  m.input("new", DataType::Float, {1, kHeads, 1, kHeadDim});
  m.input("use_cache", DataType::Bool, {1});
  m.node("If", {"use_cache"}, {"present"},
         {graph_attr("then_branch", then_b.build()), graph_attr("else_branch", else_b.build())});
  m.output("present");
  if (reread) {
    m.node("ReduceSum", {"past"}, {"past_sum"}, {int_attr("keepdims", 0)});
    m.output("past_sum");
  }
  return m.build();
}

}  // namespace

TEST_CASE("an If branch extends a captured cache the caller moved in: only the token is copied",
          "[inplace][if]") {
  Session s = make_session(if_kv_graph(false));
  Tensor past = kv_cache(20);
  const std::byte* storage = past.raw_data();
  auto out = s.run({{"past", std::move(past)},
                    {"new", new_token(7)},
                    {"use_cache", Tensor::from_vector<bool>({1}, {true})}});
  require_cache(out[0].value.tensor(), 21, 7);
  CHECK(out[0].value.tensor().raw_data() == storage);
  CHECK(s.last_run_stats().bytes_copied == kTokenBytes);
  CHECK(s.last_run_stats().bytes_copied_capture == 0);
}

TEST_CASE("an If branch reads a cache the outer graph still needs by reference, and stays correct",
          "[inplace][if]") {
  Session s = make_session(if_kv_graph(true));
  Tensor past = kv_cache(20);
  auto out = s.run({{"past", std::move(past)},
                    {"new", new_token(7)},
                    {"use_cache", Tensor::from_vector<bool>({1}, {true})}});
  require_cache(out[0].value.tensor(), 21, 7);
  // The concat had to copy (past is read again after the If), and the later reader saw the
  // original values: sum over heads and dims of positions 0..19.
  CHECK(s.last_run_stats().bytes_copied == 21 * kTokenBytes);
  CHECK(out[1].value.tensor().to_vector<float>()[0] == Approx(kHeads * kHeadDim * (19 * 20 / 2)));
}

TEST_CASE("a Loop carries a growing tensor, appending in place each iteration", "[inplace][loop]") {
  // body(i, cond, acc): acc' = Concat(acc, row), row = [1, H, 1, D] of i.
  GraphBuilder body("body");
  body.input("i", DataType::Int64, {}, true);
  body.input("cond", DataType::Bool, {}, true);
  body.input("acc", DataType::Float, {1, kHeads, -1, kHeadDim}, true);
  body.initializer("row_shape", Tensor::from_vector<int64_t>({4}, {1, kHeads, 1, kHeadDim}));
  body.node("Cast", {"i"}, {"fi"}, {int_attr("to", static_cast<int64_t>(DataType::Float))});
  body.node("Expand", {"fi", "row_shape"}, {"row"});
  body.node("Concat", {"acc", "row"}, {"acc_next"}, {int_attr("axis", 2)});
  body.node("Identity", {"cond"}, {"cond_out"});
  body.output("cond_out").output("acc_next");
  GraphBuilder m("main");
  m.input("acc0", DataType::Float, {1, kHeads, -1, kHeadDim});
  m.initializer("trips", Tensor::scalar<int64_t>(30));
  m.initializer("true", Tensor::scalar<bool>(true));
  m.node("Loop", {"trips", "true", "acc0"}, {"acc"}, {graph_attr("body", body.build())});
  m.output("acc");
  Session s = make_session(m.build());
  auto out = s.run({{"acc0", kv_cache(0)}});  // empty, room for kCapacity
  const Tensor& acc = out[0].value.tensor();
  REQUIRE(acc.dim(2) == 30);
  const auto v = acc.to_vector<float>();
  for (int64_t p = 0; p < 30; ++p)
    CHECK(v[static_cast<size_t>(p * kHeadDim)] == static_cast<float>(p));
  // Each iteration copies its row (Expand materialises nothing: it is a view, the Concat
  // writes the row once).
  CHECK(s.last_run_stats().bytes_copied_concat == 30 * kTokenBytes);
  CHECK(s.last_run_stats().in_place_ops >= 30);
}

TEST_CASE("Cast between equal-size types writes into an owned input, a borrowed one is kept",
          "[inplace][cast]") {
  GraphBuilder b;
  b.input("x", DataType::Float, {-1});
  b.node("Cast", {"x"}, {"y"}, {int_attr("to", static_cast<int64_t>(DataType::Int32))});
  b.output("y");
  Session s = make_session(b.build());
  const std::vector<float> values{1.5f, -2.25f, 3.0f, 1e6f, -7.75f};
  const std::vector<int32_t> want{1, -2, 3, 1000000, -7};

  Tensor owned = Tensor::from_vector<float>({5}, values);
  const std::byte* storage = owned.raw_data();
  auto out = s.run({{"x", std::move(owned)}});
  CHECK(out[0].value.tensor().to_vector<int32_t>() == want);
  CHECK(out[0].value.tensor().raw_data() == storage);
  CHECK(s.last_run_stats().in_place_ops == 1);
  CHECK(s.last_run_stats().allocations == 0);

  const Tensor kept = Tensor::from_vector<float>({5}, values);
  out = s.run({{"x", kept}});
  CHECK(out[0].value.tensor().to_vector<int32_t>() == want);
  CHECK(out[0].value.tensor().raw_data() != kept.raw_data());
  CHECK(kept.to_vector<float>() == values);
  CHECK(s.last_run_stats().in_place_ops == 0);
}

TEST_CASE("Gemm writes Y over a full-size C it is the last reader of", "[inplace][gemm]") {
  GraphBuilder b;
  b.input("a", DataType::Float, {2, 3});
  b.input("b", DataType::Float, {3, 4});
  b.input("c", DataType::Float, {2, 4});
  b.node("Gemm", {"a", "b", "c"}, {"y"}, {float_attr("beta", 0.5f)});
  b.output("y");
  Session s = make_session(b.build());
  const std::vector<float> a{1, 2, 3, 4, 5, 6}, bv{1, 0, 0, 1, 0, 1, 0, 1, 0, 0, 1, 1};
  const std::vector<float> c{2, 4, 6, 8, 10, 12, 14, 16};
  // y = a b + 0.5 c
  const std::vector<float> want{2, 4, 6, 10, 9, 11, 13, 23};
  Tensor owned = Tensor::from_vector<float>({2, 4}, c);
  const std::byte* storage = owned.raw_data();
  auto out = s.run({{"a", Tensor::from_vector<float>({2, 3}, a)},
                    {"b", Tensor::from_vector<float>({3, 4}, bv)},
                    {"c", std::move(owned)}});
  CHECK(out[0].value.tensor().to_vector<float>() == want);
  CHECK(out[0].value.tensor().raw_data() == storage);
  CHECK(s.last_run_stats().in_place_ops == 1);

  const Tensor kept = Tensor::from_vector<float>({2, 4}, c);
  out = s.run({{"a", Tensor::from_vector<float>({2, 3}, a)},
               {"b", Tensor::from_vector<float>({3, 4}, bv)},
               {"c", kept}});
  CHECK(out[0].value.tensor().to_vector<float>() == want);
  CHECK(out[0].value.tensor().raw_data() != kept.raw_data());
  CHECK(kept.to_vector<float>() == c);
}

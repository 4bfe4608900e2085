// The executor's fixed cost per node, as exact heap allocation counts: a warm run of a long
// chain of tiny ops must allocate no more per node than the tensor handles it produces.
// Counted with a replacement operator new that counts the calling thread's allocations only
// (sessions here run on one thread), so other threads cannot disturb the counts.
#include <cstdlib>
#include <new>
#include <random>

// The replacement operator delete frees what the replacement operator new took from malloc;
// GCC cannot see that pairing where it inlines them.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include "engine/runtime/buffer_pool.h"
#include "kiln/generate.h"
#include "test/unit/op_test.h"
#include "tools/common/npy.h"

namespace {
thread_local uint64_t g_heap_allocations = 0;
thread_local std::size_t g_largest_allocation = 0;  // the largest since last reset
}  // namespace

void* operator new(std::size_t size) {
  ++g_heap_allocations;
  if (size > g_largest_allocation) g_largest_allocation = size;
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t size) {
  return ::operator new(size);
}
// The nothrow forms too (std::stable_sort's temporary buffer uses them): every unaligned
// allocation comes from malloc, so the replacement deletes always free malloc's memory.
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  ++g_heap_allocations;
  if (size > g_largest_allocation) g_largest_allocation = size;
  return std::malloc(size == 0 ? 1 : size);
}
void* operator new[](std::size_t size, const std::nothrow_t& tag) noexcept {
  return ::operator new(size, tag);
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}

using namespace kiln;
using namespace kiln::testing;

namespace {

// Heap allocations of one warm run (after two runs with the same inputs).
uint64_t warm_run_allocations(Session& s, const std::vector<NamedValue>& feed) {
  s.run(feed);
  s.run(feed);
  const uint64_t before = g_heap_allocations;
  { auto out = s.run(feed); }
  return g_heap_allocations - before;
}

// The same with Session::run's reusing form: the caller's vectors are kept from run to run.
// g_largest_allocation is reset before the counted run, so it holds that run's largest.
uint64_t warm_reusing_run_allocations(Session& s, std::vector<NamedValue>& in,
                                      const std::vector<Tensor>& values,
                                      std::vector<NamedValue>& out) {
  auto run = [&] {
    for (size_t i = 0; i < in.size(); ++i) in[i].value = values[i];
    s.run(in, out);
  };
  run();
  run();
  const uint64_t before = g_heap_allocations;
  g_largest_allocation = 0;
  run();
  return g_heap_allocations - before;
}

// x float[1,1,16] through `length` Adds with constants: each Add writes over its input. (The
// constants run along the last axis: of [1,16] they would be per channel, and the chain one
// kiln.ChannelAffine.)
Session add_chain(int length) {
  GraphBuilder b;
  b.input("x", DataType::Float, {1, 1, 16}, true);
  std::string prev = "x";
  for (int i = 0; i < length; ++i) {
    const std::string c = "c" + std::to_string(i), out = "t" + std::to_string(i);
    b.initializer(c, Tensor::from_vector<float>({1, 1, 16}, std::vector<float>(16, 0.5f)));
    b.node("Add", {prev, c}, {out});
    prev = out;
  }
  b.output(prev);
  return make_session(b.build());
}

// `length` If nodes in a chain, each choosing between two one-node branches on a flag.
Session if_chain(int length) {
  GraphBuilder b;
  b.input("x", DataType::Float, {1, 16}, true);
  b.input("cond", DataType::Bool, {1}, true);
  b.initializer("one", Tensor::from_vector<float>({1}, {1.0f}));
  std::string prev = "x";
  for (int i = 0; i < length; ++i) {
    const std::string out = "y" + std::to_string(i);
    GraphBuilder then_b("then" + std::to_string(i));
    then_b.node("Add", {prev, "one"}, {"a" + std::to_string(i)});
    then_b.output("a" + std::to_string(i));
    GraphBuilder else_b("else" + std::to_string(i));
    else_b.node("Sub", {prev, "one"}, {"s" + std::to_string(i)});
    else_b.output("s" + std::to_string(i));
    b.node("If", {"cond"}, {out},
           {graph_attr("then_branch", then_b.build()), graph_attr("else_branch", else_b.build())});
    prev = out;
  }
  b.output(prev);
  return make_session(b.build());
}

// The executor's contract check (KILN_CHECK_CONTRACTS) allocates per node by design.
bool contracts_checked() {
  const char* v = std::getenv("KILN_CHECK_CONTRACTS");
  return v && *v && std::string(v) != "0";
}

}  // namespace

TEST_CASE("a warm run allocates at most the output tensor's handles per tiny node",
          "[executor][node_cost]") {
  if (contracts_checked()) {
    WARN("KILN-SKIP: KILN_CHECK_CONTRACTS is set; its checks allocate per node");
    return;
  }
  const std::vector<NamedValue> feed = {{"x", Tensor::zeros(DataType::Float, {1, 1, 16})}};
  Session short_chain = add_chain(100);
  Session long_chain = add_chain(200);
  const uint64_t a100 = warm_run_allocations(short_chain, feed);
  const uint64_t a200 = warm_run_allocations(long_chain, feed);
  CHECK(short_chain.last_run_stats().allocations == 0);  // the pool's buffers are reused
  CHECK(short_chain.last_run_stats().in_place_ops == 99);
  CHECK(long_chain.last_run_stats().nodes_run == 200);
  // An in-place Add makes one tensor handle, whose shape and strides are held inline; the
  // executor's frame, the initializers' bindings, the broadcast check and the element loop
  // allocate nothing either.
  CHECK(a200 - a100 == 0);
}

TEST_CASE("a warm run in the caller's kept vectors allocates nothing", "[executor][node_cost]") {
  if (contracts_checked()) {
    WARN("KILN-SKIP: KILN_CHECK_CONTRACTS is set; its checks allocate per node");
    return;
  }
  Session chain = add_chain(100);
  std::vector<NamedValue> in = {{"x", Value()}}, out;
  const std::vector<Tensor> values = {Tensor::zeros(DataType::Float, {1, 1, 16})};
  // The inputs bound in graph order, the frame, the arena's signature, the first Add's
  // output (a pool buffer and its recycled Storage block) and the outputs handed back: none
  // allocates once warm.
  CHECK(warm_reusing_run_allocations(chain, in, values, out) == 0);
  REQUIRE(out.size() == 1);
  CHECK(out[0].name == "t99");
  CHECK(out[0].value.tensor().to_vector<float>() == std::vector<float>(16, 50.0f));
  CHECK_FALSE(in[0].value.defined());  // taken by the run, the name kept
  CHECK(in[0].name == "x");
}

TEST_CASE("a warm run of Gather, Slice, Expand and Tile allocates nothing",
          "[executor][node_cost]") {
  if (contracts_checked()) {
    WARN("KILN-SKIP: KILN_CHECK_CONTRACTS is set; its checks allocate per node");
    return;
  }
  GraphBuilder b;
  b.input("x", DataType::Float, {2, 3, 4}, true);
  b.initializer("idx", Tensor::from_vector<int64_t>({2}, {2, -1}));
  b.initializer("starts", Tensor::from_vector<int64_t>({2}, {1, 0}));
  b.initializer("ends", Tensor::from_vector<int64_t>({2}, {3, 4}));
  b.initializer("axes", Tensor::from_vector<int64_t>({2}, {1, 2}));
  b.initializer("steps", Tensor::from_vector<int64_t>({2}, {1, 2}));
  b.initializer("shape", Tensor::from_vector<int64_t>({4}, {2, 2, 3, 4}));
  b.initializer("repeats", Tensor::from_vector<int64_t>({3}, {1, 2, 1}));
  b.node("Gather", {"x", "idx"}, {"g"}, {int_attr("axis", 1)});
  b.node("Slice", {"x", "starts", "ends", "axes", "steps"}, {"s"});
  b.node("Expand", {"x", "shape"}, {"e"});
  b.node("Tile", {"x", "repeats"}, {"t"});
  for (const char* name : {"g", "s", "e", "t"}) b.output(name);
  Session s = make_session(b.build());
  std::vector<float> xs(24);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>(i);
  std::vector<NamedValue> in = {{"x", Value()}}, out;
  const std::vector<Tensor> values = {Tensor::from_vector<float>({2, 3, 4}, xs)};
  // Their index lists, windows and shapes stay inline; Gather's and Tile's outputs are pool
  // buffers, Slice's and Expand's views.
  CHECK(warm_reusing_run_allocations(s, in, values, out) == 0);
  REQUIRE(out.size() == 4);
  CHECK(out[0].value.tensor().shape() == Shape{2, 2, 4});
  CHECK(out[0].value.tensor().to_vector<float>()[0] == 8.0f);  // x[0, 2, 0]
  CHECK(out[0].value.tensor().to_vector<float>()[4] == 8.0f);  // x[0, -1, 0]
  CHECK(out[1].value.tensor().shape() == Shape{2, 2, 2});
  CHECK(out[1].value.tensor().to_vector<float>()[0] == 4.0f);  // x[0, 1, 0]
  CHECK(out[1].value.tensor().to_vector<float>()[1] == 6.0f);  // x[0, 1, 2]
  CHECK(out[2].value.tensor().shape() == Shape{2, 2, 3, 4});
  CHECK(out[3].value.tensor().shape() == Shape{2, 6, 4});
  CHECK(out[3].value.tensor().to_vector<float>()[12] == 0.0f);  // the second repeat starts
}

TEST_CASE("a pool storage block serves again only once no handle observes its storage",
          "[pool][node_cost]") {
  BufferPool pool;
  std::shared_ptr<Storage> a = pool.acquire(256);
  const Storage* first = a.get();
  std::weak_ptr<Storage> watch = a;
  a.reset();
  // A weak handle still observes the first storage (expired, with its counts): its block
  // stays out of use, so a new storage never takes its address while it can be asked about.
  std::shared_ptr<Storage> b = pool.acquire(256);
  CHECK(watch.expired());
  CHECK(b.get() != first);
  watch.reset();
  // Now the block is free, and the next storage takes it, fresh: one owner, its own bytes.
  const uint64_t before = g_heap_allocations;
  std::shared_ptr<Storage> c = pool.acquire(256);
  CHECK(g_heap_allocations - before == 0);
  CHECK(c.get() == first);
  CHECK(c.use_count() == 1);
  CHECK(c->kind() == Storage::Kind::Pool);
  CHECK(c->data() != b->data());
  // Storages may outlive their pool: their blocks go back to it, and it goes with the last.
  std::shared_ptr<Storage> kept;
  {
    BufferPool short_lived;
    kept = short_lived.acquire(64);
  }
  kept->data()[0] = std::byte{1};
  kept.reset();
}

TEST_CASE("a warm run allocates nothing per If with small branches", "[executor][node_cost][if]") {
  if (contracts_checked()) {
    WARN("KILN-SKIP: KILN_CHECK_CONTRACTS is set; its checks allocate per node");
    return;
  }
  const std::vector<NamedValue> feed = {{"x", Tensor::zeros(DataType::Float, {1, 16})},
                                        {"cond", Tensor::from_vector<bool>({1}, {true})}};
  Session short_chain = if_chain(20);
  Session long_chain = if_chain(40);
  const uint64_t a20 = warm_run_allocations(short_chain, feed);
  const uint64_t a40 = warm_run_allocations(long_chain, feed);
  CHECK(long_chain.last_run_stats().nodes_run == 80);
  // Per If: none. The captures travel in and the results out in the branch's kept buffers
  // (OpContext::run_subgraph_kept), the tensor handles keep their shapes inline, and the
  // frame, the initializer bindings and the broadcast shape allocate nothing.
  INFO("heap allocations per If: " << (a40 - a20) / 20.0);
  CHECK(a40 == a20);
}

TEST_CASE("a warm decode step of the Whisper generator allocates a fixed amount",
          "[generate][node_cost]") {
  if (contracts_checked()) {
    WARN("KILN-SKIP: KILN_CHECK_CONTRACTS is set; its checks allocate per node");
    return;
  }
  GeneratorOptions go;
  go.environment = std::make_shared<Environment>(1);  // the counter is the calling thread's
  Seq2SeqGenerator g(std::string(KILN_SOURCE_DIR) + "/models/whisper-tiny-random", go);
  const Tensor features = tooling::read_npy(std::string(KILN_SOURCE_DIR) +
                                            "/models/whisper-tiny-random/sample_features.npy");
  GenerationOptions o;
  o.max_new_tokens = 12;
  o.min_new_tokens = 12;
  std::vector<uint64_t> at(16);
  size_t calls = 0;
  o.on_token = [&](int64_t, const StepStats&) {
    at[calls++] = g_heap_allocations;
    return true;
  };
  g.generate(features, o);  // warms the pool and the planned arena
  calls = 0;
  g.generate(features, o);
  REQUIRE(calls == 12);
  // Steps 3.. run with the cache and warm buffers: each makes the same allocations.
  std::vector<uint64_t> per_step;
  for (size_t i = 3; i < calls; ++i) per_step.push_back(at[i] - at[i - 1]);
  INFO("heap allocations per warm decode step: " << per_step[0]);
  // The same count at every cache length: nothing grows with the past.
  for (uint64_t n : per_step) CHECK(n == per_step[0]);
  // None (1,537 while shapes were std::vectors, 225 while each pool buffer made its Storage
  // on the heap and the attention core kept per-task vectors): the attention kernels' scratch
  // is their planned workspace, pool Storages sit in recycled blocks, Gather, Slice, Expand
  // and Tile keep their index lists inline, the executor and the session keep the run's
  // vectors in their scratch, the If's results come back in its branch's kept buffer, the
  // arena's signature is written into kept buffers, and the generator keeps its inputs,
  // outputs and input_ids tensor from step to step (Session::run's reusing form); it
  // neither copies nor allocates the logits.
  CHECK(per_step[0] == 0);
}

TEST_CASE("a warm Einsum run takes its operands' copies and products from the arena",
          "[executor][node_cost][einsum]") {
  if (contracts_checked()) {
    WARN("KILN-SKIP: KILN_CHECK_CONTRACTS is set; its checks allocate per node");
    return;
  }
  for (DataType dtype : {DataType::Float, DataType::Float16}) {
    INFO(data_type_name(dtype));
    GraphBuilder b;
    b.input("a", dtype, {4, 16, 24}, true);
    b.input("b", dtype, {4, 24, 20}, true);
    b.input("c", dtype, {20, 12}, true);
    b.input("x", dtype, {16, 12, 10, 3}, true);
    b.input("z", dtype, {10, 12, 14}, true);
    // An intermediate product (4x16x20), a summed-out label and a gathered operand.
    b.node("Einsum", {"a", "b", "c"}, {"y"}, {string_attr("equation", "bij,bjk,kl->bil")});
    b.node("Einsum", {"x", "z"}, {"w"}, {string_attr("equation", "abcs,cbd->ad")});
    b.output("y");
    b.output("w");
    Session s = make_session(b.build());
    std::vector<NamedValue> in, out;
    std::vector<Tensor> values;
    for (const auto& [name, shape] :
         std::vector<std::pair<std::string, Shape>>{{"a", {4, 16, 24}},
                                                    {"b", {4, 24, 20}},
                                                    {"c", {20, 12}},
                                                    {"x", {16, 12, 10, 3}},
                                                    {"z", {10, 12, 14}}}) {
      in.push_back({name, Value()});
      values.push_back(Tensor::zeros(dtype, shape));
    }
    warm_reusing_run_allocations(s, in, values, out);
    CHECK(s.last_run_stats().unplanned_scratch == 0);
    // Label lists, odometers and operand views only: no allocation the size of an operand
    // (the smallest, c, is 240 elements) or of a product.
    CHECK(g_largest_allocation < 240 * sizeof(uint16_t));
  }
}

TEST_CASE("a warm run of the losses reads their targets and weights in place",
          "[executor][node_cost][loss]") {
  if (contracts_checked()) {
    WARN("KILN-SKIP: KILN_CHECK_CONTRACTS is set; its checks allocate per node");
    return;
  }
  std::mt19937 rng(3);
  GraphBuilder b;
  b.input("x", DataType::Float, {8, 10, 30}, true);
  b.input("t", DataType::Int64, {8, 30}, true);
  b.input("w", DataType::Float, {10}, true);
  b.node("NegativeLogLikelihoodLoss", {"x", "t", "w"}, {"nll"});
  b.node("SoftmaxCrossEntropyLoss", {"x", "t", "w"}, {"sce"}, {string_attr("reduction", "none")});
  b.output("nll");
  b.output("sce");
  Session s = make_session(b.build());
  std::vector<NamedValue> in = {{"x", Value()}, {"t", Value()}, {"w", Value()}}, out;
  const std::vector<Tensor> values = {random_tensor(DataType::Float, {8, 10, 30}, rng, -1, 1),
                                      random_tensor(DataType::Int64, {8, 30}, rng, 0, 9),
                                      random_tensor(DataType::Float, {10}, rng, 0, 1)};
  CHECK(warm_reusing_run_allocations(s, in, values, out) == 0);
  REQUIRE(out.size() == 2);
  CHECK(out[1].value.tensor().shape() == Shape{8, 30});
}

TEST_CASE("a warm QLinearMatMul of float8 inputs decodes them into the arena",
          "[executor][node_cost][qlinear]") {
  if (contracts_checked()) {
    WARN("KILN-SKIP: KILN_CHECK_CONTRACTS is set; its checks allocate per node");
    return;
  }
  std::mt19937 rng(4);
  GraphBuilder b;
  b.input("a", DataType::Float8E4M3FN, {2, 16, 24}, true);
  b.input("b", DataType::Float8E4M3FN, {24, 20}, true);
  b.initializer("sa", Tensor::scalar<float>(0.02f));
  b.initializer("za", Tensor::zeros(DataType::Float8E4M3FN, {}));
  b.initializer("sb", Tensor::scalar<float>(0.01f));
  b.initializer("zb", Tensor::zeros(DataType::Float8E4M3FN, {}));
  b.initializer("sy", Tensor::scalar<float>(0.5f));
  b.initializer("zy", Tensor::zeros(DataType::UInt8, {}));
  b.node("QLinearMatMul", {"a", "sa", "za", "b", "sb", "zb", "sy", "zy"}, {"y"});
  b.output("y");
  Session s = make_session(b.build(), 21);
  std::vector<NamedValue> in = {{"a", Value()}, {"b", Value()}}, out;
  std::vector<Tensor> values;
  for (const Shape& shape : {Shape{2, 16, 24}, Shape{24, 20}}) {
    // Random bytes as float8 E4M3FN, NaN (0x7f, 0xff) excluded.
    const Tensor bytes = random_tensor(DataType::UInt8, shape, rng, 0, 0x7e);
    Tensor t = Tensor::zeros(DataType::Float8E4M3FN, shape);
    std::copy_n(bytes.data<const uint8_t>(), bytes.numel(),
                reinterpret_cast<uint8_t*>(t.raw_data()));
    values.push_back(t);
  }
  warm_reusing_run_allocations(s, in, values, out);
  CHECK(s.last_run_stats().unplanned_scratch == 0);
  // The smallest operand B holds 480 elements, a batch's product 320: no allocation near
  // either in double.
  CHECK(g_largest_allocation < 320 * sizeof(double));
  REQUIRE(out.size() == 1);
  CHECK(out[0].value.tensor().shape() == Shape{2, 16, 20});
}

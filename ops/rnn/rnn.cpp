// LSTM, GRU and RNN (one layer; forward, reverse or bidirectional; sequence lengths;
// batch-major layout from opset 14).
//
// Each direction projects the whole input sequence at once (X [seq*batch, I] times W^T
// plus the biases, one large GEMM), then steps through time with one recurrent GEMM
// [batch, H] x R^T per step and the gate arithmetic per batch row. The products run in the
// GEMM layer (ops/math/gemm.h) with W^T and R^T packed once per direction: when the session
// is planned for constant weights (shared through the weights cache), else once per run, so
// each step streams the packed R. With sequence_lens, row b runs its own steps 0..len-1 (a
// reverse direction starts at len-1); later Y rows are zero, and Y_h / Y_c hold the state
// after the row's last step (zero when len is 0). Half types compute in float; double uses
// plain-loop products; the two directions run in parallel, sharing the threads.
//
// com.microsoft DynamicQuantizeLSTM is the LSTM with 8-bit W [dirs, input, 4H] and R [dirs,
// H, 4H] (already transposed) and their scales and zero points per direction or per gate
// column: each product's left operand (X for the projection, H at each step) is quantized
// per tensor to uint8 as onnxruntime does (ops/quant/quantize.h) and multiplied in the int8 GEMM
// layer, which scales the sums back to float by x_scale * w_scale[column]. W and R are packed
// once per direction at session creation; the cell arithmetic is the float LSTM's.
#include <tbb/task_arena.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ops/core/common.h"
#include "ops/math/gemm.h"
#include "ops/math/qgemm.h"
#include "ops/math/threading.h"
#include "ops/rnn/rnn_activation.h"
#include "ops/rnn/rnn_weights.h"

namespace kiln::ops {
namespace {

enum class Cell { Rnn, Gru, Lstm };

// The weights (ops/rnn/rnn_weights.h) and activations (ops/rnn/rnn_activation.h).
using rnn::Activation;
using rnn::layout_of;
using rnn::pack_qweight;
using rnn::pack_weight;
using rnn::packing_name;
using rnn::parse_activation;
using rnn::qpacking_name;
using rnn::quantized_product;
using rnn::QuantWeight;
using rnn::qweight_bytes;
using rnn::WeightLayout;

// Pointers to the (compute-type) inputs and outputs of one run. Optional ones are null.
template <typename C>
struct Problem {
  int64_t seq, batch, input, hidden, dirs;
  bool batch_major;
  const C *x, *w, *r, *b, *p, *h0, *c0;
  std::vector<int64_t> lens;
  C *y, *yh, *yc;
  // Float: W and R packed by pack_weight (w and r are then unused).
  const float *wpack = nullptr, *rpack = nullptr;
  WeightLayout wl{}, rl{};
  // DynamicQuantizeLSTM: per direction, W and R (null otherwise).
  const QuantWeight *qw = nullptr, *qr = nullptr;
  int max_threads = 0;  // for each direction's products

  int64_t x_row(int64_t t, int64_t bi) const { return batch_major ? bi * seq + t : t * batch + bi; }
  int64_t state_row(int64_t d, int64_t bi) const {
    return batch_major ? bi * dirs + d : d * batch + bi;
  }
  int64_t y_row(int64_t t, int64_t d, int64_t bi) const {
    return batch_major ? (bi * seq + t) * dirs + d : (t * dirs + d) * batch + bi;
  }
};

template <typename T, typename C>
const C* widen(const Tensor* t, std::vector<C>& buffer) {
  if (t == nullptr) return nullptr;
  if constexpr (std::is_same_v<T, C>) {
    return t->data<const C>();
  } else {
    const T* p = t->data<const T>();
    buffer.assign(p, p + t->numel());
    return buffer.data();
  }
}

// Bounds the hidden size so that gate and bias sizes never overflow.
constexpr int64_t kMaxHidden = int64_t{1} << 40;

class Recurrent final : public Kernel {
 public:
  Recurrent(const NodeInfo& info, Cell cell, bool quantized = false)
      : cell_(cell), quantized_(quantized) {
    gates_ = cell == Cell::Lstm ? 4 : cell == Cell::Gru ? 3 : 1;
    const int per_dir = cell == Cell::Lstm ? 3 : cell == Cell::Gru ? 2 : 1;
    const std::string dir = info.attr_string("direction", "forward");
    if (dir != "forward" && dir != "reverse" && dir != "bidirectional") {
      info.fail("direction must be forward, reverse or bidirectional, got '" + dir + "'");
    }
    reverse_ = dir == "reverse";
    dirs_ = dir == "bidirectional" ? 2 : 1;
    hidden_ = info.attr_int("hidden_size", 0);
    if (hidden_ < 0 || hidden_ > kMaxHidden || (info.has_attr("hidden_size") && hidden_ == 0)) {
      info.fail("hidden_size must be positive (and not absurdly large)");
    }
    if (info.has_attr("clip")) {
      clip_ = info.attr_float("clip");
      if (!(clip_ > 0)) info.fail("clip must be positive");
    }
    layout_ = info.opset() >= 14 ? info.attr_int("layout", 0) : 0;
    if (layout_ != 0 && layout_ != 1) info.fail("layout must be 0 or 1");
    input_forget_ = cell == Cell::Lstm && info.attr_int("input_forget", 0) != 0;
    linear_before_reset_ = cell == Cell::Gru && info.attr_int("linear_before_reset", 0) != 0;

    std::vector<std::string> names = info.attr_strings("activations");
    if (names.empty()) {
      names = cell == Cell::Lstm  ? std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"}
              : cell == Cell::Gru ? std::vector<std::string>{"Sigmoid", "Tanh"}
                                  : std::vector<std::string>{"Tanh"};
    }
    if (names.size() != static_cast<size_t>(per_dir * dirs_) &&
        names.size() != static_cast<size_t>(per_dir)) {
      info.fail("expected " + std::to_string(per_dir * dirs_) + " activations, got " +
                std::to_string(names.size()));
    }
    const std::vector<float> alphas = info.attr_floats("activation_alpha");
    const std::vector<float> betas = info.attr_floats("activation_beta");
    size_t ai = 0, bi = 0;
    for (const std::string& name : names) {
      acts_.push_back(parse_activation(info, name, alphas, ai, betas, bi));
    }
    while (acts_.size() < static_cast<size_t>(per_dir * dirs_))
      acts_.push_back(acts_[acts_.size() - per_dir]);

    // Constant W and R are packed for the GEMM once (when their shapes fit; run() reports
    // the errors of those that do not).
    auto packable = [&](const Tensor* t) {
      return t && t->rank() == 3 && t->numel() > 0 && t->dim(0) == dirs_ &&
             t->dim(1) % gates_ == 0 &&
             (t->dtype() == DataType::Float || t->dtype() == DataType::Float16 ||
              t->dtype() == DataType::BFloat16);
    };
    if (quantized_) {
      auto qpackable = [&](const Tensor* t) {
        return t && t->rank() == 3 && t->numel() > 0 && t->dim(0) == dirs_ &&
               t->dim(2) % gates_ == 0 &&
               (t->dtype() == DataType::Int8 || t->dtype() == DataType::UInt8);
      };
      for (size_t i : {size_t{1}, size_t{2}}) {
        if (qpackable(info.constant_input(i))) {
          (i == 1 ? packed_w_ : packed_r_) = info.prepared_input(i, qpacking_name(), pack_qweight);
        }
      }
      return;
    }
    if (packable(info.constant_input(1))) {
      packed_w_ = info.prepared_input(1, packing_name(false),
                                      [](const Tensor& w) { return pack_weight(w, false); });
    }
    const Tensor* r = info.constant_input(2);
    if (packable(r) && r->dim(1) == gates_ * r->dim(2) && (hidden_ == 0 || hidden_ == r->dim(2))) {
      const bool split = cell_ == Cell::Gru;
      packed_r_ = info.prepared_input(2, packing_name(split),
                                      [split](const Tensor& w) { return pack_weight(w, split); });
    }
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& w = ctx.input(1);
    const Tensor& r = ctx.input(2);
    auto optional = [&](size_t i) { return ctx.has_input(i) ? &ctx.input(i) : nullptr; };
    const Tensor* b = optional(3);
    const Tensor* lens = optional(4);
    const Tensor* h0 = optional(5);
    const Tensor* c0 = cell_ == Cell::Lstm ? optional(6) : nullptr;
    const Tensor* p = cell_ == Cell::Lstm ? optional(7) : nullptr;
    if (x.rank() != 3) ctx.fail("X must be 3-D, got " + x.describe());
    if (quantized_) {
      if (x.dtype() != DataType::Float) ctx.fail("X must be float, got " + x.describe());
      for (const Tensor* t : {&w, &r}) {
        if (t->dtype() != DataType::Int8 && t->dtype() != DataType::UInt8) {
          ctx.fail("W and R must be int8 or uint8, got " + t->describe());
        }
      }
    }
    for (const Tensor* t : {quantized_ ? nullptr : &w, quantized_ ? nullptr : &r, b, h0, c0, p}) {
      if (t && t->dtype() != x.dtype()) {
        ctx.fail("inputs must all have X's type " + x.describe() + ", got " + t->describe());
      }
    }
    const bool bm = layout_ == 1;
    const int64_t seq = x.dim(bm ? 1 : 0), batch = x.dim(bm ? 0 : 1), in = x.dim(2);
    const int64_t hidden = hidden_ > 0 ? hidden_ : (r.rank() == 3 ? r.dim(quantized_ ? 1 : 2) : 0);
    if (hidden <= 0 || hidden > kMaxHidden) {
      ctx.fail("hidden size " + std::to_string(hidden) + " is out of range (R is " + r.describe() +
               ")");
    }
    const int64_t gh = gates_ * hidden;
    auto expect = [&](const Tensor* t, const Shape& shape, const char* name) {
      if (t && t->shape() != shape) {
        ctx.fail(std::string(name) + " must be " + shape_to_string(shape) + ", got " +
                 t->describe());
      }
    };
    expect(&w, quantized_ ? Shape{dirs_, in, gh} : Shape{dirs_, gh, in}, "W");
    expect(&r, quantized_ ? Shape{dirs_, hidden, gh} : Shape{dirs_, gh, hidden}, "R");
    // DynamicQuantizeLSTM's scales and zero points, checked before any output is made.
    std::vector<QuantWeight> qweights;
    if (quantized_) qweights = quant_weights(ctx, w, r, gh);
    expect(b, {dirs_, 2 * gh}, "B");
    expect(lens, {batch}, "sequence_lens");
    const Shape state_shape = bm ? Shape{batch, dirs_, hidden} : Shape{dirs_, batch, hidden};
    expect(h0, state_shape, "initial_h");
    expect(c0, state_shape, "initial_c");
    expect(p, {dirs_, 3 * hidden}, "P");
    if (seq == 0 || batch == 0) {  // nothing to step through: empty or zero outputs
      for (size_t i = 0; i < ctx.num_outputs() && i < (cell_ == Cell::Lstm ? 3u : 2u); ++i) {
        if (!ctx.has_output(i)) continue;
        const Shape shape =
            i == 0 ? (bm ? Shape{batch, seq, dirs_, hidden} : Shape{seq, dirs_, batch, hidden})
                   : state_shape;
        Tensor& t = ctx.output(i, x.dtype(), shape);
        std::memset(t.raw_data(), 0, t.nbytes());
      }
      return;
    }
    std::vector<int64_t> len(batch, seq);
    if (lens) {
      len = to_int64s(*lens);
      for (int64_t v : len) {
        if (v < 0 || v > seq) ctx.fail("sequence_lens values must be in [0, seq_length]");
      }
    }
    const Shape y_shape = bm ? Shape{batch, seq, dirs_, hidden} : Shape{seq, dirs_, batch, hidden};
    Tensor* y = ctx.has_output(0) ? &ctx.output(0, x.dtype(), y_shape) : nullptr;
    Tensor* yh = ctx.has_output(1) ? &ctx.output(1, x.dtype(), state_shape) : nullptr;
    Tensor* yc =
        cell_ == Cell::Lstm && ctx.has_output(2) ? &ctx.output(2, x.dtype(), state_shape) : nullptr;
    checked_numel({seq, batch, gh});  // the input projection's size, before any product
    dispatch(FloatTypes{}, x.dtype(), [&]<typename T>() {
      using C = compute_t<T>;
      constexpr bool kPacked = std::is_same_v<C, float>;
      // Float products read W and R packed: when the session was planned, or now.
      std::shared_ptr<const Tensor> wp, rp;
      if constexpr (kPacked) {
        wp = packed_w_;
        rp = packed_r_;
        if (quantized_) {
          if (!wp && in > 0) wp = std::make_shared<const Tensor>(pack_qweight(w));
          if (!rp) rp = std::make_shared<const Tensor>(pack_qweight(r));
          bind_quant_weights(qweights, w, r, wp.get(), rp.get());
        }
        if (!wp && in > 0) wp = std::make_shared<const Tensor>(pack_weight(w, false));
        if (!rp) rp = std::make_shared<const Tensor>(pack_weight(r, cell_ == Cell::Gru));
      }
      std::vector<C> bx, bw, br, bb, bp, bh0, bc0;
      Problem<C> pr{seq,
                    batch,
                    in,
                    hidden,
                    dirs_,
                    bm,
                    widen<T, C>(&x, bx),
                    kPacked || quantized_ ? nullptr : widen<T, C>(&w, bw),
                    kPacked || quantized_ ? nullptr : widen<T, C>(&r, br),
                    widen<T, C>(b, bb),
                    widen<T, C>(p, bp),
                    widen<T, C>(h0, bh0),
                    widen<T, C>(c0, bc0),
                    len,
                    nullptr,
                    nullptr,
                    nullptr};
      if constexpr (kPacked) {
        if (quantized_) {
          pr.qw = qweights.data();
          pr.qr = qweights.data() + dirs_;
        } else if (wp) {
          pr.wpack = wp->data<const float>();
          pr.wl = layout_of(w, false);
        }
        if (!quantized_) {
          pr.rpack = rp->data<const float>();
          pr.rl = layout_of(r, cell_ == Cell::Gru);
        }
      }
      // The directions run in parallel, each product on its share of the threads.
      if (dirs_ > 1) pr.max_threads = std::max(1, tbb::this_task_arena::max_concurrency() / 2);
      std::vector<C> oy, oh, oc;
      auto out_ptr = [](Tensor* t, std::vector<C>& buffer) -> C* {
        if (t == nullptr) return nullptr;
        if constexpr (std::is_same_v<T, C>) {
          return t->data<C>();
        } else {
          buffer.resize(t->numel());
          return buffer.data();
        }
      };
      pr.y = out_ptr(y, oy);
      pr.yh = out_ptr(yh, oh);
      pr.yc = out_ptr(yc, oc);
      parallel_for(dirs_, 1, [&](int64_t d0, int64_t d1) {
        for (int64_t d = d0; d < d1; ++d) run_direction<C>(pr, d, reverse_ || d == 1);
      });
      if constexpr (!std::is_same_v<T, C>) {
        for (auto [t, buffer] : {std::pair{y, &oy}, std::pair{yh, &oh}, std::pair{yc, &oc}}) {
          if (t == nullptr) continue;
          T* dst = t->template data<T>();
          for (size_t i = 0; i < buffer->size(); ++i) dst[i] = T((*buffer)[i]);
        }
      }
    });
  }

 private:
  void clip(auto* v, int64_t n) const {
    if (clip_ <= 0) return;
    using C = std::remove_pointer_t<decltype(v)>;
    const C c = static_cast<C>(clip_);
    for (int64_t i = 0; i < n; ++i) v[i] = std::min(c, std::max(-c, v[i]));
  }

  template <typename C>
  void run_direction(const Problem<C>& pr, int64_t d, bool reverse) const {
    const int64_t batch = pr.batch, hs = pr.hidden, gh = gates_ * hs, rows = pr.seq * batch;
    const Activation* act = acts_.data() + d * (cell_ == Cell::Lstm  ? 3
                                                : cell_ == Cell::Gru ? 2
                                                                     : 1);
    // The input projection for every time step, with the biases that do not depend on H.
    std::vector<C> xw(rows * gh), bias(gh, C(0));
    if (pr.b) {
      const C* wb = pr.b + d * 2 * gh;
      for (int64_t j = 0; j < gh; ++j) {
        const bool rb_inside = linear_before_reset_ && j >= 2 * hs;  // added after the reset
        bias[j] = wb[j] + (rb_inside ? C(0) : wb[gh + j]);
      }
    }
    math::GemmOptions po;
    po.max_threads = pr.max_threads;
    if (pr.input == 0) {
      for (int64_t i = 0; i < rows; ++i) std::copy(bias.begin(), bias.end(), xw.begin() + i * gh);
    } else if constexpr (std::is_same_v<C, float>) {
      if (pr.qw) {
        quantized_product(pr.x, rows, pr.input, pr.qw[d], xw.data(), gh, bias.data(), false,
                          pr.max_threads);
      } else {
        po.bias = bias.data();
        math::sgemm(math::MatrixView::row_major(pr.x, rows, pr.input, pr.input),
                    pr.wl.segment(pr.wpack, d, 0), xw.data(), gh, po);
      }
    } else {
      math::gemm<C>(pr.x, rows, pr.input, pr.input, 1, pr.w + d * gh * pr.input, gh, 1, pr.input,
                    xw.data(), gh, po);
      parallel_for(rows, grain_for(gh), [&](int64_t r0, int64_t r1) {
        for (int64_t i = r0; i < r1; ++i) {
          for (int64_t j = 0; j < gh; ++j) xw[i * gh + j] += bias[j];
        }
      });
    }
    std::vector<C> h(batch * hs, C(0)), c(cell_ == Cell::Lstm ? batch * hs : 0, C(0));
    std::vector<C> g(batch * gh, C(0)), scratch(batch * hs, C(0));
    for (int64_t bi = 0; bi < batch; ++bi) {
      const int64_t row = pr.state_row(d, bi) * hs;
      if (pr.h0) std::copy(pr.h0 + row, pr.h0 + row + hs, h.data() + bi * hs);
      if (pr.c0 && cell_ == Cell::Lstm)
        std::copy(pr.c0 + row, pr.c0 + row + hs, c.data() + bi * hs);
    }
    // dst[:, segment] (row stride ld) (+)= src [batch x hs] * R^T[:, segment], where segment
    // 0 is every gate (GRU: z and r) and segment 1 GRU's candidate.
    auto recurrent = [&](C* dst, int64_t ld, const C* src, int segment, bool accumulate) {
      math::GemmOptions ro;
      ro.accumulate = accumulate;
      ro.max_threads = pr.max_threads;
      if constexpr (std::is_same_v<C, float>) {
        if (pr.qr) {
          quantized_product(src, batch, hs, pr.qr[d], dst, ld, nullptr, accumulate, pr.max_threads);
          return;
        }
        math::sgemm(math::MatrixView::row_major(src, batch, hs, hs),
                    pr.rl.segment(pr.rpack, d, segment), dst, ld, ro);
      } else {
        const int64_t c0 = segment == 0 ? 0 : 2 * hs;
        const int64_t cols = cell_ != Cell::Gru ? gh : segment == 0 ? 2 * hs : hs;
        math::gemm<C>(src, batch, hs, hs, 1, pr.r + (d * gh + c0) * hs, cols, 1, hs, dst, ld, ro);
      }
    };
    const C* peep = pr.p ? pr.p + d * 3 * hs : nullptr;
    const C* rbh = pr.b ? pr.b + d * 2 * gh + gh + 2 * hs : nullptr;
    const int64_t max_len = batch == 0 ? 0 : *std::max_element(pr.lens.begin(), pr.lens.end());
    const int64_t grain = grain_for(gh * 16);
    auto time_of = [&](int64_t s, int64_t bi) { return reverse ? pr.lens[bi] - 1 - s : s; };

    for (int64_t s = 0; s < max_len; ++s) {
      for (int64_t bi = 0; bi < batch; ++bi) {
        if (s >= pr.lens[bi]) continue;
        const C* src = xw.data() + pr.x_row(time_of(s, bi), bi) * gh;
        std::copy(src, src + gh, g.data() + bi * gh);
      }
      recurrent(g.data(), gh, h.data(), 0, true);
      if (cell_ == Cell::Gru && linear_before_reset_) {
        recurrent(scratch.data(), hs, h.data(), 1, false);
      }
      // Per row: the gates, then the new state (and Y) for rows still inside their sequence.
      auto finish_row = [&](int64_t bi) {
        if (pr.y) {
          const C* src = h.data() + bi * hs;
          std::copy(src, src + hs, pr.y + pr.y_row(time_of(s, bi), d, bi) * hs);
        }
      };
      if (cell_ == Cell::Rnn) {
        parallel_for(batch, grain, [&](int64_t b0, int64_t b1) {
          for (int64_t bi = b0; bi < b1; ++bi) {
            if (s >= pr.lens[bi]) continue;
            C* gi = g.data() + bi * gh;
            clip(gi, hs);
            act[0].apply(gi, hs);
            std::copy(gi, gi + hs, h.data() + bi * hs);
            finish_row(bi);
          }
        });
      } else if (cell_ == Cell::Lstm) {
        parallel_for(batch, grain, [&](int64_t b0, int64_t b1) {
          for (int64_t bi = b0; bi < b1; ++bi) {
            if (s >= pr.lens[bi]) continue;
            C* gi = g.data() + bi * gh;  // gate order i, o, f, c
            C *go = gi + hs, *gf = gi + 2 * hs, *gc = gi + 3 * hs;
            C* cs = c.data() + bi * hs;
            C* hr = h.data() + bi * hs;
            C* tmp = scratch.data() + bi * hs;
            if (peep) {
              for (int64_t j = 0; j < hs; ++j) {
                gi[j] += peep[j] * cs[j];
                gf[j] += peep[2 * hs + j] * cs[j];
              }
            }
            clip(gi, hs);
            act[0].apply(gi, hs);
            if (input_forget_) {
              for (int64_t j = 0; j < hs; ++j) gf[j] = C(1) - gi[j];
            } else {
              clip(gf, hs);
              act[0].apply(gf, hs);
            }
            clip(gc, hs);
            act[1].apply(gc, hs);
            for (int64_t j = 0; j < hs; ++j) cs[j] = gf[j] * cs[j] + gi[j] * gc[j];
            if (peep) {
              for (int64_t j = 0; j < hs; ++j) go[j] += peep[hs + j] * cs[j];
            }
            clip(go, hs);
            act[0].apply(go, hs);
            std::copy(cs, cs + hs, tmp);
            act[2].apply(tmp, hs);
            for (int64_t j = 0; j < hs; ++j) hr[j] = go[j] * tmp[j];
            finish_row(bi);
          }
        });
      } else {
        // GRU: z and r first; without linear_before_reset the candidate needs (r * H) R_h^T.
        parallel_for(batch, grain, [&](int64_t b0, int64_t b1) {
          for (int64_t bi = b0; bi < b1; ++bi) {
            if (s >= pr.lens[bi]) continue;
            C* gz = g.data() + bi * gh;  // gate order z, r, h
            clip(gz, 2 * hs);
            act[0].apply(gz, 2 * hs);
            const C* gr = gz + hs;
            C* hh = gz + 2 * hs;
            C* sr = scratch.data() + bi * hs;
            const C* hr = h.data() + bi * hs;
            if (linear_before_reset_) {
              for (int64_t j = 0; j < hs; ++j) hh[j] += gr[j] * (sr[j] + (rbh ? rbh[j] : C(0)));
            } else {
              for (int64_t j = 0; j < hs; ++j) sr[j] = gr[j] * hr[j];
            }
          }
        });
        if (!linear_before_reset_) recurrent(g.data() + 2 * hs, gh, scratch.data(), 1, true);
        parallel_for(batch, grain, [&](int64_t b0, int64_t b1) {
          for (int64_t bi = b0; bi < b1; ++bi) {
            if (s >= pr.lens[bi]) continue;
            C* gz = g.data() + bi * gh;
            C* hh = gz + 2 * hs;
            C* hr = h.data() + bi * hs;
            clip(hh, hs);
            act[1].apply(hh, hs);
            for (int64_t j = 0; j < hs; ++j) hr[j] = (C(1) - gz[j]) * hh[j] + gz[j] * hr[j];
            finish_row(bi);
          }
        });
      }
    }
    for (int64_t bi = 0; bi < batch; ++bi) {
      const int64_t len = pr.lens[bi];
      if (pr.y) {
        for (int64_t t = len; t < pr.seq; ++t) {
          C* dst = pr.y + pr.y_row(t, d, bi) * hs;
          std::fill(dst, dst + hs, C(0));
        }
      }
      const int64_t row = pr.state_row(d, bi) * hs;
      for (auto [out, state] : {std::pair{pr.yh, &h}, std::pair{pr.yc, &c}}) {
        if (out == nullptr) continue;
        if (len == 0) {
          std::fill(out + row, out + row + hs, C(0));
        } else {
          std::copy(state->data() + bi * hs, state->data() + (bi + 1) * hs, out + row);
        }
      }
    }
  }

  // DynamicQuantizeLSTM's scales and zero points (inputs 8-11): per direction W then R, each
  // [dirs] or [dirs, 4H]; zero points of the weight's type. The packed weights are bound later.
  std::vector<QuantWeight> quant_weights(OpContext& ctx, const Tensor& w, const Tensor& r,
                                         int64_t gh) const {
    std::vector<QuantWeight> q(static_cast<size_t>(2 * dirs_));
    const char* names[] = {"W_scale", "W_zero_point", "R_scale", "R_zero_point"};
    for (int which = 0; which < 2; ++which) {
      const Tensor& weight = which == 0 ? w : r;
      const Tensor& scale = ctx.input(8 + 2 * which);
      const Tensor* zero = ctx.has_input(9 + 2 * which) ? &ctx.input(9 + 2 * which) : nullptr;
      for (const Tensor* t : {&scale, zero}) {
        if (t && !(t->shape() == Shape{dirs_} || t->shape() == Shape{dirs_, gh})) {
          ctx.fail(std::string(names[2 * which + (t == zero)]) + " " + t->describe() +
                   " must be [" + std::to_string(dirs_) + "] or [" + std::to_string(dirs_) + ", " +
                   std::to_string(gh) + "]");
        }
      }
      if (scale.dtype() != DataType::Float) {
        ctx.fail(std::string(names[2 * which]) + " must be float, got " + scale.describe());
      }
      if (zero && zero->dtype() != weight.dtype()) {
        ctx.fail(std::string(names[2 * which + 1]) + " " + zero->describe() + " must have " +
                 (which == 0 ? "W" : "R") + "'s type");
      }
      const bool scale_cols = scale.rank() == 2;
      const int64_t z_per_dir = zero && zero->rank() == 2 ? gh : 1;
      const Tensor zc = zero ? zero->contiguous() : Tensor();
      for (int64_t d = 0; d < dirs_; ++d) {
        QuantWeight& qw = q[static_cast<size_t>(which * dirs_ + d)];
        qw.scales = scale.data<const float>() + d * (scale_cols ? gh : 1);
        qw.per_column = scale_cols;
        qw.zeros.assign(static_cast<size_t>(z_per_dir), 0);
        for (int64_t j = 0; zero && j < z_per_dir; ++j) {
          const int64_t at = d * z_per_dir + j;
          qw.zeros[static_cast<size_t>(j)] = zero->dtype() == DataType::Int8
                                                 ? zc.data<const int8_t>()[at]
                                                 : zc.data<const uint8_t>()[at];
        }
      }
    }
    return q;
  }

  // Points each direction's QuantWeight at its packed W and R (w_packed null: no input).
  void bind_quant_weights(std::vector<QuantWeight>& q, const Tensor& w, const Tensor& r,
                          const Tensor* w_packed, const Tensor* r_packed) const {
    for (int which = 0; which < 2; ++which) {
      const Tensor& weight = which == 0 ? w : r;
      const Tensor* packed = which == 0 ? w_packed : r_packed;
      if (!packed) continue;
      const int64_t bytes = qweight_bytes(weight);
      for (int64_t d = 0; d < dirs_; ++d) {
        q[static_cast<size_t>(which * dirs_ + d)].packed =
            math::QPackedB(packed->data<const uint8_t>() + d * bytes, weight.dim(1), weight.dim(2),
                           weight.dtype() == DataType::Int8);
      }
    }
  }

  Cell cell_;
  bool quantized_ = false;
  int64_t gates_ = 1, hidden_ = 0, dirs_ = 1, layout_ = 0;
  bool reverse_ = false, input_forget_ = false, linear_before_reset_ = false;
  float clip_ = 0;
  std::vector<Activation> acts_;  // per direction: f (, g (, h))
  // The weights cache's packed W and R (pack_weight), when they are constants.
  std::shared_ptr<const Tensor> packed_w_, packed_r_;
};

std::unique_ptr<Kernel> make_rnn(const NodeInfo& info) {
  return std::make_unique<Recurrent>(info, Cell::Rnn);
}
std::unique_ptr<Kernel> make_gru(const NodeInfo& info) {
  return std::make_unique<Recurrent>(info, Cell::Gru);
}
std::unique_ptr<Kernel> make_lstm(const NodeInfo& info) {
  return std::make_unique<Recurrent>(info, Cell::Lstm);
}
std::unique_ptr<Kernel> make_dynamic_quantize_lstm(const NodeInfo& info) {
  return std::make_unique<Recurrent>(info, Cell::Lstm, true);
}

// Y [seq, dirs, batch, hidden] (batch first with layout 1) and the final states Y_h (and
// LSTM's Y_c) [dirs, batch, hidden] ([batch, dirs, hidden]).
void recurrent_shape(ShapeContext& c) {
  const Shape& x = c.shape(0);
  const Shape& w = c.shape(1);
  const Shape& r = c.shape(2);
  if (x.size() != 3) unknown("X must be 3-D");
  const std::string dir = c.attr_string("direction", "forward");
  if (dir != "forward" && dir != "reverse" && dir != "bidirectional") unknown("bad direction");
  const int64_t dirs = dir == "bidirectional" ? 2 : 1;
  const std::string& op = c.node().op_type;
  const bool quantized = op == "DynamicQuantizeLSTM";
  const int64_t gates = op == "LSTM" || quantized ? 4 : op == "GRU" ? 3 : 1;
  const bool bm = c.opset() >= 14 && c.attr_int("layout", 0) == 1;
  const int64_t seq = x[bm ? 1 : 0], batch = x[bm ? 0 : 1];
  const int64_t hidden = c.attr_int("hidden_size", 0) > 0 ? c.attr_int("hidden_size", 0)
                         : r.size() == 3                  ? r[quantized ? 1 : 2]
                                                          : 0;
  if (hidden <= 0 || hidden > kMaxHidden) unknown("hidden size out of range");
  const int64_t gh = checked_mul(gates, hidden);
  if (quantized) {
    if (w != Shape{dirs, x[2], gh} || r != Shape{dirs, hidden, gh})
      unknown("W or R does not fit X");
  } else if (c.dtype(1) != c.dtype(0) || c.dtype(2) != c.dtype(0) || w != Shape{dirs, gh, x[2]} ||
             r != Shape{dirs, gh, hidden}) {
    unknown("W or R does not fit X");
  }
  c.set(0, c.dtype(0), bm ? Shape{batch, seq, dirs, hidden} : Shape{seq, dirs, batch, hidden});
  const Shape state = bm ? Shape{batch, dirs, hidden} : Shape{dirs, batch, hidden};
  c.set(1, c.dtype(0), state);
  if (gates == 4) c.set(2, c.dtype(0), state);
}

}  // namespace

KILN_REGISTER_OP({.op = "RNN",
                  .since = 7,
                  .min_inputs = 3,
                  .max_inputs = 6,
                  .max_outputs = 2,
                  .types = "float, double, float16, bfloat16",
                  .shape = recurrent_shape,
                  .create = make_rnn});
KILN_REGISTER_OP({.op = "GRU",
                  .since = 7,
                  .min_inputs = 3,
                  .max_inputs = 6,
                  .max_outputs = 2,
                  .types = "float, double, float16, bfloat16",
                  .shape = recurrent_shape,
                  .create = make_gru});
KILN_REGISTER_OP({.op = "LSTM",
                  .since = 7,
                  .min_inputs = 3,
                  .max_inputs = 8,
                  .max_outputs = 3,
                  .types = "float, double, float16, bfloat16",
                  .shape = recurrent_shape,
                  .create = make_lstm});

KILN_REGISTER_OP({.domain = "com.microsoft",
                  .op = "DynamicQuantizeLSTM",
                  .since = 1,
                  .min_inputs = 12,
                  .max_inputs = 12,
                  .max_outputs = 3,
                  .types = "float X; uint8, int8 W and R",
                  .shape = recurrent_shape,
                  .create = make_dynamic_quantize_lstm});

}  // namespace kiln::ops

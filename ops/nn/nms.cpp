// NonMaxSuppression (opset 10+): per batch and class, greedily keeps the highest-scoring
// boxes whose IoU with every box kept so far is at most iou_threshold. Output rows are
// [batch, class, box], batches then classes in order, boxes by decreasing score (equal
// scores: lower box index first).
#include <algorithm>
#include <cmath>
#include <string>

#include "ops/core/common.h"

namespace kiln::ops {
namespace {

struct Box {
  float y0, x0, y1, x1, area;
};

// Corner form with min <= max, from [y1, x1, y2, x2] or [x_center, y_center, w, h].
Box to_corners(const float* b, bool center) {
  Box r{};
  if (center) {
    r.x0 = b[0] - b[2] / 2;
    r.x1 = b[0] + b[2] / 2;
    r.y0 = b[1] - b[3] / 2;
    r.y1 = b[1] + b[3] / 2;
  } else {
    r.y0 = std::min(b[0], b[2]);
    r.y1 = std::max(b[0], b[2]);
    r.x0 = std::min(b[1], b[3]);
    r.x1 = std::max(b[1], b[3]);
  }
  r.area = (r.x1 - r.x0) * (r.y1 - r.y0);
  return r;
}

// True when b suppresses a: IoU above the threshold (degenerate boxes never suppress).
bool suppresses(const Box& a, const Box& b, float iou_threshold) {
  const float ix0 = std::max(a.x0, b.x0), ix1 = std::min(a.x1, b.x1);
  if (!(ix1 > ix0)) return false;
  const float iy0 = std::max(a.y0, b.y0), iy1 = std::min(a.y1, b.y1);
  if (!(iy1 > iy0)) return false;
  const float inter = (ix1 - ix0) * (iy1 - iy0);
  const float uni = a.area + b.area - inter;
  if (!(inter > 0) || !(a.area > 0) || !(b.area > 0) || !(uni > 0)) return false;
  return inter / uni > iou_threshold;
}

class NonMaxSuppression final : public Kernel {
 public:
  explicit NonMaxSuppression(const NodeInfo& info) : center_(info.attr_int("center_point_box", 0)) {
    if (center_ != 0 && center_ != 1) info.fail("center_point_box must be 0 or 1");
  }

  void run(OpContext& ctx) override {
    const Tensor& boxes_t = ctx.input(0);
    const Tensor& scores_t = ctx.input(1);
    if (boxes_t.dtype() != DataType::Float) throw_unsupported_type(boxes_t.dtype(), "boxes");
    if (scores_t.dtype() != DataType::Float) throw_unsupported_type(scores_t.dtype(), "scores");
    if (boxes_t.rank() != 3 || boxes_t.dim(2) != 4) {
      ctx.fail("boxes must be (batches, boxes, 4), got " + boxes_t.describe());
    }
    if (scores_t.rank() != 3 || scores_t.dim(0) != boxes_t.dim(0) ||
        scores_t.dim(2) != boxes_t.dim(1)) {
      ctx.fail("scores " + scores_t.describe() + " does not match boxes " + boxes_t.describe());
    }
    int64_t max_out = 0;
    if (ctx.has_input(2) && ctx.input(2).numel() > 0) {
      max_out = std::max<int64_t>(0, to_int64s(ctx.input(2))[0]);
    }
    float iou = 0;
    if (ctx.has_input(3) && ctx.input(3).numel() > 0) {
      iou = static_cast<float>(scalar_as_double(single(ctx, 3)));
    }
    if (!(iou >= 0 && iou <= 1)) ctx.fail("iou_threshold must be in [0, 1]");
    const bool filter = ctx.has_input(4) && ctx.input(4).numel() > 0;
    const float score_threshold = filter ? static_cast<float>(scalar_as_double(single(ctx, 4))) : 0;

    const int64_t batches = boxes_t.dim(0), num_boxes = boxes_t.dim(1), classes = scores_t.dim(1);
    const float* boxes = boxes_t.data<const float>();
    const float* scores = scores_t.data<const float>();
    // Selected box indices per (batch, class), filled in parallel and concatenated in order.
    std::vector<std::vector<int64_t>> picked(static_cast<size_t>(batches * classes));
    if (max_out > 0 && num_boxes > 0) {
      parallel_for(batches * classes, grain_for(num_boxes * 16), [&](int64_t begin, int64_t end) {
        std::vector<std::pair<float, int64_t>> cand;
        std::vector<Box> kept;
        for (int64_t bc = begin; bc < end; ++bc) {
          const int64_t b = bc / classes;
          const float* s = scores + bc * num_boxes;
          cand.clear();
          for (int64_t i = 0; i < num_boxes; ++i) {
            // NaN scores have no rank and are never selected.
            if (std::isnan(s[i]) || (filter && !(s[i] > score_threshold))) continue;
            cand.emplace_back(s[i], i);
          }
          std::sort(cand.begin(), cand.end(), [](const auto& l, const auto& r) {
            return l.first > r.first || (l.first == r.first && l.second < r.second);
          });
          kept.clear();
          std::vector<int64_t>& out = picked[static_cast<size_t>(bc)];
          for (const auto& [score, i] : cand) {
            if (static_cast<int64_t>(out.size()) >= max_out) break;
            const Box box = to_corners(boxes + (b * num_boxes + i) * 4, center_ != 0);
            bool keep = true;
            for (const Box& k : kept) {
              if (suppresses(box, k, iou)) {
                keep = false;
                break;
              }
            }
            if (keep) {
              kept.push_back(box);
              out.push_back(i);
            }
          }
        }
      });
    }
    int64_t total = 0;
    for (const auto& v : picked) total += static_cast<int64_t>(v.size());
    Tensor& y = ctx.output(0, DataType::Int64, {total, 3});
    int64_t* o = y.data<int64_t>();
    for (int64_t bc = 0; bc < batches * classes; ++bc) {
      for (int64_t i : picked[static_cast<size_t>(bc)]) {
        *o++ = bc / classes;
        *o++ = bc % classes;
        *o++ = i;
      }
    }
  }

 private:
  static const Tensor& single(const OpContext& ctx, size_t i) {
    const Tensor& t = ctx.input(i);
    if (t.numel() != 1)
      ctx.fail("input " + std::to_string(i) + " must hold one value, got " + t.describe());
    return t;
  }

  int64_t center_;
};

// How many boxes survive depends on their scores and overlaps.
void nms_shape(ShapeContext&) {
  unknown("the number of selected boxes is only known when run");
}

}  // namespace

KILN_REGISTER_OP({.op = "NonMaxSuppression",
                  .since = 10,
                  .min_inputs = 2,
                  .max_inputs = 5,
                  .types = "float",
                  .shape = nms_shape,
                  .create = make<NonMaxSuppression>});

}  // namespace kiln::ops

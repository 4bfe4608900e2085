#include "engine/runtime/weight_release.h"

#include "kiln/memory.h"

namespace kiln {

WeightRelease::WeightRelease(const ir::Graph& graph) {
  for (ir::ValueId id : graph.initializers) {
    const Tensor& t = graph.value(id).constant;
    if (!t.defined() || !t.storage()->file_mapped()) continue;
    const Storage* key = t.storage().get();
    if (index_.count(key)) continue;
    // The storage's whole range: a loaded weight's storage covers exactly its bytes.
    Tensor bytes(DataType::UInt8, {static_cast<int64_t>(t.storage()->capacity())}, t.storage());
    if (!pages_releasable(bytes)) continue;
    index_.emplace(key, weights_.size());
    weights_.push_back({graph.value(id).name, std::move(bytes), 0});
  }
}

void WeightRelease::start_run(RunStats& stats) {
  stats_ = &stats;
  for (Weight& w : weights_) w.live = 0;
  dropped_.clear();
}

WeightRelease::Weight* WeightRelease::find(const Value& v) {
  if (index_.empty() || !v.is_tensor() || !v.tensor().defined()) return nullptr;
  auto it = index_.find(v.tensor().storage().get());
  return it == index_.end() ? nullptr : &weights_[it->second];
}

void WeightRelease::hold(const Value& v) {
  if (Weight* w = find(v)) ++w->live;
}

void WeightRelease::drop(const Value& v) {
  Weight* w = find(v);
  if (w && --w->live == 0) dropped_.push_back(static_cast<size_t>(w - weights_.data()));
}

void WeightRelease::end_step() {
  for (size_t i : dropped_) {
    Weight& w = weights_[i];
    if (w.live > 0) continue;  // a view of it was stored by this step
    const PageRelease r = release_pages(w.bytes, &stats_->weight_pages);
    if (!r.ok() && stats_->weight_release_error.empty()) {
      stats_->weight_release_error = "weight '" + w.name + "': " + r.describe();
    }
  }
  dropped_.clear();
}

}  // namespace kiln

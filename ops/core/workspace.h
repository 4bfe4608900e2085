// A workspace of several parts. One function of the sizes lays the parts out, and both the
// op's workspace rule (its bytes()) and its kernel (Workspace, which carves them) call it, so
// the bytes the contract declares are the bytes the kernel takes.
#pragma once

#include <array>
#include <cstdint>

#include "kiln/tensor.h"
#include "ops/core/kernel.h"

namespace kiln::ops {

class WorkspaceLayout {
 public:
  struct Part {
    DataType dtype;
    int64_t elements;
    uint64_t offset;  // bytes from the workspace's start, a multiple of kAlign
  };
  static constexpr uint64_t kAlign = 64;
  // Parts a layout may hold: kept inline, so that a kernel laying out its workspace on every
  // run allocates nothing.
  static constexpr int kMaxParts = 16;

  // Adds a part of `elements` (>= 0) of `dtype` and returns its index.
  int add(DataType dtype, int64_t elements);
  uint64_t bytes() const { return bytes_; }
  const Part& part(int i) const;

 private:
  std::array<Part, kMaxParts> parts_{};
  int count_ = 0;
  uint64_t bytes_ = 0;
};

// The kernel's side: takes the workspace from `ctx` once (nothing when the layout is empty)
// and hands out its parts. Held no longer than run(), and no longer than `layout`, which it
// reads in place (no copy of the parts per run).
class Workspace {
 public:
  Workspace(OpContext& ctx, const WorkspaceLayout& layout);
  Workspace(OpContext& ctx, WorkspaceLayout&& layout) = delete;
  // Part `i` as a contiguous tensor of `shape` (as many elements as the part).
  Tensor tensor(int i, Shape shape) const;
  // Part `i`'s first element; null when the part is empty or not taken (i < 0).
  template <typename T>
  T* data(int i) const {
    if (i < 0) return nullptr;
    const WorkspaceLayout::Part& p = layout_.part(i);
    return p.elements == 0 ? nullptr : reinterpret_cast<T*>(bytes_.raw_data() + p.offset);
  }

 private:
  const WorkspaceLayout& layout_;
  Tensor bytes_;
};

}  // namespace kiln::ops

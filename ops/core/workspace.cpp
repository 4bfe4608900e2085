#include "ops/core/workspace.h"

#include <stdexcept>

namespace kiln::ops {

int WorkspaceLayout::add(DataType dtype, int64_t elements) {
  if (elements < 0) throw std::length_error("negative workspace part");
  const uint64_t size = storage_bytes(dtype, elements);
  const uint64_t offset = (bytes_ + kAlign - 1) / kAlign * kAlign;
  if (size > UINT64_MAX / 2 - offset) throw std::length_error("workspace too large");
  if (count_ == kMaxParts) throw std::logic_error("workspace of too many parts");
  parts_[static_cast<size_t>(count_)] = {dtype, elements, offset};
  bytes_ = offset + size;
  return count_++;
}

const WorkspaceLayout::Part& WorkspaceLayout::part(int i) const {
  if (i < 0 || i >= count_) throw std::out_of_range("no such workspace part");
  return parts_[static_cast<size_t>(i)];
}

Workspace::Workspace(OpContext& ctx, const WorkspaceLayout& layout) : layout_(layout) {
  if (layout_.bytes() > 0)
    bytes_ = ctx.workspace(DataType::UInt8, static_cast<int64_t>(layout_.bytes()));
}

Tensor Workspace::tensor(int i, Shape shape) const {
  const WorkspaceLayout::Part& p = layout_.part(i);
  if (shape_numel(shape) != p.elements) throw std::logic_error("workspace part of another size");
  if (p.elements == 0) return Tensor(p.dtype, std::move(shape), Storage::heap_uninitialized(0));
  return Tensor(p.dtype, std::move(shape), bytes_.storage(), bytes_.byte_offset() + p.offset);
}

}  // namespace kiln::ops

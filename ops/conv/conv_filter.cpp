#include "ops/conv/conv_filter.h"

#include "ops/math/gemm.h"
#include "ops/math/kernels.h"
#include "ops/math/winograd.h"

namespace kiln::ops::convolution {

int64_t form_floats(int64_t groups, int64_t mg, int64_t cg, int64_t kk, FilterForm form) {
  const math::GemmKernels& t = math::kernels().gemm;
  switch (form) {
    case FilterForm::Transposed:
      return groups * math::PackedB::packed_floats(kk, mg, t.nr);
    case FilterForm::Winograd4:
      return groups * math::winograd_filter_floats(mg, cg, t.mr, 4);
    case FilterForm::Winograd2:
      return groups * math::winograd_filter_floats(mg, cg, t.mr, 2);
    case FilterForm::Packed:
      break;
  }
  return groups * math::PackedA::packed_floats(mg, kk, t.mr);
}

int64_t packed_filter_floats(const Tensor& w, int64_t groups, FilterForm form) {
  if (w.numel() == 0) return 0;
  return form_floats(groups, w.dim(0) / groups, w.dim(1), w.numel() / w.dim(0), form);
}

void pack_filter_into(const Tensor& w, int64_t groups, FilterForm form, float* out) {
  Tensor f = w.contiguous();
  if (f.dtype() != DataType::Float) {
    Tensor wide(DataType::Float, f.shape(),
                Storage::heap_uninitialized(storage_bytes(DataType::Float, f.numel())));
    const math::ConvertKernels& cv = math::kernels().convert;
    (f.dtype() == DataType::Float16 ? cv.f16_to_f32 : cv.bf16_to_f32)(
        reinterpret_cast<const uint16_t*>(f.raw_data()), wide.data<float>(), f.numel());
    f = wide;
  }
  const math::MathKernels& t = math::kernels();
  const int64_t mg = f.dim(0) / groups, kk = f.numel() / f.dim(0);
  const int64_t per = packed_filter_floats(f, groups, form) / groups;
  for (int64_t grp = 0; grp < groups; ++grp) {
    const float* fg = f.data<const float>() + grp * mg * kk;
    const math::MatrixView wg = math::MatrixView::row_major(fg, mg, kk, kk);
    if (form == FilterForm::Winograd4 || form == FilterForm::Winograd2) {
      math::winograd_pack_filter(fg, mg, f.dim(1), form == FilterForm::Winograd4 ? 4 : 2,
                                 out + grp * per, t);
    } else if (form == FilterForm::Transposed) {
      math::PackedB::pack_into(wg.transposed(), out + grp * per, t);
    } else {
      math::PackedA::pack_into(wg, out + grp * per, t);
    }
  }
}

Tensor pack_filter(const Tensor& w, int64_t groups, FilterForm form) {
  const int64_t floats = packed_filter_floats(w, groups, form);
  Tensor packed(DataType::Float, Shape{floats},
                Storage::heap_uninitialized(storage_bytes(DataType::Float, floats)));
  pack_filter_into(w, groups, form, packed.data<float>());
  packed.storage()->set_read_only();
  return packed;
}

}  // namespace kiln::ops::convolution

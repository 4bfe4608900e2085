#include "ops/math/kernels.h"

#include <string>

#include "kiln/error.h"

namespace kiln::math {

// Each defined in its level's unit.
namespace generic {
const MathKernels& table();
}
namespace avx2 {
const MathKernels& table();
}
namespace avx512 {
const MathKernels& table();
const MathKernels& table_without_extensions();
}  // namespace avx512

const MathKernels& kernels_for(Isa isa) {
  if (!cpu_supports(isa)) {
    throw Error(ErrorKind::Unsupported,
                std::string("this processor does not run the ") + isa_name(isa) + " kernels");
  }
  switch (isa) {
    case Isa::Generic:
      return generic::table();
    case Isa::Avx2:
      return avx2::table();
    case Isa::Avx512:
      return avx512::table();
  }
  return generic::table();
}

const MathKernels& kernels_without_extensions(Isa isa) {
  const MathKernels& t = kernels_for(isa);
  return isa == Isa::Avx512 ? avx512::table_without_extensions() : t;
}

const MathKernels& kernels() {
  static const MathKernels& active = kernels_for(active_isa());
  return active;
}

}  // namespace kiln::math

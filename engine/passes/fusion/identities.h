// Pass-through nodes removed: the only rewrites at GraphOptimization::Basic.
#pragma once

#include "engine/passes/fusion/rewriter.h"

namespace kiln::passes::fusion {

// Identity, inference Dropout (its mask unread), x * 1, x / 1, x + 0 and x - 0 (the constant
// of rank 0) and a Cast to the type its input has: their readers read the input instead. A
// node whose output is a graph output or read by a nested graph stays (the name must stay).
// Returns how many were removed.
int eliminate_identities(Rewriter& r);

// Cast(Cast(x, A), B) -> Cast(x, B) when A holds every value of x's type exactly (float to
// double, int32 to int64, float16 to float, ...): the second cast then sees x's values as
// they were. A chain back to x's own type then goes with eliminate_identities. The first
// Cast must have no other reader. Returns how many chains were shortened.
int fold_cast_chains(Rewriter& r);

}  // namespace kiln::passes::fusion

// Pass-through nodes removed: the only rewrites at GraphOptimization::Basic.
#pragma once

#include "engine/passes/fusion/rewriter.h"

namespace kiln::passes::fusion {

// Identity, inference Dropout (its mask unread), x * 1, x / 1, x + 0 and x - 0 (the constant
// of rank 0) and a Cast to the type its input has: their readers read the input instead. A
// node whose output is a graph output or read by a nested graph stays (the name must stay).
// Returns how many were removed.
int eliminate_identities(Rewriter& r);

}  // namespace kiln::passes::fusion

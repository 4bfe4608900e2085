// Internal: a Session from an IR model built in code (tests, hand-made graphs).
#pragma once

#include "engine/ir/graph.h"
#include "kiln/session.h"

namespace kiln {

// Validates, plans and wraps `model` exactly as a loaded file would be.
Session session_from_model(ir::Model model, SessionOptions options = {});

}  // namespace kiln

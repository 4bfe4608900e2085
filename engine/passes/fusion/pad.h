// A zero Pad before a convolution or an average pool, folded into the window op's own pads.
#pragma once

#include "engine/passes/fusion/rewriter.h"

namespace kiln::passes::fusion {

// Pad (mode constant, value 0, pads known, none negative, none on the batch and channel
// axes) read only by a Conv or by an AveragePool that counts padding (count_include_pad 1),
// without auto_pad: the pads are added to the window op's and the Pad goes. Exporters from
// layouts that pad explicitly (Keras's ZeroPadding2D, TensorFlow's SAME) write these. A
// MaxPool pads with -infinity, not zero, so its Pads stay. Returns how many were folded.
int fold_pad_into_window(Rewriter& r);

}  // namespace kiln::passes::fusion

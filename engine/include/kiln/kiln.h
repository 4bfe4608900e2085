// kiln's public API in one include.
#pragma once

#include "kiln/audio.h"
#include "kiln/data_type.h"
#include "kiln/environment.h"
#include "kiln/error.h"
#include "kiln/memory.h"
#include "kiln/ops.h"
#include "kiln/session.h"
#include "kiln/tensor.h"
#include "kiln/tensor_file.h"
#include "kiln/tokenizer.h"
#include "kiln/value.h"
#include "kiln/version.h"

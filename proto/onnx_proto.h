// The ONNX protobuf classes (from libonnx-dev). onnx_pb.h must come first: it defines
// ONNX_API, which the data-proto header uses without including it.
#pragma once

// clang-format off
#include <onnx/onnx_pb.h>
#include <onnx/onnx-data.pb.h>
// clang-format on

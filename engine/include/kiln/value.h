// Value: what flows along a graph edge. Almost always a Tensor; Sequence and Optional
// exist because ONNX's sequence ops and Loop bodies produce them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/tensor.h"

namespace kiln {

class Value {
 public:
  enum class Kind { None, Tensor, Sequence, Optional };

  Value() = default;
  Value(Tensor t) : kind_(Kind::Tensor), tensor_(std::move(t)) {}  // NOLINT: implicit on purpose

  // A sequence of tensors of one element type (kept so that an empty sequence is typed).
  static Value sequence(DataType elem_type, std::vector<Tensor> items);
  // An optional holding `inner` (a tensor or sequence value).
  static Value optional(Value inner);
  // An optional with no element. `elem_type` is the declared type of what it would hold.
  static Value empty_optional(Kind inner_kind, DataType elem_type);

  Kind kind() const { return kind_; }
  bool is_tensor() const { return kind_ == Kind::Tensor; }
  bool is_sequence() const { return kind_ == Kind::Sequence; }
  bool is_optional() const { return kind_ == Kind::Optional; }
  bool defined() const { return kind_ != Kind::None; }

  const Tensor& tensor() const;
  Tensor& tensor();
  const std::vector<Tensor>& items() const;
  std::vector<Tensor>& items();
  DataType elem_type() const;  // sequence or optional element type; tensor dtype otherwise
  bool has_element() const;    // optional: engaged?
  const Value& element() const;
  Kind optional_inner_kind() const { return inner_kind_; }

  std::string describe() const;

 private:
  Kind kind_ = Kind::None;
  Tensor tensor_;
  std::vector<Tensor> items_;
  DataType elem_type_ = DataType::Undefined;
  std::shared_ptr<Value> element_;
  Kind inner_kind_ = Kind::None;
};

struct NamedValue {
  std::string name;
  // Mutable so that Session::run can take ownership of a value moved into a braced list
  // (`run({{"x", std::move(t)}})`): std::initializer_list elements are const.
  mutable Value value;
};

}  // namespace kiln

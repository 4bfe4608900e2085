#include "kiln/value.h"

#include "kiln/error.h"

namespace kiln {

Value Value::sequence(DataType elem_type, std::vector<Tensor> items) {
  Value v;
  v.kind_ = Kind::Sequence;
  v.elem_type_ = elem_type;
  v.items_ = std::move(items);
  return v;
}

Value Value::optional(Value inner) {
  Value v;
  v.kind_ = Kind::Optional;
  v.inner_kind_ = inner.kind();
  v.elem_type_ = inner.elem_type();
  v.element_ = std::make_shared<Value>(std::move(inner));
  return v;
}

Value Value::empty_optional(Kind inner_kind, DataType elem_type) {
  Value v;
  v.kind_ = Kind::Optional;
  v.inner_kind_ = inner_kind;
  v.elem_type_ = elem_type;
  return v;
}

const Tensor& Value::tensor() const {
  if (kind_ != Kind::Tensor) {
    throw Error(ErrorKind::Runtime, "expected a tensor, got " + describe());
  }
  return tensor_;
}

Tensor& Value::tensor() {
  if (kind_ != Kind::Tensor) {
    throw Error(ErrorKind::Runtime, "expected a tensor, got " + describe());
  }
  return tensor_;
}

const std::vector<Tensor>& Value::items() const {
  if (kind_ != Kind::Sequence) {
    throw Error(ErrorKind::Runtime, "expected a sequence, got " + describe());
  }
  return items_;
}

std::vector<Tensor>& Value::items() {
  if (kind_ != Kind::Sequence) {
    throw Error(ErrorKind::Runtime, "expected a sequence, got " + describe());
  }
  return items_;
}

DataType Value::elem_type() const {
  return kind_ == Kind::Tensor ? tensor_.dtype() : elem_type_;
}

bool Value::has_element() const {
  return kind_ == Kind::Optional && element_ != nullptr;
}

const Value& Value::element() const {
  if (!has_element()) throw Error(ErrorKind::Runtime, "optional value has no element");
  return *element_;
}

std::string Value::describe() const {
  switch (kind_) {
    case Kind::None:
      return "nothing";
    case Kind::Tensor:
      return tensor_.describe();
    case Kind::Sequence:
      return "sequence<" + std::string(data_type_name(elem_type_)) + ">(" +
             std::to_string(items_.size()) + ")";
    case Kind::Optional:
      return element_ ? "optional(" + element_->describe() + ")" : "optional(empty)";
  }
  return "?";
}

}  // namespace kiln

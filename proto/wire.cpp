#include "proto/wire.h"

#include "kiln/error.h"

namespace kiln::proto {
namespace {

constexpr int kMaxDepth = 100;  // protobuf's own default recursion limit

[[noreturn]] void malformed(const char* what) {
  throw Error(ErrorKind::InvalidModel, std::string("malformed protobuf: ") + what);
}

// Which fields of a message lead (possibly) to TensorProto.raw_data.
bool child_type(WireMessage parent, uint32_t field, WireMessage& child) {
  using W = WireMessage;
  switch (parent) {
    case W::Model:
      if (field == 7) return child = W::Graph, true;
      if (field == 25) return child = W::Function, true;
      return false;
    case W::Graph:
      if (field == 1) return child = W::Node, true;
      if (field == 5) return child = W::Tensor, true;
      if (field == 15) return child = W::SparseTensor, true;
      return false;
    case W::Node:
      if (field == 5) return child = W::Attribute, true;
      return false;
    case W::Attribute:
      if (field == 5 || field == 10) return child = W::Tensor, true;
      if (field == 6 || field == 11) return child = W::Graph, true;
      if (field == 22 || field == 23) return child = W::SparseTensor, true;
      return false;
    case W::Function:
      if (field == 7) return child = W::Node, true;
      if (field == 11) return child = W::Attribute, true;
      return false;
    case W::SparseTensor:
      if (field == 1 || field == 2) return child = W::Tensor, true;
      return false;
    case W::Sequence:  // SequenceProto: tensor_values 3, sequence_values 5, map_values 6,
                       // optional_values 7
      if (field == 3) return child = W::Tensor, true;
      if (field == 4) return child = W::SparseTensor, true;
      if (field == 5) return child = W::Sequence, true;
      if (field == 6) return child = W::Map, true;
      if (field == 7) return child = W::Optional, true;
      return false;
    case W::Optional:  // OptionalProto: tensor_value 3, sparse 4, sequence 5, map 6, optional 7
      if (field == 3) return child = W::Tensor, true;
      if (field == 4) return child = W::SparseTensor, true;
      if (field == 5) return child = W::Sequence, true;
      if (field == 6) return child = W::Map, true;
      if (field == 7) return child = W::Optional, true;
      return false;
    case W::Map:  // MapProto: keys 3 (int64), string_keys 4, values 5 (SequenceProto)
      if (field == 5) return child = W::Sequence, true;
      return false;
    case W::Tensor:
      return false;
  }
  return false;
}

class Builder {
 public:
  explicit Builder(const uint8_t* base) : base_(base) {}

  void message(const uint8_t* p, const uint8_t* end, WireMessage type, int depth,
               std::string& out) {
    if (depth > kMaxDepth) malformed("nesting too deep");
    while (p < end) {
      const uint8_t* field_start = p;
      const uint64_t tag = varint(p, end);
      const uint32_t field = static_cast<uint32_t>(tag >> 3);
      const uint32_t wire = static_cast<uint32_t>(tag & 7);
      if (field == 0) malformed("field number 0");
      switch (wire) {
        case 0:
          (void)varint(p, end);
          break;
        case 1:
          advance(p, end, 8);
          break;
        case 5:
          advance(p, end, 4);
          break;
        case 2: {
          const uint64_t len = varint(p, end);
          if (len > static_cast<uint64_t>(end - p)) malformed("length past the end of the data");
          const uint8_t* body = p;
          p += len;
          WireMessage child;
          if (type == WireMessage::Tensor && field == 9) {
            // raw_data: keep a reference to where it is.
            put_varint(out, (static_cast<uint64_t>(kRawDataRefField) << 3) | 0);
            put_varint(out, result_.raw_data.size());
            result_.raw_data.push_back(
                {static_cast<uint64_t>(body - base_), static_cast<uint64_t>(len)});
            continue;
          }
          if (child_type(type, field, child)) {
            std::string sub;
            message(body, body + len, child, depth + 1, sub);
            put_varint(out, tag);
            put_varint(out, sub.size());
            out += sub;
            continue;
          }
          break;
        }
        default:
          malformed("unsupported wire type");
      }
      if (type == WireMessage::Tensor && field == kRawDataRefField) continue;  // never trusted
      out.append(reinterpret_cast<const char*>(field_start), static_cast<size_t>(p - field_start));
    }
    if (p != end) malformed("field runs past its message");
  }

  Skeleton result_;

 private:
  static uint64_t varint(const uint8_t*& p, const uint8_t* end) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p >= end) malformed("truncated varint");
      const uint8_t b = *p++;
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return v;
    }
    malformed("varint too long");
  }
  static void advance(const uint8_t*& p, const uint8_t* end, size_t n) {
    if (static_cast<size_t>(end - p) < n) malformed("truncated fixed-width field");
    p += n;
  }
  static void put_varint(std::string& out, uint64_t v) {
    while (v >= 0x80) {
      out.push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    out.push_back(static_cast<char>(v));
  }
  const uint8_t* base_;
};

}  // namespace

Skeleton make_skeleton(const std::byte* data, size_t size, WireMessage root) {
  const auto* p = reinterpret_cast<const uint8_t*>(data);
  Builder b(p);
  b.message(p, p + size, root, 0, b.result_.bytes);
  return std::move(b.result_);
}

}  // namespace kiln::proto

#include "smla/v1/tensor_bytes.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "smla/v1/step.pb.h"

namespace smla::v1 {
namespace pb = google::protobuf;
namespace {

enum WireType : uint32_t {
  kVarint = 0,
  kI64 = 1,
  kLen = 2,
  kStartGroup = 3,
  kEndGroup = 4,
  kI32 = 5
};

// The Tensor field that carries inline bytes, and its oneof sibling.
constexpr uint32_t kInlineDataField = 3;
constexpr uint32_t kRegionField = 4;
// Group nesting protobuf itself would accept (its default recursion limit).
constexpr int kMaxGroupDepth = 100;

// A read position over the slices of one message.
class SliceCursor {
 public:
  explicit SliceCursor(std::vector<grpc::Slice> slices) : slices_(std::move(slices)) {
    for (const grpc::Slice& s : slices_) size_ += s.size();
  }

  uint64_t pos() const { return pos_; }
  uint64_t size() const { return size_; }

  bool ReadByte(uint8_t* b) {
    if (pos_ >= size_) return false;
    Settle();
    *b = slices_[slice_].begin()[offset_];
    ++offset_;
    ++pos_;
    return true;
  }

  // A base-128 varint of at most 10 bytes.
  bool ReadVarint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
      uint8_t b = 0;
      if (!ReadByte(&b)) return false;
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }

  // Copies the next `n` bytes to `dst` (null: skips them).
  bool Take(uint64_t n, uint8_t* dst) {
    if (n > size_ - pos_) return false;
    while (n > 0) {
      Settle();
      const grpc::Slice& s = slices_[slice_];
      const size_t k = std::min<uint64_t>(n, s.size() - offset_);
      if (dst != nullptr) {
        std::memcpy(dst, s.begin() + offset_, k);
        dst += k;
      }
      offset_ += k;
      pos_ += k;
      n -= k;
    }
    return true;
  }

  // Like Take, but records where the bytes lie instead of copying them.
  bool TakePieces(uint64_t n, uint8_t* dst, std::vector<CopyPiece>* pieces) {
    if (n > size_ - pos_) return false;
    while (n > 0) {
      Settle();
      const grpc::Slice& s = slices_[slice_];
      const size_t k = std::min<uint64_t>(n, s.size() - offset_);
      pieces->push_back(CopyPiece{dst, s.begin() + offset_, k});
      dst += k;
      offset_ += k;
      pos_ += k;
      n -= k;
    }
    return true;
  }

  bool AppendTo(uint64_t n, std::string* out) {
    if (n > size_ - pos_) return false;
    const size_t at = out->size();
    out->resize(at + n);
    return Take(n, reinterpret_cast<uint8_t*>(out->data() + at));
  }

  void Seek(uint64_t pos) {
    if (pos < pos_) {
      pos_ = 0;
      slice_ = 0;
      offset_ = 0;
    }
    Take(pos - pos_, nullptr);
  }

 private:
  // Moves past exhausted slices (empty ones included).
  void Settle() {
    while (offset_ == slices_[slice_].size()) {
      ++slice_;
      offset_ = 0;
    }
  }

  std::vector<grpc::Slice> slices_;
  uint64_t size_ = 0;
  uint64_t pos_ = 0;
  size_t slice_ = 0;
  size_t offset_ = 0;
};

absl::Status Malformed(const std::string& type, absl::string_view what, uint64_t pos) {
  return absl::InvalidArgumentError(
      absl::StrCat("not a valid ", type, " (", what, " at byte ", pos, ")"));
}

class Walker {
 public:
  Walker(SliceCursor& in, std::string type_name) : in_(in), type_name_(std::move(type_name)) {}

  // Reads the fields of `msg` up to byte `end`. Fields that hold tensors (a Span, a Tensor)
  // recurse; the others are kept as raw bytes and merged by protobuf at the end.
  absl::Status Message(uint64_t end, pb::Message* msg) {
    const pb::Descriptor* desc = msg->GetDescriptor();
    const bool is_tensor = desc == Tensor::descriptor();
    std::string rest;
    int64_t last_inline = -1, last_region = -1, field_index = 0;
    while (in_.pos() < end) {
      const uint64_t at = in_.pos();
      uint64_t tag = 0;
      if (!in_.ReadVarint(&tag)) return Malformed(type_name_, "truncated tag", at);
      const uint32_t number = static_cast<uint32_t>(tag >> 3);
      const uint32_t type = static_cast<uint32_t>(tag & 7);
      if (number == 0 || (tag >> 3) > 0x1fffffff)
        return Malformed(type_name_, "invalid field number", at);
      ++field_index;
      if (type == kLen && is_tensor && number == kInlineDataField) {
        uint64_t n = 0;
        if (!in_.ReadVarint(&n) || n > end - in_.pos())
          return Malformed(type_name_, "truncated bytes", at);
        pending_.push_back({static_cast<const Tensor*>(msg), in_.pos(), n});
        in_.Take(n, nullptr);
        last_inline = field_index;
        continue;
      }
      if (is_tensor && number == kRegionField) last_region = field_index;
      const pb::FieldDescriptor* fd = desc->FindFieldByNumber(static_cast<int>(number));
      if (type == kLen && fd != nullptr && fd->type() == pb::FieldDescriptor::TYPE_MESSAGE &&
          HoldsTensors(fd->message_type())) {
        uint64_t n = 0;
        if (!in_.ReadVarint(&n) || n > end - in_.pos())
          return Malformed(type_name_, "truncated message", at);
        const pb::Reflection* r = msg->GetReflection();
        pb::Message* child =
            fd->is_repeated() ? r->AddMessage(msg, fd) : r->MutableMessage(msg, fd);
        absl::Status st = Message(in_.pos() + n, child);
        if (!st.ok()) return st;
        continue;
      }
      AppendVarint(tag, &rest);
      absl::Status st = CopyField(type, end, at, &rest, 0);
      if (!st.ok()) return st;
    }
    if (in_.pos() != end) return Malformed(type_name_, "field overruns its message", in_.pos());
    if (!rest.empty() && !msg->MergeFromString(rest)) {
      return absl::InvalidArgumentError(
          absl::StrCat("not a valid ", type_name_, " (", desc->name(), " fields do not parse)"));
    }
    // The oneof's last member wins, as in protobuf: bytes before a later region are dropped,
    // a region before later bytes is cleared.
    if (is_tensor && last_inline >= 0) {
      auto* t = static_cast<Tensor*>(msg);
      if (last_region > last_inline) {
        std::erase_if(pending_, [t](const TensorBytesReader::Bytes& p) { return p.tensor == t; });
      } else if (t->has_region()) {
        t->clear_region();
      }
    }
    return absl::OkStatus();
  }

  std::vector<TensorBytesReader::Bytes>& pending() { return pending_; }

 private:
  static bool HoldsTensors(const pb::Descriptor* d) {
    return d == Tensor::descriptor() || d == Span::descriptor();
  }

  // Copies the payload of a field of wire type `type` (its tag already read) into `rest`.
  absl::Status CopyField(uint32_t type, uint64_t end, uint64_t at, std::string* rest, int depth) {
    switch (type) {
      case kVarint: {
        uint64_t v = 0;
        if (!in_.ReadVarint(&v)) return Malformed(type_name_, "truncated varint", at);
        AppendVarint(v, rest);
        break;
      }
      case kI64:
      case kI32: {
        const uint64_t n = type == kI64 ? 8 : 4;
        if (n > end - in_.pos() || !in_.AppendTo(n, rest))
          return Malformed(type_name_, "truncated field", at);
        break;
      }
      case kLen: {
        uint64_t n = 0;
        if (!in_.ReadVarint(&n) || n > end - in_.pos())
          return Malformed(type_name_, "truncated bytes", at);
        AppendVarint(n, rest);
        in_.AppendTo(n, rest);
        break;
      }
      case kStartGroup: {
        if (depth >= kMaxGroupDepth) return Malformed(type_name_, "groups nested too deeply", at);
        for (;;) {
          const uint64_t inner_at = in_.pos();
          uint64_t tag = 0;
          if (inner_at >= end || !in_.ReadVarint(&tag))
            return Malformed(type_name_, "unterminated group", at);
          AppendVarint(tag, rest);
          if ((tag & 7) == kEndGroup) break;
          absl::Status st =
              CopyField(static_cast<uint32_t>(tag & 7), end, inner_at, rest, depth + 1);
          if (!st.ok()) return st;
        }
        break;
      }
      default:
        return Malformed(type_name_, "invalid wire type", at);
    }
    if (in_.pos() > end) return Malformed(type_name_, "field overruns its message", at);
    return absl::OkStatus();
  }

  SliceCursor& in_;
  const std::string type_name_;
  std::vector<TensorBytesReader::Bytes> pending_;
};

}  // namespace

class TensorBytesReader::Cursor : public SliceCursor {
 public:
  using SliceCursor::SliceCursor;
};

TensorBytesReader::TensorBytesReader() = default;
TensorBytesReader::~TensorBytesReader() = default;

absl::Status TensorBytesReader::Parse(const grpc::ByteBuffer& buffer, pb::Message* msg) {
  std::vector<grpc::Slice> slices;
  const std::string type = msg->GetDescriptor()->full_name();
  if (!buffer.Dump(&slices).ok()) return absl::InvalidArgumentError(type + ": unreadable buffer");
  in_ = std::make_unique<Cursor>(std::move(slices));
  Walker walker(*in_, type);
  absl::Status st = walker.Message(in_->size(), msg);
  if (!st.ok()) return st;
  // A tensor's last inline bytes win.
  std::vector<Bytes>& all = walker.pending();
  absl::flat_hash_map<const Tensor*, size_t> last;
  for (size_t i = 0; i < all.size(); ++i) last[all[i].tensor] = i;
  tensors_.clear();
  for (size_t i = 0; i < all.size(); ++i) {
    if (last[all[i].tensor] == i) tensors_.push_back(all[i]);
  }
  return absl::OkStatus();
}

void TensorBytesReader::CopyTo(const Bytes& bytes, uint8_t* dst) {
  in_->Seek(bytes.offset);
  in_->Take(bytes.size, dst);
}

void TensorBytesReader::AppendPieces(const Bytes& bytes, uint8_t* dst,
                                     std::vector<CopyPiece>* pieces) {
  in_->Seek(bytes.offset);
  in_->TakePieces(bytes.size, dst, pieces);
}

void AppendVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

std::string LengthPrefix(int field, uint64_t size) {
  std::string out;
  AppendVarint((static_cast<uint64_t>(field) << 3) | kLen, &out);
  AppendVarint(size, &out);
  return out;
}

}  // namespace smla::v1

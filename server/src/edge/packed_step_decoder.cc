#include "packed_step_decoder.h"

#include <iterator>
#include <string_view>

#include "id_limits.h"

namespace smla::server::edge {
namespace {

// Protobuf's wire types.
constexpr uint32_t kVarint = 0;
constexpr uint32_t kLen = 2;

// A cursor over one message's bytes. Every read returns false on bytes protobuf could refuse or
// read otherwise; the decoder then declines.
class Cursor {
 public:
  Cursor(const uint8_t* p, const uint8_t* end) : p_(p), end_(end) {}

  bool done() const { return p_ == end_; }

  // A base-128 varint of at most ten bytes whose tenth byte holds only bit 63.
  bool Varint(uint64_t* v) { return Read(10, v); }
  // The same into a narrower field, as protobuf reads it: an int32 or int64 keeps the low bits,
  // a bool is whether the varint is non-zero.
  template <typename T>
  bool Varint(T* out) {
    uint64_t v = 0;
    if (!Varint(&v)) return false;
    *out = static_cast<T>(v);
    return true;
  }

  // A field's tag: its number (at least 1) and wire type. Tags and lengths are read as protobuf
  // reads them: at most five bytes, a value below 2^32.
  bool Tag(uint32_t* field, uint32_t* type) {
    uint64_t t = 0;
    if (!Read(5, &t) || t > UINT32_MAX || (t >> 3) == 0) return false;
    *field = static_cast<uint32_t>(t >> 3);
    *type = static_cast<uint32_t>(t & 7);
    return true;
  }

  // A length-delimited field's bytes, as a cursor of their own.
  bool Sub(Cursor* sub) {
    uint64_t n = 0;
    if (!Read(5, &n) || n > static_cast<uint64_t>(end_ - p_)) return false;
    *sub = Cursor(p_, p_ + n);
    p_ += n;
    return true;
  }

  // A string field: ASCII only (protobuf checks a proto3 string's UTF-8, which this leaves to
  // it), and no longer than any id or region name the server accepts.
  bool String(std::string_view* s) {
    Cursor sub(nullptr, nullptr);
    if (!Sub(&sub) || static_cast<size_t>(sub.end_ - sub.p_) > kMaxIdBytes) return false;
    for (const uint8_t* c = sub.p_; c != sub.end_; ++c) {
      if (*c > 0x7f) return false;
    }
    *s = {reinterpret_cast<const char*>(sub.p_), static_cast<size_t>(sub.end_ - sub.p_)};
    return true;
  }

 private:
  bool Read(int most, uint64_t* v) {
    uint64_t r = 0;
    for (int i = 0; i < most; ++i) {
      if (p_ == end_) return false;
      const uint8_t b = *p_++;
      if (i == 9 && b > 1) return false;
      r |= uint64_t{b & 0x7fu} << (7 * i);
      if (b < 0x80) {
        *v = r;
        return true;
      }
    }
    return false;
  }

  const uint8_t* p_;
  const uint8_t* end_;
};

// Reads every field of the message `m` holds: `field(m, number, wire_type)` reads one and says
// whether it was read.
template <typename ReadField>
bool ReadFields(Cursor& m, ReadField&& field) {
  while (!m.done()) {
    uint32_t number = 0, type = 0;
    if (!m.Tag(&number, &type) || !field(m, number, type)) return false;
  }
  return true;
}

// A singular message field, read by `fields` (see ReadFields) into the view whose `set` it
// raises; a second occurrence is declined (protobuf would merge the two).
template <typename View, typename ReadField>
bool ReadMessage(Cursor& in, View* view, ReadField&& fields) {
  Cursor m(nullptr, nullptr);
  if (view->set || !in.Sub(&m)) return false;
  view->set = true;
  return ReadFields(m, fields);
}

bool DecodeRef(Cursor& in, RefView* ref) {
  return ReadMessage(in, ref, [ref](Cursor& m, uint32_t field, uint32_t type) {
    if (field == 1 && type == kLen) return m.String(&ref->region);
    if (field == 2 && type == kVarint) return m.Varint(&ref->offset);
    if (field == 3 && type == kVarint) return m.Varint(&ref->size);
    return false;
  });
}

// A role: the low 32 bits of its varint, as protobuf reads an enum.
bool DecodeRole(Cursor& in, SpanView* span) {
  int32_t role = 0;
  if (!in.Varint(&role)) return false;
  span->roles.push_back(role);
  return true;
}

bool DecodeSpan(Cursor& in, SpanView* span) {
  Cursor m(nullptr, nullptr);
  if (!in.Sub(&m)) return false;
  return ReadFields(m, [span](Cursor& f, uint32_t field, uint32_t type) {
    if (field == 1 && type == kLen) return f.String(&span->sequence_id);
    if (field == 2 && type == kVarint) return f.Varint(&span->first_position);
    if (field == 3 && type == kVarint) return f.Varint(&span->num_rows);
    if (field == 4 && type == kVarint) return DecodeRole(f, span);
    if (field == 4 && type == kLen) {
      Cursor packed(nullptr, nullptr);
      bool ok = f.Sub(&packed);
      while (ok && !packed.done()) ok = DecodeRole(packed, span);
      return ok;
    }
    return false;
  });
}

bool DecodePacked(Cursor& in, PackedView* p) {
  return ReadMessage(in, p, [p](Cursor& m, uint32_t field, uint32_t type) {
    // PackedInputs' region references by field number (5 is topk_width).
    RefView* const refs[] = {nullptr,  &p->kv_rows, &p->q,       &p->compressed_rows,
                             &p->topk, nullptr,     &p->q_scales};
    RefView* ref = field < std::size(refs) ? refs[field] : nullptr;
    if (ref != nullptr && type == kLen) return DecodeRef(m, ref);
    if (field == 5 && type == kVarint) return m.Varint(&p->topk_width);
    return false;
  });
}

}  // namespace

bool DecodePackedStep(std::span<const uint8_t> wire, StepView* out) {
  out->Clear();
  Cursor in(wire.data(), wire.data() + wire.size());
  const bool read = ReadFields(in, [out](Cursor& m, uint32_t field, uint32_t type) {
    if (type == kVarint) {
      switch (field) {
        case 3:
          return m.Varint(&out->layer);
        case 5:
          return m.Varint(&out->output_format);
        case 6:
          return m.Varint(&out->outputs.want_lse);
        case 7:
          return m.Varint(&out->inverse_rope);
        case 8:
          return m.Varint(&out->timeout_us);
        default:
          return false;
      }
    }
    if (type != kLen) return false;
    switch (field) {
      case 1:
        return m.String(&out->request_id);
      case 2:
        return m.String(&out->model);
      case 4:
        return out->spans.size() < kMaxDecodedSpans && DecodeSpan(m, &out->spans.emplace_back());
      case 9:
        return DecodeRef(m, &out->outputs.out);
      case 10:
        return DecodeRef(m, &out->outputs.mx_scales);
      case 11:
        return DecodeRef(m, &out->outputs.lse);
      case 12:
        return DecodePacked(m, &out->packed);
      default:
        return false;
    }
  });
  return read && out->packed.set;
}

}  // namespace smla::server::edge

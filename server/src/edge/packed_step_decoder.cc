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

bool DecodeRef(Cursor& in, RefView* ref) {
  if (ref->set) return false;  // protobuf would merge the two
  Cursor m(nullptr, nullptr);
  if (!in.Sub(&m)) return false;
  ref->set = true;
  while (!m.done()) {
    uint32_t field = 0, type = 0;
    if (!m.Tag(&field, &type)) return false;
    bool ok = false;
    if (field == 1 && type == kLen) {
      ok = m.String(&ref->region);
    } else if (field == 2 && type == kVarint) {
      ok = m.Varint(&ref->offset);
    } else if (field == 3 && type == kVarint) {
      ok = m.Varint(&ref->size);
    }
    if (!ok) return false;
  }
  return true;
}

// A role: the low 32 bits of its varint, as protobuf reads an enum.
bool DecodeRole(Cursor& in, SpanView* span) {
  uint64_t v = 0;
  if (!in.Varint(&v)) return false;
  span->roles.push_back(static_cast<int32_t>(v));
  return true;
}

bool DecodeSpan(Cursor& in, SpanView* span) {
  Cursor m(nullptr, nullptr);
  if (!in.Sub(&m)) return false;
  while (!m.done()) {
    uint32_t field = 0, type = 0;
    if (!m.Tag(&field, &type)) return false;
    uint64_t v = 0;
    bool ok = false;
    if (field == 1 && type == kLen) {
      ok = m.String(&span->sequence_id);
    } else if (field == 2 && type == kVarint) {
      ok = m.Varint(&v);
      span->first_position = static_cast<int64_t>(v);
    } else if (field == 3 && type == kVarint) {
      ok = m.Varint(&v);
      span->num_rows = static_cast<int32_t>(v);
    } else if (field == 4 && type == kVarint) {
      ok = DecodeRole(m, span);
    } else if (field == 4 && type == kLen) {
      Cursor packed(nullptr, nullptr);
      ok = m.Sub(&packed);
      while (ok && !packed.done()) ok = DecodeRole(packed, span);
    }
    if (!ok) return false;
  }
  return true;
}

bool DecodePacked(Cursor& in, PackedView* p) {
  if (p->set) return false;  // protobuf would merge the two
  Cursor m(nullptr, nullptr);
  if (!in.Sub(&m)) return false;
  p->set = true;
  while (!m.done()) {
    uint32_t field = 0, type = 0;
    if (!m.Tag(&field, &type)) return false;
    // PackedInputs' region references by field number (5 is topk_width).
    RefView* const refs[] = {nullptr,  &p->kv_rows, &p->q,       &p->compressed_rows,
                             &p->topk, nullptr,     &p->q_scales};
    RefView* ref = field < std::size(refs) ? refs[field] : nullptr;
    bool ok = false;
    if (ref != nullptr && type == kLen) {
      ok = DecodeRef(m, ref);
    } else if (field == 5 && type == kVarint) {
      uint64_t v = 0;
      ok = m.Varint(&v);
      p->topk_width = static_cast<int32_t>(v);
    }
    if (!ok) return false;
  }
  return true;
}

}  // namespace

bool DecodePackedStep(std::span<const uint8_t> wire, StepView* out) {
  out->Clear();
  Cursor in(wire.data(), wire.data() + wire.size());
  while (!in.done()) {
    uint32_t field = 0, type = 0;
    if (!in.Tag(&field, &type)) return false;
    uint64_t v = 0;
    bool ok = false;
    if (type == kVarint) {
      ok = in.Varint(&v);
      switch (field) {
        case 3:
          out->layer = static_cast<int32_t>(v);
          break;
        case 5:
          out->output_format = static_cast<int32_t>(v);
          break;
        case 6:
          out->outputs.want_lse = v != 0;
          break;
        case 7:
          out->inverse_rope = v != 0;
          break;
        case 8:
          out->timeout_us = static_cast<int64_t>(v);
          break;
        default:
          ok = false;
      }
    } else if (type == kLen) {
      switch (field) {
        case 1:
          ok = in.String(&out->request_id);
          break;
        case 2:
          ok = in.String(&out->model);
          break;
        case 4:
          ok = out->spans.size() < kMaxDecodedSpans && DecodeSpan(in, &out->spans.emplace_back());
          break;
        case 9:
          ok = DecodeRef(in, &out->outputs.out);
          break;
        case 10:
          ok = DecodeRef(in, &out->outputs.mx_scales);
          break;
        case 11:
          ok = DecodeRef(in, &out->outputs.lse);
          break;
        case 12:
          ok = DecodePacked(in, &out->packed);
          break;
        default:
          break;
      }
    }
    if (!ok) return false;
  }
  return out->packed.set;
}

}  // namespace smla::server::edge

// Protobuf messages as Python dicts, by reflection: ServerInfo, timings. Field names as in
// the .proto, enums by value name, 64-bit integers as int, bytes as bytes.
#include "common.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/reflection.h"

namespace smla::python {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

py::object Scalar(const Message& m, const Reflection* r, const FieldDescriptor* f, int i) {
  const bool rep = f->is_repeated();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return py::int_(rep ? r->GetRepeatedInt32(m, f, i) : r->GetInt32(m, f));
    case FieldDescriptor::CPPTYPE_INT64:
      return py::int_(rep ? r->GetRepeatedInt64(m, f, i) : r->GetInt64(m, f));
    case FieldDescriptor::CPPTYPE_UINT32:
      return py::int_(rep ? r->GetRepeatedUInt32(m, f, i) : r->GetUInt32(m, f));
    case FieldDescriptor::CPPTYPE_UINT64:
      return py::int_(rep ? r->GetRepeatedUInt64(m, f, i) : r->GetUInt64(m, f));
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return py::float_(rep ? r->GetRepeatedDouble(m, f, i) : r->GetDouble(m, f));
    case FieldDescriptor::CPPTYPE_FLOAT:
      return py::float_(rep ? r->GetRepeatedFloat(m, f, i) : r->GetFloat(m, f));
    case FieldDescriptor::CPPTYPE_BOOL:
      return py::bool_(rep ? r->GetRepeatedBool(m, f, i) : r->GetBool(m, f));
    case FieldDescriptor::CPPTYPE_ENUM: {
      const int v = rep ? r->GetRepeatedEnumValue(m, f, i) : r->GetEnumValue(m, f);
      const auto* value = f->enum_type()->FindValueByNumber(v);
      return value != nullptr ? py::object(py::str(value->name())) : py::object(py::int_(v));
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      const std::string s = rep ? r->GetRepeatedString(m, f, i) : r->GetString(m, f);
      if (f->type() == FieldDescriptor::TYPE_BYTES) return py::bytes(s);
      return py::str(s);
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return MessageToDict(rep ? r->GetRepeatedMessage(m, f, i) : r->GetMessage(m, f));
  }
  return py::none();
}

}  // namespace

py::object MessageToDict(const Message& message) {
  py::dict d;
  const auto* desc = message.GetDescriptor();
  const Reflection* r = message.GetReflection();
  // Every field, set or not, so that callers see the zero values proto3 leaves implicit.
  for (int k = 0; k < desc->field_count(); ++k) {
    const FieldDescriptor* f = desc->field(k);
    if (f->is_repeated()) {
      py::list l;
      for (int i = 0; i < r->FieldSize(message, f); ++i) l.append(Scalar(message, r, f, i));
      d[py::str(f->name())] = l;
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !r->HasField(message, f)) {
      d[py::str(f->name())] = py::none();
    } else {
      d[py::str(f->name())] = Scalar(message, r, f, 0);
    }
  }
  return d;
}

}  // namespace smla::python

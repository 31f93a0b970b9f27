#include "tensors.h"

#include <cstring>
#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "dlpack.h"
#include "smla/client/tensor.h"

namespace smla::python {
namespace {

const char* WantName(Want want) {
  switch (want) {
    case Want::kBf16:
      return "bf16 (uint16 bit patterns, a DLPack bfloat16, or float32 to round)";
    case Want::kF32:
      return "float32";
    case Want::kInt32:
      return "int32";
    case Want::kU8:
      return "uint8";
  }
  return "?";
}

size_t Count(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

bool DlpackMatches(const dlpack::DataType& t, Want want) {
  if (t.lanes != 1) return false;
  switch (want) {
    case Want::kBf16:
      return t.bits == 16 &&
             (t.code == dlpack::kBfloat || t.code == dlpack::kUInt || t.code == dlpack::kInt);
    case Want::kF32:
      return t.bits == 32 && t.code == dlpack::kFloat;
    case Want::kInt32:
      return t.bits == 32 && t.code == dlpack::kInt;
    case Want::kU8:
      return t.bits == 8 && (t.code == dlpack::kUInt || t.code == dlpack::kInt);
  }
  return false;
}

// The producer's memory by reference, or nullopt when it needs a conversion (then NumPy's own
// from_dlpack and a cast take over).
std::optional<HostTensor> ReadDlpack(py::handle obj, Want want, const std::string& what) {
  py::object capsule = obj.attr("__dlpack__")();
  if (!PyCapsule_IsValid(capsule.ptr(), "dltensor")) {
    throw py::type_error(what + ": __dlpack__() did not return a DLPack capsule");
  }
  auto* managed =
      static_cast<dlpack::ManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  // Consumed: the capsule must no longer free it; `keep` does, once nothing reads it.
  PyCapsule_SetName(capsule.ptr(), "used_dltensor");
  py::capsule keep(managed, [](void* p) {
    auto* m = static_cast<dlpack::ManagedTensor*>(p);
    if (m->deleter != nullptr) m->deleter(m);
  });
  const dlpack::Tensor& t = managed->dl_tensor;
  const int32_t device = t.device.device_type;
  if (device != dlpack::kCpu && device != dlpack::kCudaHost && device != dlpack::kRocmHost) {
    throw py::type_error(absl::StrCat(what, ": a DLPack tensor on device type ", device,
                                      "; only host memory can be sent"));
  }
  if (!DlpackMatches(t.dtype, want)) return std::nullopt;
  HostTensor h;
  h.shape.assign(t.shape, t.shape + t.ndim);
  if (t.strides != nullptr) {
    int64_t expect = 1;
    for (int32_t d = t.ndim - 1; d >= 0; --d) {
      if (t.shape[d] != 1 && t.strides[d] != expect) return std::nullopt;
      expect *= t.shape[d];
    }
  }
  h.data = static_cast<const uint8_t*>(t.data) + t.byte_offset;
  h.bytes = Count(h.shape) * (t.dtype.bits / 8);
  h.keep = std::move(keep);
  return h;
}

HostTensor ReadNumpy(py::handle obj, Want want, const std::string& what, bool convert) {
  py::module_ np = py::module_::import("numpy");
  py::array a = py::array::ensure(obj);
  if (!a) throw py::type_error(what + ": not an array");
  const char kind = Kind(a);
  const ssize_t size = ItemSize(a);
  const bool integer = kind == 'i' || kind == 'u';
  bool ok = false;
  py::object cast_to;
  switch (want) {
    case Want::kBf16:
      // ml_dtypes' bfloat16 is a 2-byte void-kind dtype named "bfloat16".
      ok = (integer && size == 2) ||
           (size == 2 && py::str(a.dtype().attr("name")).cast<std::string>() == "bfloat16");
      if (!ok && convert && kind == 'f') {
        py::array_t<float, py::array::c_style | py::array::forcecast> f(a);
        std::vector<uint16_t> b = client::ToBf16({f.data(), static_cast<size_t>(f.size())});
        py::array bits = np.attr("empty")(py::tuple(f.attr("shape")), np.attr("uint16"));
        std::memcpy(bits.mutable_data(), b.data(), b.size() * sizeof(uint16_t));
        a = bits;
        ok = true;
      }
      break;
    case Want::kF32:
      ok = kind == 'f' && size == 4;
      if (!ok && convert && (kind == 'f' || integer)) cast_to = np.attr("float32");
      break;
    case Want::kInt32:
      ok = kind == 'i' && size == 4;
      if (!ok && convert && integer) cast_to = np.attr("int32");
      break;
    case Want::kU8:
      ok = integer && size == 1;
      break;
  }
  if (!ok && !cast_to) {
    throw py::type_error(absl::StrCat(what, ": dtype ", py::str(a.dtype()).cast<std::string>(),
                                      ", expected ", WantName(want)));
  }
  if (cast_to) a = a.attr("astype")(cast_to);
  if (!(a.flags() & py::array::c_style)) {
    if (!convert) throw py::type_error(what + ": not C-contiguous");
    a = np.attr("ascontiguousarray")(a);
  }
  HostTensor h;
  h.shape.assign(a.shape(), a.shape() + a.ndim());
  h.data = static_cast<const uint8_t*>(a.data());
  h.bytes = a.attr("nbytes").cast<size_t>();
  h.keep = std::move(a);
  return h;
}

struct Registry {
  std::mutex mu;
  struct Entry {
    uint64_t size;
    std::weak_ptr<PyRegion> region;
  };
  std::map<uintptr_t, Entry> by_address;
  std::map<std::string, std::weak_ptr<PyRegion>> by_name;
};
Registry& Regions() {
  static Registry* r = new Registry();
  return *r;
}

}  // namespace

HostTensor ReadTensor(py::handle obj, Want want, const std::string& what, bool convert) {
  if (obj.is_none()) throw py::type_error(what + ": missing");
  if (!py::isinstance<py::array>(obj) && py::hasattr(obj, "__dlpack__")) {
    if (std::optional<HostTensor> h = ReadDlpack(obj, want, what)) return *std::move(h);
    if (!convert) {
      throw py::type_error(
          absl::StrCat(what, ": a DLPack tensor that is not contiguous ", WantName(want)));
    }
    return ReadNumpy(py::module_::import("numpy").attr("from_dlpack")(obj), want, what, true);
  }
  if (!convert && !py::isinstance<py::array>(obj)) {
    throw py::type_error(what + ": needs a NumPy array or a DLPack tensor to write into");
  }
  return ReadNumpy(obj, want, what, convert);
}

PyRegion::~PyRegion() {
  RemoveRegion(this);
  region.reset();  // cancels the registration while the client still exists
}

void AddRegion(const std::shared_ptr<PyRegion>& region) {
  Registry& r = Regions();
  std::lock_guard<std::mutex> lock(r.mu);
  r.by_address[reinterpret_cast<uintptr_t>(region->region->data())] = {region->region->size(),
                                                                       region};
  r.by_name[region->region->name()] = region;
}

void RemoveRegion(const PyRegion* region) {
  if (!region->region) return;
  Registry& r = Regions();
  std::lock_guard<std::mutex> lock(r.mu);
  r.by_address.erase(reinterpret_cast<uintptr_t>(region->region->data()));
  r.by_name.erase(region->region->name());
}

std::optional<RegionHit> FindRegion(const void* data, size_t bytes) {
  if (bytes == 0) return std::nullopt;
  const auto p = reinterpret_cast<uintptr_t>(data);
  Registry& r = Regions();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.by_address.upper_bound(p);
  if (it == r.by_address.begin()) return std::nullopt;
  --it;
  if (p - it->first > it->second.size || bytes > it->second.size - (p - it->first)) {
    return std::nullopt;
  }
  std::shared_ptr<PyRegion> region = it->second.region.lock();
  if (!region) return std::nullopt;
  return RegionHit{std::move(region), p - it->first};
}

std::shared_ptr<PyRegion> FindRegionByName(const std::string& name) {
  Registry& r = Regions();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.by_name.find(name);
  return it == r.by_name.end() ? nullptr : it->second.lock();
}

std::optional<v1::RegionRef> RegionRefOf(const HostTensor& h) {
  std::optional<RegionHit> hit = FindRegion(h.data, h.bytes);
  if (!hit) return std::nullopt;
  v1::RegionRef ref;
  ref.set_region(hit->region->region->name());
  ref.set_offset(hit->offset);
  ref.set_size(h.bytes);
  return ref;
}

void PutTensor(const HostTensor& h, v1::DType dtype, v1::Tensor* t) {
  t->set_dtype(dtype);
  t->clear_shape();
  for (int64_t d : h.shape) t->add_shape(d);
  if (std::optional<v1::RegionRef> ref = RegionRefOf(h)) {
    *t->mutable_region() = *std::move(ref);
  } else {
    t->set_inline_data(h.data, h.bytes);
  }
}

py::object TensorView(const v1::Tensor& t, const std::shared_ptr<const void>& owner) {
  py::dtype dtype;
  switch (t.dtype()) {
    case v1::DTYPE_BF16:
      dtype = py::dtype::of<uint16_t>();
      break;
    case v1::DTYPE_F32:
      dtype = py::dtype::of<float>();
      break;
    case v1::DTYPE_INT32:
      dtype = py::dtype::of<int32_t>();
      break;
    case v1::DTYPE_E4M3:
    case v1::DTYPE_E8M0:
    case v1::DTYPE_UINT8:
      dtype = py::dtype::of<uint8_t>();
      break;
    default:
      return py::none();
  }
  std::vector<ssize_t> shape(t.shape().begin(), t.shape().end());
  size_t bytes = static_cast<size_t>(ItemSize(dtype));
  for (ssize_t d : shape) bytes *= static_cast<size_t>(d);
  if (t.has_region()) {
    const v1::RegionRef& ref = t.region();
    std::shared_ptr<PyRegion> region = FindRegionByName(ref.region());
    if (!region) {
      throw StatusError(absl::FailedPreconditionError(absl::StrCat(
          "the response names region ", ref.region(), ", which this process does not hold")));
    }
    const uint64_t size = region->region->size();
    if (ref.size() != bytes || ref.offset() > size || bytes > size - ref.offset()) {
      throw StatusError(absl::DataLossError(absl::StrCat("the response's range ", ref.offset(), "+",
                                                         ref.size(), " of region ", ref.region(),
                                                         " does not hold ", bytes, " bytes")));
    }
    auto* keep = new std::shared_ptr<PyRegion>(region);
    py::capsule base(keep, [](void* p) { delete static_cast<std::shared_ptr<PyRegion>*>(p); });
    return CArray(dtype, shape, region->region->data() + ref.offset(), base);
  }
  if (t.inline_data().size() != bytes) {
    throw StatusError(absl::DataLossError(absl::StrCat(
        "response tensor holds ", t.inline_data().size(), " bytes, its shape needs ", bytes)));
  }
  auto* keep = new std::shared_ptr<const void>(owner);
  py::capsule base(keep, [](void* p) { delete static_cast<std::shared_ptr<const void>*>(p); });
  return CArray(dtype, shape, const_cast<char*>(t.inline_data().data()), base);
}

}  // namespace smla::python

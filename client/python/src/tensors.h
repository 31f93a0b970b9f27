// Python tensors in and out: NumPy arrays and DLPack producers read as contiguous host memory
// (by reference where the transport allows: memory inside a registered region becomes a
// RegionRef, anything else is copied once into the message), and response tensors returned as
// NumPy arrays over the response's own bytes or the region's memory (no copy).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "smla/client/shm.h"
#include "smla/v1/step.pb.h"

namespace smla::python {

// What a field takes. kBf16 also takes float32 NumPy input (rounded to nearest even, a copy).
enum class Want { kBf16, kF32, kInt32, kU8 };

struct HostTensor {
  const uint8_t* data = nullptr;
  std::vector<int64_t> shape;
  size_t bytes = 0;
  py::object keep;  // what owns `data`
};

// Reads `obj` as a C-contiguous host tensor of kind `want`; `what` names it in errors
// (TypeError for a dtype or device it cannot take). With `convert`, other dtypes that cast
// (and non-contiguous arrays) are copied; without, only memory usable in place is taken
// (output buffers).
HostTensor ReadTensor(py::handle obj, Want want, const std::string& what, bool convert = true);

// A registered region as Python holds it: the region and the client it was registered through
// (which must outlive it).
struct PyRegion {
  std::shared_ptr<PyClient> client;
  std::unique_ptr<client::ShmRegion> region;
  ~PyRegion();
};

// Live regions by address, so tensors inside one travel by reference, and by name, so
// response tensors naming one are read in place.
void AddRegion(const std::shared_ptr<PyRegion>& region);
void RemoveRegion(const PyRegion* region);
struct RegionHit {
  std::shared_ptr<PyRegion> region;
  uint64_t offset = 0;
};
std::optional<RegionHit> FindRegion(const void* data, size_t bytes);
std::shared_ptr<PyRegion> FindRegionByName(const std::string& name);

// Fills `t` (dtype, shape, and a RegionRef or inline bytes).
void PutTensor(const HostTensor& h, v1::DType dtype, v1::Tensor* t);
// A RegionRef for `h` when it lies in a live region (output buffers).
std::optional<v1::RegionRef> RegionRefOf(const HostTensor& h);

// A NumPy view of a response tensor: inline bytes (kept alive by `owner`) or a range of a live
// region (kept alive by the view). None when the tensor is unset.
py::object TensorView(const v1::Tensor& t, const std::shared_ptr<const void>& owner);

}  // namespace smla::python

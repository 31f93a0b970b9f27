// The DLPack C ABI (https://dmlc.github.io/dlpack/latest/c_api.html), unversioned form: the
// structs a `__dlpack__()` capsule named "dltensor" points to. Only the fields read here.
#pragma once

#include <cstdint>

namespace smla::python::dlpack {

enum DeviceType : int32_t { kCpu = 1, kCudaHost = 3, kRocmHost = 11 };
enum TypeCode : uint8_t { kInt = 0, kUInt = 1, kFloat = 2, kBfloat = 4 };

struct Device {
  int32_t device_type;
  int32_t device_id;
};
struct DataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null = compact row-major
  uint64_t byte_offset;
};
struct ManagedTensor {
  Tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor* self);
};

}  // namespace smla::python::dlpack

"""DLPack producers without torch: a wrapper that only speaks __dlpack__ (forwarding to NumPy's
own export), and a bfloat16 tensor built by hand with ctypes, the way torch exports bf16."""

import ctypes

import numpy as np


class DLPackOnly:
    """Exposes an array through __dlpack__ / __dlpack_device__ only (no buffer protocol)."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, stream=None):
        return self._array.__dlpack__()

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _DType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_Managed))
_Managed._fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p),
                     ("deleter", _DELETER)]

_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class Bf16Tensor:
    """A CPU bfloat16 tensor (DLPack type code 4, 16 bits) over uint16 bit patterns, as torch
    exports torch.bfloat16; `device_type` lets tests claim a GPU tensor. Counts deleter calls."""

    deleted = 0

    def __init__(self, bits, device_type=1):
        self.bits = np.ascontiguousarray(bits, dtype=np.uint16)
        self.device_type = device_type
        self._keep = []

    def __dlpack_device__(self):
        return (self.device_type, 0)

    def __dlpack__(self, stream=None):
        shape = (ctypes.c_int64 * self.bits.ndim)(*self.bits.shape)
        m = _Managed()
        m.dl_tensor = _Tensor(self.bits.ctypes.data, _Device(self.device_type, 0),
                              self.bits.ndim, _DType(4, 16, 1), shape, None, 0)

        def deleter(_):
            Bf16Tensor.deleted += 1

        m.deleter = _DELETER(deleter)
        self._keep.append((shape, m, m.deleter))
        return _PyCapsule_New(ctypes.addressof(m), b"dltensor", None)

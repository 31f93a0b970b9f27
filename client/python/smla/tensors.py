"""NumPy helpers for SMLA's wire formats: bf16 as uint16 bit patterns, OCP e4m3 codes and
UE8M0 scale bytes (MXFP8 outputs and queries). Pure NumPy, independent of the C++ codecs."""

import numpy as np


def bf16_to_float32(bits):
    """bf16 bit patterns (uint16) -> float32, exactly."""
    bits = np.asarray(bits, dtype=np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16(values):
    """float32 -> bf16 bit patterns (uint16), rounded to nearest even (NaN stays NaN)."""
    v = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (v + np.uint32(0x7FFF) + ((v >> 16) & 1)) >> 16
    nan = np.isnan(np.asarray(values, dtype=np.float32))
    return np.where(nan, (v >> 16) | 0x40, rounded).astype(np.uint16)


def _e4m3_table():
    codes = np.arange(256, dtype=np.uint32)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = (codes >> 3) & 0xF
    man = codes & 0x7
    normal = (1.0 + man / 8.0) * np.exp2(exp.astype(np.float64) - 7.0)
    subnormal = (man / 8.0) * np.exp2(-6.0)
    table = sign * np.where(exp == 0, subnormal, normal)
    table[(codes & 0x7F) == 0x7F] = np.nan  # 0x7F and 0xFF
    return table.astype(np.float32)


E4M3_VALUES = _e4m3_table()
"""float32 value of each OCP e4m3 code (0x7F, 0xFF: NaN)."""


def e4m3_to_float32(codes):
    return E4M3_VALUES[np.asarray(codes, dtype=np.uint8)]


def e8m0_to_float32(scales):
    """UE8M0 scale bytes -> 2^(byte - 127) (255: NaN)."""
    s = np.asarray(scales, dtype=np.uint8)
    out = np.exp2(s.astype(np.float32) - 127.0).astype(np.float32)
    return np.where(s == 255, np.float32(np.nan), out)


def decode_mxfp8(codes, scales, heads=None):
    """An MXFP8 output (e4m3 codes [T, H*512], scale bytes [T, H*16], one per 32 lanes) as
    float32 [T, H, 512] (or [T, H*512] when `heads` is None and H cannot be inferred)."""
    codes = np.asarray(codes, dtype=np.uint8)
    scales = np.asarray(scales, dtype=np.uint8)
    t = codes.shape[0]
    groups = scales.shape[-1]
    values = e4m3_to_float32(codes.reshape(t, groups, -1)) * e8m0_to_float32(scales)[..., None]
    if heads is None:
        heads = groups // 16
    return values.reshape(t, heads, -1)


def decode_mxfp8_query(codes, scales):
    """An MXFP8 query (e4m3 codes [rows, H, W], scale bytes [rows, H, W/32]) as float32."""
    codes = np.asarray(codes, dtype=np.uint8)
    scales = np.asarray(scales, dtype=np.uint8)
    shape = codes.shape
    values = e4m3_to_float32(codes.reshape(*scales.shape, 32)) * e8m0_to_float32(scales)[..., None]
    return values.reshape(shape)

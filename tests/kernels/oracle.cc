#include "oracle.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_map>

namespace smla::oracle {
namespace {

int Width(Geometry g) { return g == Geometry::kRopeAppended ? 576 : 512; }

uint16_t ReadU16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

float ReadF32(const uint8_t* p) {
  const uint32_t u = static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                     (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Value of f32 magnitude bits as a double, reading exponent 255 as 2^128 (for rounding).
double MagnitudeValue(uint32_t mag) {
  const int e = static_cast<int>(mag >> 23);
  const double f = static_cast<double>(mag & 0x7fffff);
  if (e == 0) return std::ldexp(f, -149);
  return std::ldexp(1.0 + f / 8388608.0, e - 127);
}

}  // namespace

double E4m3Value(uint8_t code) {
  const int sign = code >> 7;
  const int e = (code >> 3) & 15;
  const int m = code & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(1.0 + m / 8.0, e - 7);
  return sign ? -mag : mag;
}

uint8_t E4m3Nearest(double x) {
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(x);
  if (a >= 448.0) return sign | 0x7e;
  int best = 0;
  double best_d = a;
  for (int c = 1; c <= 0x7e; ++c) {
    const double d = std::fabs(a - E4m3Value(static_cast<uint8_t>(c)));
    if (d < best_d || (d == best_d && (c & 1) == 0 && (best & 1) == 1)) {
      best = c;
      best_d = d;
    }
  }
  return sign | static_cast<uint8_t>(best);
}

double Bf16Value(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t Bf16Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if (std::isnan(x)) return static_cast<uint16_t>((u >> 16) | 0x40);
  const uint32_t sign = u & 0x80000000u;
  const uint32_t mag = u & 0x7fffffffu;
  const uint32_t lo = mag & 0xffff0000u;
  if (lo == mag) return static_cast<uint16_t>((sign | mag) >> 16);
  const uint32_t hi = lo + 0x10000u;
  const double a = MagnitudeValue(mag);
  const double dl = a - MagnitudeValue(lo);
  const double dh = MagnitudeValue(hi) - a;
  uint32_t pick;
  if (dl < dh) {
    pick = lo;
  } else if (dh < dl) {
    pick = hi;
  } else {
    pick = ((lo >> 16) & 1) == 0 ? lo : hi;
  }
  return static_cast<uint16_t>((sign | pick) >> 16);
}

float RoundF32ToBf16(float x) { return static_cast<float>(Bf16Value(Bf16Bits(x))); }

int CeilLog2Over448(double amax) {
  int e = std::ilogb(amax) - 9;
  while (std::ldexp(448.0, e) < amax) ++e;
  while (std::ldexp(448.0, e - 1) >= amax) --e;
  return e;
}

std::vector<double> DequantRow(const Cache& c, int64_t slot) {
  const int w = Width(c.geometry);
  const int64_t page = slot / c.rows_per_page;
  const int64_t row = slot % c.rows_per_page;
  const uint8_t* pg = c.bytes + page * c.pitch;
  std::vector<double> v(w);
  switch (c.format) {
    case KvFormat::kBf16: {
      const uint8_t* r = pg + row * 2 * w;
      for (int i = 0; i < w; ++i) v[i] = Bf16Value(ReadU16(r + 2 * i));
      break;
    }
    case KvFormat::kFp8PerTensor: {
      const uint8_t* r = pg + row * w;
      for (int i = 0; i < w; ++i) v[i] = E4m3Value(r[i]) * static_cast<double>(c.scale);
      break;
    }
    case KvFormat::kFp8DsMla: {
      const uint8_t* r = pg + row * 656;
      for (int i = 0; i < 512; ++i) {
        const float product =
            static_cast<float>(E4m3Value(r[i])) * ReadF32(r + 512 + 4 * (i / 128));
        v[i] = RoundF32ToBf16(product);
      }
      for (int i = 0; i < 64; ++i) v[512 + i] = Bf16Value(ReadU16(r + 528 + 2 * i));
      break;
    }
    case KvFormat::kFp8Dsv4: {
      const uint8_t* r = pg + row * 576;
      const uint8_t* s = pg + int64_t{c.rows_per_page} * 576 + row * 8;
      for (int i = 0; i < 448; ++i) v[i] = E4m3Value(r[i]) * std::ldexp(1.0, s[i / 64] - 127);
      for (int i = 0; i < 64; ++i) v[448 + i] = Bf16Value(ReadU16(r + 448 + 2 * i));
      break;
    }
  }
  return v;
}

void QuantiseRow(KvFormat format, Geometry geometry, const uint16_t* values, float tensor_scale,
                 std::vector<uint8_t>& data, std::vector<uint8_t>& scales) {
  const int w = Width(geometry);
  scales.assign(8, 0);
  auto put_u16 = [&](size_t at, uint16_t b) {
    data[at] = static_cast<uint8_t>(b & 0xff);
    data[at + 1] = static_cast<uint8_t>(b >> 8);
  };
  switch (format) {
    case KvFormat::kBf16:
      data.assign(2 * w, 0);
      for (int i = 0; i < w; ++i) put_u16(2 * i, values[i]);
      return;
    case KvFormat::kFp8PerTensor:
      data.assign(w, 0);
      for (int i = 0; i < w; ++i) {
        float f = static_cast<float>(Bf16Value(values[i])) / tensor_scale;  // IEEE f32 division
        f = std::fmin(std::fmax(f, -448.0f), 448.0f);
        data[i] = E4m3Nearest(f);
      }
      return;
    case KvFormat::kFp8DsMla:
    case KvFormat::kFp8Dsv4: {
      const bool dsv4 = format == KvFormat::kFp8Dsv4;
      const int group = dsv4 ? 64 : 128;
      const int groups = dsv4 ? 7 : 4;
      data.assign(dsv4 ? 576 : 656, 0);
      for (int g = 0; g < groups; ++g) {
        float amax = 1e-4f;
        for (int i = 0; i < group; ++i) {
          amax = std::fmax(amax, static_cast<float>(std::fabs(Bf16Value(values[g * group + i]))));
        }
        const int e = CeilLog2Over448(amax);
        for (int i = 0; i < group; ++i) {
          double x = Bf16Value(values[g * group + i]) * std::ldexp(1.0, -e);
          x = std::fmin(std::fmax(x, -448.0), 448.0);
          data[g * group + i] = E4m3Nearest(x);
        }
        if (dsv4) {
          scales[g] = static_cast<uint8_t>(std::min(254, std::max(0, e + 127)));
        } else {
          const float s = std::ldexp(1.0f, e);
          std::memcpy(&data[512 + 4 * g], &s, 4);
        }
      }
      const int rope_at = dsv4 ? 448 : 528;
      const int first_rope = dsv4 ? 448 : 512;
      for (int i = 0; i < 64; ++i) put_u16(rope_at + 2 * i, values[first_rope + i]);
      return;
    }
  }
}

Output Attend(const Input& in) {
  const int w = Width(in.geometry);
  const int T = in.num_rows;
  const int H = in.num_heads;
  Output o;
  o.out.assign(static_cast<size_t>(T) * H * 512, 0.0);
  o.lse.assign(static_cast<size_t>(T) * H, 0.0);
  o.empty.assign(T, true);
  std::unordered_map<int64_t, std::vector<double>> rows[2];
  const Segment* segs[2] = {&in.main, &in.extra};
  const int num_segs = in.has_extra ? 2 : 1;
  for (int t = 0; t < T; ++t) {
    std::vector<const std::vector<double>*> keys;
    for (int s = 0; s < num_segs; ++s) {
      const Segment& seg = *segs[s];
      for (int j = seg.indptr[t]; j < seg.indptr[t + 1]; ++j) {
        const int64_t id = seg.indices[j];
        if (id < 0) continue;  // sentinel: no key
        auto it = rows[s].find(id);
        if (it == rows[s].end()) it = rows[s].emplace(id, DequantRow(seg.cache, id)).first;
        keys.push_back(&it->second);
      }
    }
    o.empty[t] = keys.empty();
    for (int h = 0; h < H; ++h) {
      const double* q = &in.q[(static_cast<size_t>(t) * H + h) * w];
      std::vector<double> s(keys.size());
      double m = -std::numeric_limits<double>::infinity();
      for (size_t j = 0; j < keys.size(); ++j) {
        double dot = 0.0;
        for (int i = 0; i < w; ++i) dot += q[i] * (*keys[j])[i];
        s[j] = in.softmax_scale * dot;
        m = std::max(m, s[j]);
      }
      const bool has_sink = !in.sink.empty();
      if (has_sink) m = std::max(m, in.sink[h]);
      double* out = &o.out[(static_cast<size_t>(t) * H + h) * 512];
      double& lse = o.lse[static_cast<size_t>(t) * H + h];
      if (keys.empty()) {
        lse = has_sink ? in.sink[h] : -std::numeric_limits<double>::infinity();
        continue;
      }
      double z = has_sink ? std::exp(in.sink[h] - m) : 0.0;
      for (size_t j = 0; j < keys.size(); ++j) {
        const double p = std::exp(s[j] - m);
        z += p;
        for (int i = 0; i < 512; ++i) out[i] += p * (*keys[j])[i];
      }
      for (int i = 0; i < 512; ++i) out[i] /= z;
      lse = m + std::log(z);
    }
  }
  return o;
}

void InverseRope(double* x, const float* cs) {
  for (int k = 0; k < 32; ++k) {
    const double e = x[448 + 2 * k];
    const double od = x[449 + 2 * k];
    const double c = cs[k];
    const double s = cs[32 + k];
    x[448 + 2 * k] = e * c + od * s;
    x[449 + 2 * k] = od * c - e * s;
  }
}

void Mxfp8Reference(const float* x, const float* cs, uint8_t* codes, uint8_t* scales,
                    bool rope_scale_loose[2], float* rotated) {
  float y[512];
  for (int i = 0; i < 512; ++i) y[i] = x[i];
  if (cs != nullptr) {
    for (int k = 0; k < 32; ++k) {
      const float e = y[448 + 2 * k];
      const float od = y[449 + 2 * k];
      const float p1 = e * cs[k];
      const float p2 = od * cs[32 + k];
      const float p3 = od * cs[k];
      const float p4 = e * cs[32 + k];
      y[448 + 2 * k] = p1 + p2;
      y[449 + 2 * k] = p3 - p4;
    }
  }
  if (rotated != nullptr) std::memcpy(rotated, y, sizeof(y));
  for (int g = 0; g < 16; ++g) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(y[g * 32 + i]));
    const double a = std::max<double>(amax, std::ldexp(1.0, -126));
    const int e = std::min(254, std::max(0, CeilLog2Over448(a) + 127));
    scales[g] = static_cast<uint8_t>(e);
    for (int i = 0; i < 32; ++i) {
      codes[g * 32 + i] =
          E4m3Nearest(static_cast<double>(y[g * 32 + i]) * std::ldexp(1.0, 127 - e));
    }
    if (g >= 14) {
      const double r = a / 448.0;
      const double p = std::ldexp(1.0, static_cast<int>(std::lround(std::log2(r))));
      rope_scale_loose[g - 14] = std::fabs(r - p) <= 2.0 * std::ldexp(p, -23);
    }
  }
}

}  // namespace smla::oracle

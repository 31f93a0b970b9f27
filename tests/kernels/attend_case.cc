#include "attend_case.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "smla/base/status_macros.h"
#include "smla/kernels/codec/row_codec.h"

namespace smla::testing {
namespace {

using kernels::AttendParams;
using kernels::CacheView;
using kernels::QkWidth;

constexpr int32_t kPositions = 97;
constexpr int32_t kSentinels[] = {-1, -2, std::numeric_limits<int32_t>::min()};

}  // namespace

AttendCase::AttendCase(Backend& backend, const CaseSpec& spec)
    : backend_(backend), spec_(spec), rng_state_(spec.seed) {
  status_ = Build();
}

absl::Status AttendCase::BuildSegment(const SegmentSpec& s, int index) {
  std::mt19937_64 rng(rng_state_ * 7919 + index);
  std::normal_distribution<double> normal(0.0, 1.0);
  Pool& pool = pools_[index];
  const Geometry g = spec_.geometry;
  const int w = QkWidth(g);
  CacheView& v = pool.view;
  v.format = s.format;
  v.geometry = g;
  v.num_pages = s.num_pages;
  v.rows_per_page = s.rows_per_page;
  v.pitch_bytes = kernels::ServingPitch(s.format, g, s.rows_per_page);
  v.scale = s.scale;
  const int64_t bytes = v.num_pages * v.pitch_bytes;
  absl::StatusOr<kernels::Buffer> buf = backend_.Allocate(bytes);
  if (!buf.ok()) return buf.status();
  pool.buffer = std::move(*buf);
  v.base = pool.buffer.data();
  // Garbage everywhere first: slots no index names hold NaN patterns.
  SMLA_RETURN_IF_ERROR(backend_.Fill(pool.buffer.data(), 0xff, bytes, *stream_));

  const int64_t slots = v.num_slots();
  std::vector<int64_t> written;
  std::bernoulli_distribution half(0.5);
  for (int64_t i = 0; i < slots; ++i) {
    if (half(rng)) written.push_back(i);
  }
  if (written.empty()) written.push_back(0);
  std::shuffle(written.begin(), written.end(), rng);

  std::vector<uint16_t> rows(written.size() * w);
  for (uint16_t& b : rows) {
    b = oracle::Bf16Bits(static_cast<float>(normal(rng) * spec_.value_scale));
  }
  if (s.raw_ds_mla_scales) {
    // Another writer's convention: f32 scale amax/448 as is (rarely a power of two).
    std::vector<uint8_t> host(bytes);
    SMLA_RETURN_IF_ERROR(backend_.CopyToHost(host.data(), pool.buffer.data(), bytes, *stream_));
    for (size_t r = 0; r < written.size(); ++r) {
      const int64_t slot = written[r];
      uint8_t* dst =
          host.data() + (slot / v.rows_per_page) * v.pitch_bytes + (slot % v.rows_per_page) * 656;
      const uint16_t* x = &rows[r * w];
      for (int gi = 0; gi < 4; ++gi) {
        float amax = 0.0f;
        for (int i = 0; i < 128; ++i) {
          amax = std::max(amax, static_cast<float>(std::fabs(oracle::Bf16Value(x[gi * 128 + i]))));
        }
        const float scale = std::max(amax, 1e-4f) / 448.0f;
        for (int i = 0; i < 128; ++i) {
          float q = static_cast<float>(oracle::Bf16Value(x[gi * 128 + i])) / scale;
          q = std::min(448.0f, std::max(-448.0f, q));
          dst[gi * 128 + i] = oracle::E4m3Nearest(q);
        }
        std::memcpy(dst + 512 + 4 * gi, &scale, 4);
      }
      std::memcpy(dst + 528, x + 512, 128);
    }
    SMLA_RETURN_IF_ERROR(backend_.CopyToDevice(pool.buffer.data(), host.data(), bytes, *stream_));
  } else {
    absl::StatusOr<kernels::Buffer> dev_rows = backend_.Allocate(rows.size() * 2);
    if (!dev_rows.ok()) return dev_rows.status();
    SMLA_RETURN_IF_ERROR(
        backend_.CopyToDevice(dev_rows->data(), rows.data(), rows.size() * 2, *stream_));
    kernels::WriteRowsParams wp;
    wp.cache = {pool.buffer.data(), v.format,      v.geometry, v.num_pages,
                v.rows_per_page,    v.pitch_bytes, v.scale};
    wp.slots = written;
    wp.rows = dev_rows->data();
    SMLA_RETURN_IF_ERROR(backend_.WriteRows(wp, *stream_));
    SMLA_RETURN_IF_ERROR(backend_.Synchronize(*stream_));
  }
  pool.host.resize(bytes);
  SMLA_RETURN_IF_ERROR(backend_.CopyToHost(pool.host.data(), pool.buffer.data(), bytes, *stream_));
  SMLA_RETURN_IF_ERROR(backend_.Synchronize(*stream_));

  // CSR: random written slots, with the requested sentinels and duplicates.
  if (s.lengths.size() != static_cast<size_t>(spec_.num_rows)) {
    return absl::InvalidArgumentError("test spec: lengths must have T entries");
  }
  std::uniform_int_distribution<size_t> pick(0, written.size() - 1);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  pool.indptr.assign(1, 0);
  int sentinel_turn = 0;
  for (int32_t t = 0; t < spec_.num_rows; ++t) {
    const size_t row_begin = pool.indices.size();
    for (int32_t e = 0; e < s.lengths[t]; ++e) {
      int32_t id;
      if (e < s.leading_sentinels || (s.every_other_sentinel && e % 2 == 1)) {
        id = kSentinels[sentinel_turn++ % 3];
      } else if (s.duplicates && e > 0 && unit(rng) < 0.2) {
        const size_t from = row_begin + static_cast<size_t>(unit(rng) * e);
        id =
            pool.indices[from] >= 0 ? pool.indices[from] : static_cast<int32_t>(written[pick(rng)]);
      } else {
        id = static_cast<int32_t>(written[pick(rng)]);
      }
      pool.indices.push_back(id);
    }
    pool.indptr.push_back(static_cast<int32_t>(pool.indices.size()));
  }
  return absl::OkStatus();
}

absl::Status AttendCase::Build() {
  absl::StatusOr<std::unique_ptr<kernels::Stream>> stream = backend_.CreateStream();
  if (!stream.ok()) return stream.status();
  stream_ = std::move(*stream);
  SMLA_RETURN_IF_ERROR(BuildSegment(spec_.main, 0));
  if (spec_.has_extra) SMLA_RETURN_IF_ERROR(BuildSegment(spec_.extra, 1));

  std::mt19937_64 rng(rng_state_ * 104729 + 17);
  std::normal_distribution<double> normal(0.0, 1.0);
  const int w = QkWidth(spec_.geometry);
  const int64_t T = spec_.num_rows;
  const int64_t H = spec_.num_heads;
  const size_t qn = static_cast<size_t>(T * H * w);
  q_values_.resize(qn);
  if (spec_.q_type == QType::kBf16) {
    std::vector<uint16_t> q(qn);
    for (size_t i = 0; i < qn; ++i) {
      q[i] = oracle::Bf16Bits(static_cast<float>(normal(rng) * spec_.q_value_scale));
      q_values_[i] = oracle::Bf16Value(q[i]);
    }
    absl::StatusOr<kernels::Buffer> b = backend_.Allocate(qn * 2);
    if (!b.ok()) return b.status();
    q_ = std::move(*b);
    SMLA_RETURN_IF_ERROR(backend_.CopyToDevice(q_.data(), q.data(), qn * 2, *stream_));
  } else {
    std::vector<uint8_t> q(qn);
    for (size_t i = 0; i < qn; ++i) {
      q[i] = oracle::E4m3Nearest(normal(rng) * 8.0);
      q_values_[i] = oracle::E4m3Value(q[i]) * static_cast<double>(spec_.q_scale);
    }
    absl::StatusOr<kernels::Buffer> b = backend_.Allocate(qn);
    if (!b.ok()) return b.status();
    q_ = std::move(*b);
    SMLA_RETURN_IF_ERROR(backend_.CopyToDevice(q_.data(), q.data(), qn, *stream_));
  }
  if (spec_.sink) {
    std::uniform_real_distribution<float> u(-2.0f, 4.0f);
    for (int64_t h = 0; h < H; ++h) sink_.push_back(u(rng));
  }
  cos_sin_host_.resize(kPositions * 64);
  for (int p = 0; p < kPositions; ++p) {
    for (int k = 0; k < 32; ++k) {
      const double theta = p * std::pow(10000.0, -k / 32.0);
      cos_sin_host_[p * 64 + k] = static_cast<float>(std::cos(theta));
      cos_sin_host_[p * 64 + 32 + k] = static_cast<float>(std::sin(theta));
    }
  }
  absl::StatusOr<kernels::Buffer> cs = backend_.Allocate(cos_sin_host_.size() * 4);
  if (!cs.ok()) return cs.status();
  cos_sin_ = std::move(*cs);
  SMLA_RETURN_IF_ERROR(backend_.CopyToDevice(cos_sin_.data(), cos_sin_host_.data(),
                                             cos_sin_host_.size() * 4, *stream_));
  std::uniform_int_distribution<int32_t> pos(0, kPositions - 1);
  for (int64_t t = 0; t < T; ++t) positions_.push_back(pos(rng));

  const size_t th = static_cast<size_t>(T * H);
  for (auto [buf, bytes] : {std::pair{&out_bf16_, th * 512 * 2}, std::pair{&out_mx_data_, th * 512},
                            std::pair{&out_mx_scales_, th * 16}, std::pair{&out_lse_, th * 4}}) {
    absl::StatusOr<kernels::Buffer> b = backend_.Allocate(std::max<size_t>(bytes, 1));
    if (!b.ok()) return b.status();
    *buf = std::move(*b);
  }
  return absl::OkStatus();
}

AttendParams AttendCase::Params(const RunOptions& o) {
  AttendParams p;
  p.num_rows = spec_.num_rows;
  p.num_heads = spec_.num_heads;
  p.geometry = spec_.geometry;
  p.q = q_.data();
  p.q_type = spec_.q_type;
  p.q_scale = spec_.q_scale;
  p.softmax_scale = spec_.softmax_scale;
  p.main = {pools_[0].view, pools_[0].indptr, pools_[0].indices};
  p.has_extra = spec_.has_extra;
  if (spec_.has_extra) p.extra = {pools_[1].view, pools_[1].indptr, pools_[1].indices};
  p.sink = sink_;
  if (o.positions) {
    p.epilogue.positions = positions_;
    p.epilogue.cos_sin = cos_sin_.as<float>();
    p.epilogue.num_positions = kPositions;
  }
  p.out.format = o.format;
  p.out.bf16 = out_bf16_.data();
  p.out.mx_data = out_mx_data_.as<uint8_t>();
  p.out.mx_scales = out_mx_scales_.as<uint8_t>();
  p.out.lse = o.lse ? out_lse_.as<float>() : nullptr;
  p.force_splits = o.force_splits;
  p.force_head_block = o.force_head_block;
  return p;
}

absl::StatusOr<RunResult> AttendCase::Run(const RunOptions& o) {
  if (!status_.ok()) return status_;
  for (kernels::Buffer* b : {&out_bf16_, &out_mx_data_, &out_mx_scales_, &out_lse_}) {
    SMLA_RETURN_IF_ERROR(backend_.Fill(b->data(), 0xff, b->size(), *stream_));
  }
  SMLA_RETURN_IF_ERROR(backend_.Attend(Params(o), *stream_));
  SMLA_RETURN_IF_ERROR(backend_.Synchronize(*stream_));
  const size_t th = static_cast<size_t>(spec_.num_rows) * spec_.num_heads;
  RunResult r;
  if (o.format == OutputFormat::kBf16) {
    r.bf16.resize(th * 512);
    SMLA_RETURN_IF_ERROR(backend_.CopyToHost(r.bf16.data(), out_bf16_.data(), th * 1024, *stream_));
  } else {
    r.mx_data.resize(th * 512);
    r.mx_scales.resize(th * 16);
    SMLA_RETURN_IF_ERROR(
        backend_.CopyToHost(r.mx_data.data(), out_mx_data_.data(), th * 512, *stream_));
    SMLA_RETURN_IF_ERROR(
        backend_.CopyToHost(r.mx_scales.data(), out_mx_scales_.data(), th * 16, *stream_));
  }
  r.lse.resize(th);
  SMLA_RETURN_IF_ERROR(backend_.CopyToHost(r.lse.data(), out_lse_.data(), th * 4, *stream_));
  SMLA_RETURN_IF_ERROR(backend_.Synchronize(*stream_));
  return r;
}

oracle::Input AttendCase::OracleInput() const {
  oracle::Input in;
  in.num_rows = spec_.num_rows;
  in.num_heads = spec_.num_heads;
  in.geometry = spec_.geometry;
  in.q = q_values_;
  in.softmax_scale = spec_.softmax_scale;
  const int n = spec_.has_extra ? 2 : 1;
  oracle::Segment* segs[2] = {&in.main, &in.extra};
  for (int s = 0; s < n; ++s) {
    const Pool& p = pools_[s];
    segs[s]->cache = {p.host.data(),        p.view.format,      p.view.geometry,
                      p.view.rows_per_page, p.view.pitch_bytes, p.view.scale};
    segs[s]->indptr = p.indptr;
    segs[s]->indices = p.indices;
  }
  in.has_extra = spec_.has_extra;
  for (float s : sink_) in.sink.push_back(s);
  return in;
}

double CheckBf16AgainstOracle(const CaseSpec& spec, const RunResult& r, const oracle::Output& ref,
                              double tolerance, bool check_lse, const AttendCase* rope_case) {
  const int T = spec.num_rows;
  const int H = spec.num_heads;
  double worst = 0.0;
  int failures = 0;
  auto fail = [&](const std::string& what) {
    if (++failures <= 5) ADD_FAILURE() << what;
  };
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < H; ++h) {
      const size_t th = static_cast<size_t>(t) * H + h;
      const uint16_t* out = &r.bf16[th * 512];
      double x[512];
      std::copy_n(&ref.out[th * 512], 512, x);
      if (rope_case != nullptr) oracle::InverseRope(x, rope_case->CosSinRow(t));
      if (ref.empty[t]) {
        for (int i = 0; i < 512; ++i) {
          if (out[i] != 0) {
            fail(absl::StrFormat("row %d head %d: empty row lane %d is 0x%04x, not +0", t, h, i,
                                 out[i]));
            break;
          }
        }
      } else {
        double max_ref = 0.0, max_err = 0.0;
        for (int i = 0; i < 512; ++i) {
          const double rv = oracle::RoundF32ToBf16(static_cast<float>(x[i]));
          const double ov = oracle::Bf16Value(out[i]);
          max_ref = std::max(max_ref, std::fabs(rv));
          const double err = std::fabs(ov - rv);
          max_err =
              std::isnan(ov) ? std::numeric_limits<double>::infinity() : std::max(max_err, err);
        }
        const double rel = max_ref > 0 ? max_err / max_ref : max_err;
        worst = std::max(worst, rel);
        if (!(max_err <= tolerance * max_ref)) {
          fail(absl::StrFormat("row %d head %d: max|out-ref| = %g > %g * max|ref| (%g)", t, h,
                               max_err, tolerance, max_ref));
        }
      }
      if (check_lse) {
        const double want = ref.lse[th];
        const float got = r.lse[th];
        if (std::isinf(want)) {
          if (!(std::isinf(got) && got < 0)) {
            fail(absl::StrFormat("row %d head %d: lse %g, want -inf", t, h, got));
          }
        } else if (!(std::fabs(got - want) <= 2e-2 * std::max(1.0, std::fabs(want)))) {
          fail(absl::StrFormat("row %d head %d: lse %g, want %g", t, h, got, want));
        }
      }
    }
  }
  EXPECT_EQ(failures, 0) << "vectors out of tolerance (first 5 reported above)";
  return worst;
}

namespace {
int Ordinal(uint8_t c) { return (c & 0x80) ? -(c & 0x7f) : (c & 0x7f); }
}  // namespace

void CheckMxfp8(const CaseSpec& spec, const RunResult& plain, const RunResult& mx,
                const AttendCase* rope_case) {
  const int T = spec.num_rows;
  const int H = spec.num_heads;
  int failures = 0;
  int loose_used = 0;
  auto fail = [&](const std::string& what) {
    if (++failures <= 5) ADD_FAILURE() << what;
  };
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < H; ++h) {
      const size_t th = static_cast<size_t>(t) * H + h;
      float x[512];
      for (int i = 0; i < 512; ++i)
        x[i] = static_cast<float>(oracle::Bf16Value(plain.bf16[th * 512 + i]));
      uint8_t codes[512], scales[16];
      bool loose[2];
      float rotated[512];
      oracle::Mxfp8Reference(x, rope_case ? rope_case->CosSinRow(t) : nullptr, codes, scales, loose,
                             rotated);
      const uint8_t* got_codes = &mx.mx_data[th * 512];
      const uint8_t* got_scales = &mx.mx_scales[th * 16];
      for (int g = 0; g < 16; ++g) {
        const uint8_t sb = got_scales[g];
        if (sb != scales[g]) {
          const bool allowed = g >= 14 && loose[g - 14] && std::abs(sb - scales[g]) <= 1;
          if (!allowed) {
            fail(absl::StrFormat("row %d head %d group %d: scale byte %d, want %d", t, h, g, sb,
                                 scales[g]));
            continue;
          }
          ++loose_used;
        }
        for (int i = g * 32; i < g * 32 + 32; ++i) {
          const uint8_t want = sb == scales[g]
                                   ? codes[i]
                                   : oracle::E4m3Nearest(static_cast<double>(rotated[i]) *
                                                         std::ldexp(1.0, 127 - sb));
          const uint8_t got = got_codes[i];
          if ((got & 0x7f) == 0x7f || std::abs(Ordinal(got) - Ordinal(want)) > 1) {
            fail(absl::StrFormat("row %d head %d lane %d: code 0x%02x, want 0x%02x (scale %d)", t,
                                 h, i, got, want, sb));
            break;
          }
        }
      }
    }
  }
  EXPECT_EQ(failures, 0) << "MXFP8 mismatches (first 5 reported above)";
  if (loose_used > 0)
    std::printf("  mxfp8: %d rope-group scale bytes at a power-of-two edge\n", loose_used);
}

}  // namespace smla::testing

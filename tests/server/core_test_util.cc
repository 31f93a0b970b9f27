#include "core_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <future>
#include <numeric>

#include "smla/kernels/codec/bf16.h"
#include "smla/server/step_validation.h"

namespace smla::server::testing {
namespace {

std::vector<uint16_t> RandomBf16(std::mt19937& rng, size_t n) {
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<uint16_t> out(n);
  for (uint16_t& v : out) v = kernels::F32ToBf16Bits(d(rng));
  return out;
}

template <typename T>
std::span<const uint8_t> Bytes(const std::vector<T>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T)};
}

absl::StatusOr<kernels::Buffer> Upload(kernels::Backend& b, kernels::Stream& s, const void* src,
                                       size_t bytes) {
  absl::StatusOr<kernels::Buffer> buf = b.Allocate(std::max<size_t>(bytes, 16));
  if (!buf.ok()) return buf.status();
  if (bytes > 0) {
    absl::Status st = b.CopyToDevice(buf->data(), src, bytes, s);
    if (!st.ok()) return st;
  }
  return buf;
}

}  // namespace

SpanInput SpanData::View() const {
  SpanInput s;
  s.sequence_id = sequence;
  s.first_position = first;
  s.num_rows = rows;
  s.kv_rows = Bytes(kv);
  s.compressed_rows = Bytes(compressed);
  s.q = Bytes(q);
  s.topk = topk;
  s.topk_width = topk_width;
  return s;
}

SpanData MakeSpan(std::mt19937& rng, const ModelProfile& profile, int32_t layer, int32_t heads,
                  const std::string& sequence, int64_t first, int32_t rows, int32_t topk_width) {
  const LayerSpec& spec = profile.layers[layer];
  const int qk = kernels::QkWidth(profile.geometry);
  SpanData s;
  s.sequence = sequence;
  s.first = first;
  s.rows = rows;
  s.kv = RandomBf16(rng, size_t{static_cast<size_t>(rows)} * qk);
  if (spec.has_compressed()) {
    s.compressed = RandomBf16(rng, CompressedEntriesAdded(first, rows, spec.ratio) * qk);
  }
  s.q = RandomBf16(rng, size_t{static_cast<size_t>(rows)} * heads * qk);
  if (spec.client_chooses()) {
    s.topk_width = topk_width;
    for (int32_t t = 0; t < rows; ++t) {
      const int64_t p = first + t;
      const int64_t visible = spec.kind == LayerKind::kSwaTopK ? (p + 1) / spec.ratio : p + 1;
      std::vector<int32_t> pick;
      if (visible <= 4 * topk_width) {
        std::vector<int32_t> all(visible);
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), rng);
        all.resize(std::min<int64_t>(visible, topk_width));
        pick = all;
      } else {
        std::uniform_int_distribution<int64_t> d(0, visible - 1);
        while (static_cast<int32_t>(pick.size()) < topk_width) {
          const int32_t e = static_cast<int32_t>(d(rng));
          if (std::find(pick.begin(), pick.end(), e) == pick.end()) pick.push_back(e);
        }
      }
      pick.resize(topk_width, -1);
      if (topk_width > 2 && t % 2 == 1) pick[t % topk_width] = -1;  // sentinels inside too
      std::shuffle(pick.begin(), pick.end(), rng);
      s.topk.insert(s.topk.end(), pick.begin(), pick.end());
    }
  }
  return s;
}

void Apply(HostLayer& host, const SpanData& span, const LayerSpec& spec) {
  const size_t width = span.kv.size() / span.rows;
  host.rows.erase(host.rows.lower_bound(span.first), host.rows.end());
  for (int32_t t = 0; t < span.rows; ++t) {
    host.rows[span.first + t] =
        std::vector<uint16_t>(span.kv.begin() + t * width, span.kv.begin() + (t + 1) * width);
  }
  if (spec.has_compressed()) {
    const int64_t e0 = span.first / spec.ratio;
    host.compressed.erase(host.compressed.lower_bound(e0), host.compressed.end());
    const int64_t n = static_cast<int64_t>(span.compressed.size() / width);
    for (int64_t e = 0; e < n; ++e) {
      host.compressed[e0 + e] = std::vector<uint16_t>(span.compressed.begin() + e * width,
                                                      span.compressed.begin() + (e + 1) * width);
    }
  }
}

RopeTable MakeRope(int32_t positions) {
  RopeTable r;
  r.positions = positions;
  r.cos_sin.resize(size_t{static_cast<size_t>(positions)} * 64);
  for (int32_t p = 0; p < positions; ++p) {
    for (int k = 0; k < 32; ++k) {
      const double theta = p * std::pow(10000.0, -2.0 * k / 64.0);
      r.cos_sin[p * 64 + k] = static_cast<float>(std::cos(theta));
      r.cos_sin[p * 64 + 32 + k] = static_cast<float>(std::sin(theta));
    }
  }
  return r;
}

absl::StatusOr<StepResult> Reference(kernels::Backend& b, const ModelConfig& config, int32_t layer,
                                     const HostLayer& host, const SpanData& span,
                                     const ReferenceOptions& o) {
  const ModelProfile& profile = *FindProfile(config.profile);
  const LayerSpec& spec = profile.layers[layer];
  const int32_t H = config.heads_per_rank;
  const int32_t T = span.rows;

  // Gather the keys each row reads into a fresh pool, one row per page, by hand.
  std::vector<const std::vector<uint16_t>*> keys;
  std::map<std::pair<bool, int64_t>, int32_t> slot_of;
  auto slot = [&](bool compressed, int64_t id) -> int32_t {
    auto [it, inserted] = slot_of.emplace(std::make_pair(compressed, id), keys.size());
    if (inserted) keys.push_back(compressed ? &host.compressed.at(id) : &host.rows.at(id));
    return it->second;
  };
  std::vector<int32_t> main_indptr{0}, main_idx, extra_indptr{0}, extra_idx, positions;
  for (int32_t t = 0; t < T; ++t) {
    const int64_t p = span.first + t;
    if (spec.has_window()) {
      for (int64_t k = std::max<int64_t>(0, p - profile.swa_window + 1); k <= p; ++k) {
        main_idx.push_back(slot(false, k));
      }
    } else {
      for (int32_t k = 0; k < span.topk_width; ++k) {
        const int32_t e = span.topk[t * span.topk_width + k];
        main_idx.push_back(e < 0 ? -1 : slot(false, e));
      }
    }
    main_indptr.push_back(static_cast<int32_t>(main_idx.size()));
    if (spec.kind == LayerKind::kSwaTopK) {
      for (int32_t k = 0; k < span.topk_width; ++k) {
        const int32_t e = span.topk[t * span.topk_width + k];
        extra_idx.push_back(e < 0 ? -1 : slot(true, e));
      }
    } else if (spec.kind == LayerKind::kSwaDense) {
      for (int64_t e = 0; e < (p + 1) / spec.ratio; ++e) extra_idx.push_back(slot(true, e));
    }
    extra_indptr.push_back(static_cast<int32_t>(extra_idx.size()));
    positions.push_back(static_cast<int32_t>(p));
  }

  absl::StatusOr<std::unique_ptr<kernels::Stream>> stream = b.CreateStream();
  if (!stream.ok()) return stream.status();
  kernels::Stream& s = **stream;
  const int64_t pitch = kernels::ServingPitch(config.kv_format, profile.geometry, 1);
  const int64_t pages = std::max<int64_t>(1, static_cast<int64_t>(keys.size()));
  absl::StatusOr<kernels::Buffer> pool = b.Allocate(pages * pitch);
  if (!pool.ok()) return pool.status();
  std::vector<uint16_t> rows;
  for (const auto* k : keys) rows.insert(rows.end(), k->begin(), k->end());
  absl::StatusOr<kernels::Buffer> rows_dev = Upload(b, s, rows.data(), rows.size() * 2);
  if (!rows_dev.ok()) return rows_dev.status();
  kernels::MutableCacheView cache{
      pool->data(),
      config.kv_format,
      profile.geometry,
      pages,
      1,
      pitch,
      config.kv_format == kernels::KvFormat::kFp8PerTensor ? config.kv_scale : 1.0f};
  std::vector<int64_t> slots(keys.size());
  std::iota(slots.begin(), slots.end(), 0);
  if (!keys.empty()) {
    kernels::WriteRowsParams wp;
    wp.cache = cache;
    wp.slots = slots;
    wp.rows = rows_dev->data();
    absl::Status st = b.WriteRows(wp, s);
    if (!st.ok()) return st;
  }
  absl::StatusOr<kernels::Buffer> q = Upload(b, s, span.q.data(), span.q.size() * 2);
  if (!q.ok()) return q.status();
  absl::StatusOr<kernels::Buffer> rope;
  if (o.rope != nullptr) {
    rope = Upload(b, s, o.rope->cos_sin.data(), o.rope->cos_sin.size() * 4);
    if (!rope.ok()) return rope.status();
  }
  const bool bf16 = o.format == kernels::OutputFormat::kBf16;
  const size_t out_bytes = size_t{static_cast<size_t>(T)} * H * 512 * (bf16 ? 2 : 1);
  const size_t scale_bytes = size_t{static_cast<size_t>(T)} * H * 16;
  absl::StatusOr<kernels::Buffer> out = b.Allocate(out_bytes);
  absl::StatusOr<kernels::Buffer> scales = b.Allocate(scale_bytes);
  absl::StatusOr<kernels::Buffer> lse = b.Allocate(size_t{static_cast<size_t>(T)} * H * 4);
  if (!out.ok() || !scales.ok() || !lse.ok()) return absl::InternalError("allocation failed");

  kernels::AttendParams a;
  a.num_rows = T;
  a.num_heads = H;
  a.geometry = profile.geometry;
  a.q = q->data();
  a.softmax_scale = config.softmax_scale;
  a.main = {cache.view(), main_indptr, main_idx};
  a.has_extra = spec.has_compressed();
  if (a.has_extra) a.extra = {cache.view(), extra_indptr, extra_idx};
  a.sink = o.sink;
  if (o.rope != nullptr) {
    a.epilogue.positions = positions;
    a.epilogue.cos_sin = rope->as<const float>();
    a.epilogue.num_positions = o.rope->positions;
  }
  a.out.format = o.format;
  if (bf16) {
    a.out.bf16 = out->data();
  } else {
    a.out.mx_data = out->as<uint8_t>();
    a.out.mx_scales = scales->as<uint8_t>();
  }
  a.out.lse = o.want_lse ? lse->as<float>() : nullptr;
  absl::Status st = b.Attend(a, s);
  if (!st.ok()) return st;

  StepResult r;
  r.num_rows = T;
  r.num_heads = H;
  r.output_format = o.format;
  r.out.resize(out_bytes);
  st = b.CopyToHost(r.out.data(), out->data(), out_bytes, s);
  if (st.ok() && !bf16) {
    r.mx_scales.resize(scale_bytes);
    st = b.CopyToHost(r.mx_scales.data(), scales->data(), scale_bytes, s);
  }
  if (st.ok() && o.want_lse) {
    r.lse.resize(size_t{static_cast<size_t>(T)} * H);
    st = b.CopyToHost(r.lse.data(), lse->data(), r.lse.size() * 4, s);
  }
  if (st.ok()) st = b.Synchronize(s);
  if (!st.ok()) return st;
  return r;
}

absl::StatusOr<StepResult> RunStep(ServiceCore& core, StepRequest request) {
  std::promise<absl::StatusOr<StepResult>> promise;
  std::future<absl::StatusOr<StepResult>> future = promise.get_future();
  core.Submit(std::move(request),
              [&promise](absl::StatusOr<StepResult> r) { promise.set_value(std::move(r)); });
  return future.get();
}

void ControlledBackend::Close() {
  absl::MutexLock lock(&mu_);
  open_ = false;
}

void ControlledBackend::Open() {
  absl::MutexLock lock(&mu_);
  open_ = true;
}

void ControlledBackend::FailAttends(bool fail) {
  absl::MutexLock lock(&mu_);
  fail_ = fail;
}

void ControlledBackend::WaitAttends(int n) {
  absl::MutexLock lock(&mu_);
  auto cond = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return attends_ >= n; };
  mu_.Await(absl::Condition(&cond));
}

absl::Status ControlledBackend::Attend(const kernels::AttendParams& p, kernels::Stream& s) {
  {
    absl::MutexLock lock(&mu_);
    ++attends_;
    mu_.Await(absl::Condition(&open_));
    if (fail_) return absl::InternalError("injected device failure");
  }
  return inner_->Attend(p, s);
}

}  // namespace smla::server::testing

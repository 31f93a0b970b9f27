#include "smla/kernels/cpu_backend.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "cpu/attend.h"
#include "cpu/thread_pool.h"
#include "smla/base/align.h"
#include "smla/kernels/codec/mxfp8_query.h"
#include "smla/kernels/codec/row_codec.h"
#include "smla/kernels/input_checks.h"
#include "smla/kernels/validate.h"

namespace smla::kernels {
namespace {

constexpr size_t kAlignment = 64;
// Below this many rows a WriteRows call is not worth waking the pool for.
constexpr size_t kParallelWriteRows = 256;
// Likewise for the query vectors of an ExpandMxfp8Query call (a decode call's few rows of many
// heads run on one thread).
constexpr int64_t kParallelExpandVectors = 1024;

// Work runs as it is enqueued, so a stream carries no state.
class CpuStream final : public Stream {};

absl::Status CheckCopy(const void* dst, const void* src, size_t bytes) {
  if (bytes > 0 && (dst == nullptr || src == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("copy of %d bytes with a null pointer", bytes));
  }
  return absl::OkStatus();
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) : pool_(threads) {
    info_.kind = BackendKind::kCpu;
    info_.name = absl::StrFormat("cpu (%d threads)", threads);
#if defined(__x86_64__)
    info_.arch = "x86_64";
#elif defined(__aarch64__)
    info_.arch = "aarch64";
#else
    info_.arch = "unknown";
#endif
    info_.compute_units = threads;
    info_.warp_size = 1;
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long page_size = sysconf(_SC_PAGESIZE);
    info_.total_memory = pages > 0 && page_size > 0 ? int64_t{pages} * page_size : 0;
#if defined(_SC_LEVEL2_CACHE_SIZE)
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    info_.l2_bytes = l2 > 0 ? l2 : 0;
#endif
  }

  const DeviceInfo& device() const override { return info_; }

  absl::StatusOr<Buffer> Allocate(size_t bytes) override {
    const size_t rounded = std::max<size_t>(kAlignment, AlignUp(bytes, kAlignment));
    void* p = std::aligned_alloc(kAlignment, rounded);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("cpu backend: cannot allocate %d bytes", bytes));
    }
    return Buffer(p, bytes, [](void* q) { std::free(q); });
  }

  absl::StatusOr<std::unique_ptr<Stream>> CreateStream() override {
    return std::make_unique<CpuStream>();
  }

  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes, Stream&) override {
    if (absl::Status s = CheckCopy(dst, src, bytes); !s.ok()) return s;
    if (bytes > 0) memmove(dst, src, bytes);
    return absl::OkStatus();
  }

  absl::Status CopyToHost(void* dst, const void* src, size_t bytes, Stream&) override {
    if (absl::Status s = CheckCopy(dst, src, bytes); !s.ok()) return s;
    if (bytes > 0) memmove(dst, src, bytes);
    return absl::OkStatus();
  }

  absl::Status Fill(void* dst, uint8_t byte, size_t bytes, Stream&) override {
    if (bytes > 0 && dst == nullptr) return absl::InvalidArgumentError("fill of a null pointer");
    if (bytes > 0) memset(dst, byte, bytes);
    return absl::OkStatus();
  }

  absl::Status WriteRows(const WriteRowsParams& p, Stream&) override {
    if (absl::Status s = ValidateWriteRows(p); !s.ok()) return s;
    const MutableCacheView& c = p.cache;
    const int width = QkWidth(c.geometry);
    const uint16_t* rows = static_cast<const uint16_t*>(p.rows);
    auto write = [&](int64_t i, int) { EncodeInto(c, p.slots[i], rows + i * width); };
    const int64_t n = static_cast<int64_t>(p.slots.size());
    // A slot named twice keeps its last row, which only a sequential write guarantees.
    if (p.slots.size() >= kParallelWriteRows && SlotsDistinct(p.slots)) {
      pool_.ParallelFor(n, write);
    } else {
      for (int64_t i = 0; i < n; ++i) write(i, 0);
    }
    return absl::OkStatus();
  }

  absl::Status ExpandMxfp8Query(const ExpandQueryParams& p, Stream&) override {
    if (absl::Status s = ValidateExpandQuery(p); !s.ok()) return s;
    auto expand = [&](int64_t v, int) {
      const int64_t lanes = p.width;
      DecodeMxfp8Query(p.codes + v * lanes, p.scales + v * (lanes / kMxQueryGroup), lanes,
                       static_cast<uint16_t*>(p.out) + v * lanes);
    };
    if (p.vectors >= kParallelExpandVectors) {
      pool_.ParallelFor(p.vectors, expand);
    } else {
      for (int64_t v = 0; v < p.vectors; ++v) expand(v, 0);
    }
    return absl::OkStatus();
  }

  absl::Status CheckInputs(const CheckInputsParams& p, Stream&) override {
    if (absl::Status s = ValidateCheckInputs(p); !s.ok()) return s;
    for (int32_t r = 0; r < p.num_ranges; ++r) {
      const CheckRange& range = p.ranges[r];
      bool bad = false;
      // Checked on the copy: the bytes are read once, as on the device.
      const uint8_t* data = range.data;
      if (range.copy_to != nullptr && range.bytes > 0) {
        std::memcpy(range.copy_to, range.data, static_cast<size_t>(range.bytes));
        data = range.copy_to;
      }
      if (range.check == InputCheck::kNone) continue;
      if (range.check == InputCheck::kKvRows) {
        for (int64_t i = 0; i + 1 < range.bytes; i += 2) {
          uint16_t bits;
          memcpy(&bits, data + i, 2);
          bad = bad || Bf16OutOfBounds(bits);
        }
      } else {
        for (int64_t i = 0; i < range.bytes; ++i) {
          bad = bad || ByteRefused(range.check, data[i]);
        }
      }
      if (bad) SetFlag(p.flags, range.group, kFlagInputValue);
    }
    const TranslateParams& e = p.entries;
    for (int32_t r = 0; r < e.num_rows; ++r) {
      const TranslateRow& row = e.rows[r];
      bool bad = false;
      for (int32_t k = 0; k < row.width; ++k) {
        // One relaxed load per id: the ids may lie in memory a client can rewrite.
        const int32_t id = __atomic_load_n(row.ids + k, __ATOMIC_RELAXED);
        if (row.seen != nullptr) row.seen[k] = id;
        row.out[k] = TranslateEntry(id, row.blocks, e.page_shift, e.block_shift, row.limit, bad);
      }
      if (bad) SetFlag(p.flags, row.group, kFlagChosenEntry);
    }
    WriteNewRows(p);
    const size_t block = size_t{1} << e.block_shift;
    for (int32_t b = 0; b < e.num_block_writes; ++b) {
      std::memcpy(e.block_writes[b].to, e.block_writes[b].from, block * sizeof(int32_t));
    }
    for (int32_t r = 0; r < e.num_runs; ++r) {
      const PositionRun& run = e.runs[r];
      for (int32_t j = 0; j < run.count; ++j) run.out[j] = RunSlot(run, j, e.page_shift);
    }
    return absl::OkStatus();
  }

  absl::Status Attend(const AttendParams& p, Stream&) override {
    if (absl::Status s = ValidateAttend(p); !s.ok()) return s;
    cpu::RunAttend(p, pool_);
    return absl::OkStatus();
  }

  absl::Status Synchronize(Stream&) override { return absl::OkStatus(); }

 private:
  // Row `in` quantised into `slot` of pool c.
  static void EncodeInto(const MutableCacheView& c, int64_t slot, const uint16_t* in) {
    auto* base = static_cast<uint8_t*>(c.base);
    uint8_t* scales = c.format == KvFormat::kFp8Dsv4
                          ? base + SlotScaleOffset(slot, c.rows_per_page, c.pitch_bytes)
                          : nullptr;
    EncodeRow(c.format, c.geometry, in,
              base + SlotDataOffset(c.format, c.geometry, slot, c.rows_per_page, c.pitch_bytes),
              scales, c.scale);
  }

  // CheckInputsParams::rows, as the device does them: each row read once (into its copy, which
  // is then checked and written), its slot's old bytes saved where asked (`old`), every row
  // written.
  void WriteNewRows(const CheckInputsParams& p) {
    const RowWrites& w = p.rows;
    const MutableCacheView& c = w.cache;
    const int width = QkWidth(c.geometry);
    const int64_t row_bytes = RowBytes(c.format, c.geometry);
    const auto* base = static_cast<const uint8_t*>(c.base);
    auto one = [&](int64_t i, int) {
      const RowWrite& row = w.rows[i];
      uint16_t* copy = w.copies + i * width;
      if (copy != row.from) std::memcpy(copy, row.from, size_t{2} * width);
      bool bad = false;
      for (int k = 0; k < width; ++k) bad = bad || Bf16OutOfBounds(copy[k]);
      if (bad) SetFlag(p.flags, row.group, kFlagInputValue);
      if (row.slot < 0 || row.slot >= c.num_slots()) return;
      if (w.old != nullptr) {
        uint8_t* old = w.old + i * row_bytes;
        SlotPart parts[2];
        const int n =
            SlotParts(c.format, c.geometry, row.slot, c.rows_per_page, c.pitch_bytes, parts);
        for (int part = 0; part < n; ++part) {
          std::memcpy(old, base + parts[part].offset, static_cast<size_t>(parts[part].bytes));
          old += parts[part].bytes;
        }
      }
      EncodeInto(c, row.slot, copy);
    };
    const int64_t n = w.num_rows;
    bool parallel = n >= static_cast<int64_t>(kParallelWriteRows);
    if (parallel) {
      std::vector<int64_t> slots(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) slots[i] = w.rows[i].slot;
      parallel = SlotsDistinct(slots);
    }
    if (parallel) {
      pool_.ParallelFor(n, one);
    } else {
      for (int64_t i = 0; i < n; ++i) one(i, 0);
    }
  }

  static bool SlotsDistinct(std::span<const int64_t> slots) {
    std::vector<int64_t> sorted(slots.begin(), slots.end());
    std::sort(sorted.begin(), sorted.end());
    return std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
  }

  DeviceInfo info_;
  cpu::ThreadPool pool_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const BackendOptions& options) {
  if (options.cpu_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cpu_threads must be >= 0 (got %d)", options.cpu_threads));
  }
  int threads = options.cpu_threads;
  if (threads == 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace smla::kernels

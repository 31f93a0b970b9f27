// The operator's arguments (docs/operator.md section 1): cache views, CSR segments, epilogue and
// outputs. Tensor pointers live in the backend's memory (device memory on GPUs, host memory
// on the CPU backend); CSR arrays, positions and the sink are small host arrays that the
// backend validates and stages itself, so bad ids are rejected before any work (unless the
// caller vouches for them: AttendParams::ids_in_range, and HostMirror for copies it made).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "smla/kernels/formats.h"

namespace smla::kernels {

// Host arrays the caller has already copied to backend memory: a host array inside
// [host, host + bytes) also lies at device + (its address - host), put there by earlier work on the
// same stream and unchanged until the stream is synchronised. A GPU backend reads such an array
// there instead of uploading it (one upload of the caller's, instead of one per call); the host
// copy stays the one that validation and planning read.
struct HostMirror {
  const uint8_t* host = nullptr;
  const uint8_t* device = nullptr;
  size_t bytes = 0;

  // The device copy of `a`, or nullptr when `a` is empty or not wholly inside the mirror.
  template <typename T>
  const T* Find(std::span<const T> a) const {
    const auto* p = reinterpret_cast<const uint8_t*>(a.data());
    if (a.empty() || host == nullptr || p < host || p + a.size_bytes() > host + bytes) {
      return nullptr;
    }
    return reinterpret_cast<const T*>(device + (p - host));
  }
};

// A paged KV cache: slot s is row s % rows_per_page of page s / rows_per_page.
struct CacheView {
  const void* base = nullptr;  // num_pages * pitch_bytes bytes, backend memory
  KvFormat format = KvFormat::kBf16;
  Geometry geometry = Geometry::kRopeInside;
  int64_t num_pages = 0;
  int32_t rows_per_page = 1;  // B: a power of two
  int64_t pitch_bytes = 0;    // >= MinPitch, multiple of 16
  float scale = 1.0f;         // fp8_per_tensor only: dequantised value = code * scale

  int64_t num_slots() const { return num_pages * rows_per_page; }
};

// A mutable view of the same pool, for the row writers.
struct MutableCacheView {
  void* base = nullptr;
  KvFormat format = KvFormat::kBf16;
  Geometry geometry = Geometry::kRopeInside;
  int64_t num_pages = 0;
  int32_t rows_per_page = 1;
  int64_t pitch_bytes = 0;
  float scale = 1.0f;

  CacheView view() const {
    return {base, format, geometry, num_pages, rows_per_page, pitch_bytes, scale};
  }
  int64_t num_slots() const { return num_pages * rows_per_page; }
};

// Row t's keys are indices[indptr[t] .. indptr[t+1]); negative ids are sentinels.
struct Segment {
  CacheView cache;
  std::span<const int32_t> indptr;   // [T+1] host
  std::span<const int32_t> indices;  // [nnz] slot ids: host, or backend memory (below)
  // The indices lie in backend memory, written by earlier work on the same stream (a
  // CheckInputs call): the backend reads them where they are and the host never does, so
  // the call must vouch for them (AttendParams::ids_in_range).
  bool indices_on_device = false;
  // Row t's indices are the slots of one sequence's consecutive positions ending at the row's
  // own (a sliding window), and rows 2i and 2i + 1 of a group (AttendParams::rows_per_group)
  // lie at consecutive positions, so the union of a pair is the longer window plus at most one
  // key. Lets a backend bound a pair's keys without reading indices on the device.
  bool sliding_window = false;
};

struct Epilogue {
  std::span<const int32_t> positions;  // [T] host; empty = no inverse RoPE
  const float* cos_sin = nullptr;  // [num_positions, 64] f32 backend memory: cos 0..31, sin 32..63
  int32_t num_positions = 0;       // P
};

// Backend memory; the data 16-byte aligned (the kernels' widest stores), the LSE 4-byte.
struct OutputView {
  OutputFormat format = OutputFormat::kBf16;
  void* bf16 = nullptr;          // [T, H, 512] bf16, when format == kBf16
  uint8_t* mx_data = nullptr;    // [T, H*512] e4m3, when format == kMxfp8
  uint8_t* mx_scales = nullptr;  // [T, H*16] E8M0, when format == kMxfp8
  float* lse = nullptr;          // [T, H] f32 natural log; may be null
};

// Where the GPU backend pairs rows (AttendParams::row_pairs).
enum class RowPairs : uint8_t {
  // Where it measured faster on Hopper: H = 8, whose two rows fill the 16 heads of a program
  // that would otherwise mask half of them, with at least a quarter as many pairs as SMs; and
  // on sm_90a on fp8_dsv4 (WgmmaUse::kAuto), likewise with at least a quarter as many units as
  // SMs, units of rows filling the 64 product rows of the warpgroup program: pairs at H = 32,
  // and at H = 8 and 16 in prefill calls.
  kAuto,
  // Also H a multiple of 16, as the two 16-head groups of a 32-head program (an A/B switch:
  // slower there, docs/results/kbench-h200.md).
  kAlways,
  kNever,  // one row per program (an A/B switch)
};

// How the sm_90a warpgroup program writes its final rows (docs/gpu.md, "The epilogue through
// shared memory").
enum class WgmmaStagedRows : uint8_t {
  // Staged in prefill calls (T >= kPrefillRows) of one row or a pair a program; straight out
  // at decode and in row groups of 3-8 rows.
  kAuto,
  kAlways,  // through shared memory, each row copied out whole (A/B)
  kNever,   // straight from the accumulators (A/B)
};

enum class WgmmaUse : uint8_t {
  // Where it measured faster on Hopper: fp8_dsv4 segments, H a multiple of 64, no other head
  // block forced, and at least one (row, 64-head) program per 11 SMs (fewer rows run split
  // direct programs, which the warpgroup program's per-tile cost does not beat).
  kAuto,
  // Wherever the plan runs 64-head programs on fp8_dsv4 or fp8_per_tensor segments (A/B).
  kAlways,
  kNever,  // the plan without it (A/B)
};

struct AttendParams {
  int32_t num_rows = 0;   // T
  int32_t num_heads = 0;  // H: 8, 16, 32, 64 or 128
  Geometry geometry = Geometry::kRopeInside;
  const void* q = nullptr;  // [T, H, QkWidth] bf16, or e4m3 codes when q_type == kFp8
  QType q_type = QType::kBf16;
  float q_scale = 1.0f;  // must be 1 for bf16 q
  // Whether q lies in memory that no earlier device work of the stream writes (a client's GPU
  // region): a kernel may then read it before waiting for the grids before it.
  bool q_before_launch = false;
  float softmax_scale = 1.0f;
  Segment main;
  bool has_extra = false;
  Segment extra;
  std::span<const float> sink;  // [H] host, finite; empty = no sink
  Epilogue epilogue;
  OutputView out;
  // Tuning overrides for tests and benchmarks; 0 = take the plan's choice.
  int32_t force_splits = 0;
  int32_t force_head_block = 0;
  // A/B switches of the GPU backend (ignored by the CPU reference): the tile kernel where the
  // direct fp8 kernel would run; the direct kernel's bf16 operands without the folded fp8_dsv4
  // rebias (the gfx950 path; CUDA's f16 operands have no fold).
  bool force_tile_kernel = false;
  bool no_scale_fold = false;
  // The sm_90a warpgroup program for 64-head blocks on fp8 segments of QK width 512 (WgmmaUse;
  // ignored where the build lacks it).
  WgmmaUse wgmma = WgmmaUse::kAuto;
  // That program's queries by the tensor copy engine (TMA) instead of the consumers' loads, the
  // epilogue's cos / sin rows staged while they arrive (docs/gpu.md, "Queries by the tensor copy
  // engine"); false keeps the loads (A/B).
  bool wgmma_q_tensor_map = true;
  // That program's final rows through shared memory or straight out (WgmmaStagedRows); the same
  // bits either way.
  WgmmaStagedRows wgmma_staged_rows = WgmmaStagedRows::kAuto;
  // Request grouping (optional; 0 = unknown): the rows come in groups of this many consecutive
  // rows of one sequence (a decode request's MTP rows), whose key sets overlap.
  int32_t rows_per_group = 0;
  // Paired rows on the GPU backend (CUDA; RowPairs): consecutive rows of a group of
  // fp8_dsv4 / fp8_per_tensor calls run as one program over the union of their keys (built on
  // the device), each shared key gathered and converted once: rows 2i and 2i+1 in the direct
  // kernel (even rows_per_group), or at 8-32 heads a unit of 2-8 rows in the warpgroup
  // program (docs/gpu.md, "Row groups on the warpgroup program").
  // Results stay within docs/operator.md's tolerances and are reproducible either way.
  RowPairs row_pairs = RowPairs::kAuto;
  // What the caller vouches for, so the backend can skip work on a hot path. A caller that
  // cannot vouch leaves them unset: the backend then checks every id and stages the host arrays
  // itself.
  // ids_in_range: every index of both segments is a sentinel (< 0) or below its cache's
  // num_slots (the caller built them from page tables of that cache). The per-id range check
  // is skipped; the CSR's shape (T+1 offsets, non-decreasing, matching counts) is still checked.
  bool ids_in_range = false;
  // arrays: host arrays (indptr, indices, positions, sink) the caller has copied to backend
  // memory; a GPU backend reads those there and uploads only the others.
  HostMirror arrays;
};

// Quantise bf16 rows into a pool (docs/operator.md section 3, "Writing rows").
struct WriteRowsParams {
  MutableCacheView cache;
  std::span<const int64_t> slots;  // [n] host, each in [0, num_slots)
  const void* rows = nullptr;      // [n, QkWidth] bf16, backend memory
  // Slots the caller has copied to backend memory (read there by a GPU backend).
  HostMirror arrays;
};

// Chosen entries (an indexer's logical entry numbers) translated into pool slots through paged
// tables, on the device (Backend::CheckInputs). A table is held in blocks of 2^block_shift page
// ids (the caller's device copy of each table, grown without moving: docs/architecture.md,
// "Page tables on the device"). Entry e lies on the table's page q = e >> page_shift, which is
// page blocks[q >> block_shift][q & (2^block_shift - 1)]; its slot is
// (page << page_shift) | (e & (2^page_shift - 1)).
struct TranslateRow {
  const int32_t* ids = nullptr;  // [width] backend memory: the row's entries, -1 = none
  int32_t* out = nullptr;        // [width] backend memory: their slots, -1 for none
  // Backend memory: the row's table blocks, enough to cover ceil(limit / 2^page_shift) pages.
  const int32_t* const* blocks = nullptr;
  int32_t width = 0;
  int32_t limit = 0;  // the row sees entries [0, limit)
  int32_t group = 0;  // index into TranslateParams::flags (the caller's step)
  int32_t unused = 0;
  // [width] backend memory, or null: the entries as read, for a caller that must explain a flag
  // from what the device saw (ids in memory the client can still rewrite).
  int32_t* seen = nullptr;
};

// One table block written where it is kept (TranslateParams::block_writes): 2^block_shift page
// ids from `from` to `to`, both backend memory.
struct TableBlockWrite {
  const int32_t* from = nullptr;
  int32_t* to = nullptr;
};

// A row's sliding window written on the device (TranslateParams::runs): the slots of `count`
// consecutive positions of one sequence's main cache. The positions are counted from the first
// row of page pages[0], so position `first + j` lies on page pages[(first + j) >> page_shift].
// The caller built the page list from its own tables: nothing here is checked.
struct PositionRun {
  const int32_t* pages = nullptr;  // backend memory
  int32_t* out = nullptr;          // [count] backend memory
  int32_t first = 0;
  int32_t count = 0;
};

// What CheckInputs sets in a group's flag word, each in a byte of its own: a refusal stores its
// byte (SetFlag, input_checks.h), so no read-modify-write is needed and the flags may lie in
// page-locked host memory the device writes over the bus, where atomics are not available.
inline constexpr uint32_t kFlagChosenEntry = 1u;      // an entry outside what its row may see
inline constexpr uint32_t kFlagInputValue = 1u << 8;  // a value its InputCheck refuses

// Each id is read once. An id outside [-1, limit) becomes -1 (nothing outside the table is read)
// and sets kFlagChosenEntry in its row's group's flags.
// The same pass writes changed table blocks where the caller keeps them (block_writes). No row of
// the pass may read a block being written (rows read the `from` copy of a changed block), so the
// writes need no ordering against the translation. It also writes the rows' windows (runs), which
// nothing else in the pass reads.
struct TranslateParams {
  const TranslateRow* rows = nullptr;  // [num_rows] backend memory
  int32_t num_rows = 0;
  int32_t page_shift = 0;
  int32_t block_shift = 0;
  int32_t num_block_writes = 0;
  const TableBlockWrite* block_writes = nullptr;  // [num_block_writes] backend memory
  const PositionRun* runs = nullptr;              // [num_runs] backend memory
  int32_t num_runs = 0;
};

// What a range of a step's inputs must hold (Backend::CheckInputs; input_checks.h has the rules).
enum class InputCheck : int32_t {
  kKvRows = 0,      // bf16 values, finite with |x| <= 2^kKvMaxLog2
  kE4m3Codes = 1,   // e4m3 codes, none NaN (0x7f, 0xff)
  kE8m0Scales = 2,  // UE8M0 scale bytes, none NaN (0xff)
  kNone = 3,        // no rule: the range is only copied (copy_to)
};

struct CheckRange {
  const uint8_t* data = nullptr;  // backend memory
  int64_t bytes = 0;              // even for kKvRows
  InputCheck check = InputCheck::kKvRows;
  int32_t group = 0;  // index into CheckInputsParams::flags
  // Backend memory, or null: the bytes as the check read them are also written here, so that
  // what is checked is what is used even where the client can rewrite `data` meanwhile (one read
  // of each byte), and no separate copy is needed.
  uint8_t* copy_to = nullptr;
};

// One row that CheckInputs writes into a pool (RowWrites).
struct RowWrite {
  const uint16_t* from = nullptr;  // [QkWidth] bf16, backend memory: read once, here
  int64_t slot = 0;                // a slot outside [0, num_slots) is not written
  int32_t group = 0;               // index into CheckInputsParams::flags
  int32_t unused = 0;
};

// Rows written into a pool by the checks themselves, as WriteRows would write them: row i is read
// once at rows[i].from, its values checked as InputCheck::kKvRows (a refusal sets
// kFlagInputValue in its group), copied to copies + i * QkWidth where it was read elsewhere, and
// written to its slot whatever the checks of its group find, so that no write waits for them.
// Where `old` is given, each slot's bytes are saved there first, row i's at
// old + i * RowBytes(format, geometry) (the data row, then fp8_dsv4's scale record), so that
// the caller can put back the slots of a group the checks refused (docs/architecture.md, "Rows
// written with their checks").
struct RowWrites {
  MutableCacheView cache;
  const RowWrite* rows = nullptr;  // [num_rows] backend memory
  int32_t num_rows = 0;
  uint16_t* copies = nullptr;  // [num_rows, QkWidth] bf16, backend memory
  uint8_t* old = nullptr;      // [num_rows, RowBytes] backend memory, 8-byte aligned; or null
};

// A launch's inputs checked in one pass (one kernel on a GPU): a range holding a value its check
// refuses sets kFlagInputValue in flags[group], the chosen entries are translated (above), and
// the new rows written (RowWrites). The caller zeroes the flags before and reads them after.
struct CheckInputsParams {
  const CheckRange* ranges = nullptr;  // [num_ranges] backend memory
  int32_t num_ranges = 0;
  TranslateParams entries;  // num_rows 0: nothing to translate
  RowWrites rows;           // num_rows 0: no rows
  // [groups]: backend memory, or page-locked host memory where the backend has it (the device
  // writes it; the host reads it once the stream is synchronised).
  uint32_t* flags = nullptr;
};

// MXFP8 query vectors (codec/mxfp8_query.h) expanded into the bf16 Q that Attend reads.
struct ExpandQueryParams {
  const uint8_t* codes = nullptr;   // e4m3 [vectors, width], backend memory
  const uint8_t* scales = nullptr;  // UE8M0 [vectors, width / 32], backend memory
  void* out = nullptr;              // bf16 [vectors, width], backend memory
  int64_t vectors = 0;              // rows * heads
  int32_t width = 0;                // a positive multiple of 32 (QkWidth)
};

}  // namespace smla::kernels

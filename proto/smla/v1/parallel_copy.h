// Copies of multi-MB tensor bytes spread over a few threads. One thread copies a few GB/s; a
// layer call of a large batch moves several MB between gRPC's buffers and staging on each side,
// so a single-threaded copy is a visible part of the call (docs/performance.md, "The inline
// data path"). Small copies stay on the caller's thread, where waking helpers costs more than it
// saves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <thread>
#include <vector>

namespace smla::v1 {

struct CopyPiece {
  uint8_t* dst;
  const uint8_t* src;
  size_t bytes;
};

class ParallelCopier;

// Copies every piece: over `copier`'s threads when given, else on the caller's thread.
void CopyPieces(std::span<const CopyPiece> pieces, ParallelCopier* copier);

class ParallelCopier {
 public:
  // Below this many bytes in total, a Copy runs on the caller's thread alone.
  static constexpr size_t kMinParallelBytes = size_t{1} << 20;

  // `helpers` threads copy beside each caller; 0 = every copy on the caller's thread.
  explicit ParallelCopier(int helpers);
  ~ParallelCopier();
  ParallelCopier(const ParallelCopier&) = delete;
  ParallelCopier& operator=(const ParallelCopier&) = delete;

  int helpers() const { return static_cast<int>(threads_.size()); }

  // Copies every piece (pieces must not overlap each other's destinations) and returns when all
  // are done. Thread-safe: concurrent callers share the helpers, each working on its own pieces
  // too, so a caller never waits behind another's copy without taking part in its own.
  void Copy(std::span<const CopyPiece> pieces);

  // A default helper count for this machine: a quarter of its cores, at most 4.
  static int DefaultHelpers();

 private:
  struct Job;
  struct Shared;
  static void HelperLoop(Shared& shared);

  std::unique_ptr<Shared> shared_;
  std::vector<std::thread> threads_;
};

}  // namespace smla::v1

#include "smla/v1/parallel_copy.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>

#include "absl/synchronization/mutex.h"
#include "smla/base/align.h"

namespace smla::v1 {
namespace {

// Pieces are cut into chunks of at least this many bytes, so that a helper's wake-up and the
// atomic it takes a chunk with stay small against the copy.
constexpr size_t kMinChunk = size_t{256} << 10;

void CopyAll(std::span<const CopyPiece> pieces) {
  for (const CopyPiece& p : pieces) std::memcpy(p.dst, p.src, p.bytes);
}

}  // namespace

void CopyPieces(std::span<const CopyPiece> pieces, ParallelCopier* copier) {
  if (copier != nullptr) {
    copier->Copy(pieces);
  } else {
    CopyAll(pieces);
  }
}

// One Copy call: its chunks, taken in order by whoever comes first.
struct ParallelCopier::Job {
  std::vector<CopyPiece> chunks;
  std::atomic<size_t> next{0};
  std::atomic<size_t> left{0};  // chunks not finished yet
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;

  // Copies chunks until none is left to take; true if this call finished the last one.
  bool Work() {
    size_t finished = 0;
    for (size_t i = next.fetch_add(1); i < chunks.size(); i = next.fetch_add(1)) {
      std::memcpy(chunks[i].dst, chunks[i].src, chunks[i].bytes);
      ++finished;
    }
    if (finished == 0) return false;
    return left.fetch_sub(finished) == finished;
  }
  void MarkDone() {
    absl::MutexLock lock(&mu);
    done = true;
  }
};

struct ParallelCopier::Shared {
  absl::Mutex mu;
  std::deque<std::shared_ptr<Job>> jobs ABSL_GUARDED_BY(mu);
  bool stopping ABSL_GUARDED_BY(mu) = false;
};

ParallelCopier::ParallelCopier(int helpers) : shared_(std::make_unique<Shared>()) {
  for (int i = 0; i < helpers; ++i) threads_.emplace_back([this] { HelperLoop(*shared_); });
}

ParallelCopier::~ParallelCopier() {
  {
    absl::MutexLock lock(&shared_->mu);
    shared_->stopping = true;
  }
  for (std::thread& t : threads_) t.join();
}

int ParallelCopier::DefaultHelpers() {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(cores / 4, 0, 4);
}

void ParallelCopier::HelperLoop(Shared& shared) {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      absl::MutexLock lock(&shared.mu);
      shared.mu.Await(absl::Condition(
          +[](Shared* s)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) { return s->stopping || !s->jobs.empty(); },
          &shared));
      if (shared.jobs.empty()) return;  // stopping
      job = shared.jobs.front();
      // A job whose chunks are all taken leaves the queue; its takers finish it.
      if (job->next.load() >= job->chunks.size()) {
        shared.jobs.pop_front();
        continue;
      }
    }
    if (job->Work()) job->MarkDone();
  }
}

void ParallelCopier::Copy(std::span<const CopyPiece> pieces) {
  size_t total = 0;
  for (const CopyPiece& p : pieces) total += p.bytes;
  if (threads_.empty() || total < kMinParallelBytes) {
    CopyAll(pieces);
    return;
  }
  // Chunks sized so that every thread gets a few, cut at 64-byte boundaries of the piece.
  const size_t workers = threads_.size() + 1;
  const size_t chunk = std::max(kMinChunk, AlignUp(total / (workers * 2), 64));
  auto job = std::make_shared<Job>();
  for (const CopyPiece& p : pieces) {
    for (size_t at = 0; at < p.bytes; at += chunk) {
      job->chunks.push_back(CopyPiece{p.dst + at, p.src + at, std::min(chunk, p.bytes - at)});
    }
  }
  job->left = job->chunks.size();
  {
    absl::MutexLock lock(&shared_->mu);
    shared_->jobs.push_back(job);
  }
  if (job->Work()) return;  // the caller finished the last chunk: everything is copied
  absl::MutexLock lock(&job->mu);
  job->mu.Await(absl::Condition(&job->done));
}

}  // namespace smla::v1

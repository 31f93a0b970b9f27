// smla-launch-trace: a preloadable library that records what a CUDA process puts on the device
// (kernels, copies, and the runtime calls that enqueue them) through CUPTI's activity API, and
// writes the last records as CSV when the process exits. It shows where a launch's device time
// goes, gaps included, on a machine without Nsight Systems (docs/results/bench-h200.md, "Where a
// launch's device time goes"; scripts/launch_trace.py reads the CSV).
//
//   SMLA_TRACE_OUT=trace.csv LD_PRELOAD=libsmla-launch-trace.so smla-server ...
//
// Columns: type (K kernel, M copy, A runtime call), start and end (ns, the device clock for K
// and M, the host's for A, the same timebase), correlation id (a call and what it enqueued share
// it), bytes (copies; the thread id for calls) and name. Recording calls costs host time: the
// gaps a call leaves on the device are larger under the tracer than without it.
#include <cupti.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Record {
  char type;
  uint64_t start, end;
  uint32_t correlation;
  uint64_t bytes;
  std::string name;
};

constexpr size_t kBufferBytes = size_t{8} << 20;
constexpr size_t kKeepAtMost = size_t{4} << 20;  // records held; older halves are dropped

std::mutex mu;

// Never destroyed: the exit handler that writes it runs among the static destructors.
std::vector<Record>& Records() {
  static auto* records = new std::vector<Record>;
  return *records;
}

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = kBufferBytes;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(mu);
  std::vector<Record>& records = Records();
  CUpti_Activity* r = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
    if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(r);
      records.push_back({'K', k->start, k->end, k->correlationId, 0, k->name ? k->name : "?"});
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(r);
      records.push_back({'M', m->start, m->end, m->correlationId, m->bytes,
                         "copy kind " + std::to_string(m->copyKind)});
    } else if (r->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
      const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(r);
      const char* name = nullptr;
      cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name);
      records.push_back({'A', a->start, a->end, a->correlationId, a->threadId, name ? name : "?"});
    }
  }
  std::free(buffer);
  if (records.size() > kKeepAtMost) {
    records.erase(records.begin(), records.begin() + static_cast<ptrdiff_t>(kKeepAtMost / 2));
  }
}

void WriteTrace() {
  cuptiActivityFlushAll(1);
  const char* path = std::getenv("SMLA_TRACE_OUT");
  const char* last_env = std::getenv("SMLA_TRACE_LAST");
  const size_t last = last_env != nullptr ? std::strtoull(last_env, nullptr, 10) : 5000;
  std::lock_guard<std::mutex> lock(mu);
  std::vector<Record>& records = Records();
  FILE* f = std::fopen(path != nullptr ? path : "launch-trace.csv", "w");
  if (f == nullptr) return;
  std::sort(records.begin(), records.end(),
            [](const Record& a, const Record& b) { return a.start < b.start; });
  const size_t from = records.size() > last ? records.size() - last : 0;
  std::fprintf(f, "type,start,end,correlation,bytes,name\n");
  for (size_t i = from; i < records.size(); ++i) {
    const Record& r = records[i];
    std::fprintf(f, "%c,%llu,%llu,%u,%llu,%s\n", r.type, static_cast<unsigned long long>(r.start),
                 static_cast<unsigned long long>(r.end), r.correlation,
                 static_cast<unsigned long long>(r.bytes), r.name.c_str());
  }
  std::fclose(f);
}

__attribute__((constructor)) void StartTrace() {
  if (cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "smla-launch-trace: CUPTI refused its callbacks; nothing is traced\n");
    return;
  }
  for (CUpti_ActivityKind kind : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                  CUPTI_ACTIVITY_KIND_RUNTIME}) {
    cuptiActivityEnable(kind);
  }
  std::atexit(WriteTrace);
}

}  // namespace

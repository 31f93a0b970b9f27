// smla-stream-floor: the device time of stream operations that carry no work, the floor under
// a launch's device time that no kernel can lower (docs/results/bench-h200.md, "The floor of a
// launch"). Each measurement enqueues its operations between two events, back to back on one
// stream after the host has enqueued them all (so host enqueueing is not timed), repeated, and
// reports the median. Operations: an empty kernel, 64-byte copies host to device, device to
// host and device to device (page-locked host memory), an event record, and one batched call
// of several 64-byte copies; then the sequence of operations one server launch enqueues
// (docs/architecture.md, "Input checks on the device"), each op empty.
//
// Usage: smla-stream-floor [--reps N] [--ops N] [--json FILE]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "smla/kernels/gpu/runtime.h"

namespace {

namespace gpu = smla::kernels::gpu;

__global__ void EmptyKernel() {}

void Check(gpu::Error e, const char* what) {
  if (e != gpu::kSuccess) {
    std::fprintf(stderr, "smla-stream-floor: %s: %s\n", what, gpu::ErrorString(e));
    std::exit(1);
  }
}

struct Floor {
  gpu::StreamHandle stream = nullptr;
  gpu::EventHandle begin = nullptr, end = nullptr, gate = nullptr;
  uint8_t* dev = nullptr;
  uint8_t* host = nullptr;
  int reps = 200;

  Floor() {
    Check(gpu::StreamCreate(&stream), "stream");
    Check(gpu::EventCreate(&begin), "event");
    Check(gpu::EventCreate(&end), "event");
    Check(gpu::Malloc(reinterpret_cast<void**>(&dev), 1 << 20), "device memory");
    Check(gpu::MallocHost(reinterpret_cast<void**>(&host), 1 << 20), "host memory");
  }

  // Median microseconds of `ops` enqueued between two events. A long kernel first keeps the
  // device busy while the host enqueues, so the interval holds only the device's time.
  double Median(const std::function<void()>& ops) {
    std::vector<double> us;
    for (int r = 0; r < reps; ++r) {
      SpinKernel();
      Check(gpu::EventRecord(begin, stream), "record");
      ops();
      Check(gpu::EventRecord(end, stream), "record");
      Check(gpu::StreamSynchronize(stream), "sync");
      float ms = 0;
      Check(gpu::EventElapsedMs(&ms, begin, end), "elapsed");
      us.push_back(ms * 1e3);
    }
    std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
    return us[us.size() / 2];
  }

  void SpinKernel();
  void Kernel() { EmptyKernel<<<1, 32, 0, stream>>>(); }
  void H2D(size_t at) { Check(gpu::MemcpyH2DAsync(dev + at, host + at, 64, stream), "h2d"); }
  void D2H(size_t at) { Check(gpu::MemcpyD2HAsync(host + at, dev + at, 64, stream), "d2h"); }
  void D2D(size_t at) {
    Check(gpu::MemcpyD2DAsync(dev + at, dev + (512 << 10) + at, 64, stream), "d2d");
  }
  void Batch(int n, bool to_device) {
    std::vector<void*> d(n);
    std::vector<const void*> s(n);
    std::vector<size_t> bytes(n, 64);
    for (int i = 0; i < n; ++i) {
      d[i] = to_device ? static_cast<void*>(dev + 128 * i) : host + 128 * i;
      s[i] = to_device ? static_cast<const void*>(host + 128 * i) : dev + 128 * i;
    }
    Check(gpu::MemcpyBatchAsync(d.data(), s.data(), bytes.data(), n, stream), "batch");
  }
  void Record() { Check(gpu::EventRecord(gate, stream), "record"); }
};

__global__ void SpinKernelBody(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

void Floor::SpinKernel() {
  SpinKernelBody<<<1, 1, 0, stream>>>(2000000);  // about 1 ms: longer than any enqueueing here
}

}  // namespace

int main(int argc, char** argv) {
  int ops = 16;
  std::string json;
  Floor f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) {
      f.reps = std::atoi(argv[++i]);
    } else if (a == "--ops" && i + 1 < argc) {
      ops = std::atoi(argv[++i]);
    } else if (a == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else {
      std::fprintf(stderr, "usage: smla-stream-floor [--reps N] [--ops N] [--json FILE]\n");
      return 2;
    }
  }
  if (f.reps < 1 || ops < 1 || ops > 512) {
    std::fprintf(stderr, "smla-stream-floor: --reps >= 1, --ops in [1, 512]\n");
    return 2;
  }
  Check(gpu::EventCreate(&f.gate), "event");
  struct Row {
    std::string name;
    double us;
  };
  std::vector<Row> rows;
  const double none = f.Median([] {});
  rows.push_back({"two events, nothing between", none});
  auto per_op = [&](const char* name, const std::function<void(int)>& op) {
    const double t = f.Median([&] {
      for (int i = 0; i < ops; ++i) op(i);
    });
    rows.push_back({name, (t - none) / ops});
  };
  per_op("empty kernel", [&](int) { f.Kernel(); });
  per_op("64 B copy, host to device", [&](int i) { f.H2D(128 * i); });
  per_op("64 B copy, device to host", [&](int i) { f.D2H(128 * i); });
  per_op("64 B copy, device to device", [&](int i) { f.D2D(128 * i); });
  per_op("event record", [&](int) { f.Record(); });
  rows.push_back(
      {"one batched call of 4 copies, host to device", f.Median([&] { f.Batch(4, true); }) - none});
  rows.push_back({"one batched call of 4 copies, device to host",
                  f.Median([&] { f.Batch(4, false); }) - none});
  // A C=1 launch's operations, empty: 4 input copies (one batched call), 2 events, the arrays'
  // upload, the checks and row-write kernels, an event, attention, an event, 3 output copies
  // (one batched call), between the start and end events measured here.
  rows.push_back({"a launch's operations, empty", f.Median([&] {
                    f.Batch(4, true);
                    f.Record();
                    f.Record();
                    f.H2D(0);
                    f.Kernel();
                    f.Kernel();
                    f.Record();
                    f.Kernel();
                    f.Record();
                    f.Batch(3, false);
                  })});
  for (const Row& r : rows) std::printf("%-48s %8.2f us\n", r.name.c_str(), r.us);
  if (!json.empty()) {
    FILE* out = std::fopen(json.c_str(), "w");
    if (out == nullptr) {
      std::fprintf(stderr, "smla-stream-floor: cannot write %s\n", json.c_str());
      return 1;
    }
    std::fprintf(out, "{\"ops_per_measurement\": %d, \"reps\": %d, \"us\": {", ops, f.reps);
    for (size_t i = 0; i < rows.size(); ++i) {
      std::fprintf(out, "%s\"%s\": %.3f", i ? ", " : "", rows[i].name.c_str(), rows[i].us);
    }
    std::fprintf(out, "}}\n");
    std::fclose(out);
  }
  return 0;
}

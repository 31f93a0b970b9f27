// The server side of a step ring (smla/v1/step_ring.h): a StepStream's request ring in one of
// its tenant's registered regions. A poller thread per ring waits for the next request (a
// spin, then a futex sleep), copies it out of the region, parses and submits it exactly as the
// stream does (SmlaService::Prepare, ServiceCore::Submit, so ring steps batch with every other
// step), and the completion writes the response into the request's slot.
//
// Spinning: the poller spins while any step it served is still in service (between Serve and
// Complete), up to kBusySpin, and for kSpin after the last of them completed (or after the
// last request it picked up, when nothing is in service); only then does it sleep on the
// doorbell. A client in a closed loop sends its next request right after reading the previous
// response, so the poller is still spinning and the call pays no futex wake. The cost is
// deliberate: a ring whose steps are in flight keeps one core busy (the spin yields the core
// to other runnable threads between checks, so it does not starve them); a step longer than
// kBusySpin (a slow device, the CPU backend) is waited for asleep, and an idle ring sleeps and
// uses no CPU.
//
// Ownership and lifetime: the stream reactor owns the ring. Stop() ends polling (it joins the
// poller); steps already submitted still complete and answer in the ring; once the last has,
// the ring marks its header closed and calls `on_idle` exactly once, and touches the region no
// more. The ring holds the region's mapping, so it stays mapped until the ring is destroyed,
// which its owner may do once `on_idle` has run (not before).
//
// Ring memory is untrusted: a request is bounded by slot_bytes, copied before parsing and
// re-checked against its sequence number after the copy; bad bytes become error responses, and
// the poller never waits on the client (a client that reads no responses only stops getting
// them; at most `slots` of its steps are in flight). The region is a sealed memfd
// (shm_region.h), so no client action can make the ring's memory fault.
//
// Server memory follows use, not the ring's size: one copy buffer per ring (the longest
// request seen), and per slot an arena that a step grows and its answer resets.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "google/protobuf/arena.h"
#include "smla/server/step.h"
#include "smla/v1/step.pb.h"
#include "step_view.h"
#include "wire.h"

namespace smla::server::edge {

class ShmMapping;
class SmlaService;

class StepRing {
 public:
  // Spin this long for the next request, after the last request picked up or the last step
  // in service completed (it spins throughout while steps are in service), before sleeping on
  // the doorbell.
  static constexpr absl::Duration kSpin = absl::Microseconds(30);
  // Spin at most this long while steps are in service (GPU steps take well under it).
  static constexpr absl::Duration kBusySpin = absl::Milliseconds(2);

  // Checks `attach` for `tenant` (regions allowed, the tenant's region, bounds, alignment,
  // slot count and size, the header the client wrote) and starts polling. Steps act for
  // `tenant` with the stream's deadline and cancel flag.
  static absl::StatusOr<std::unique_ptr<StepRing>> Attach(
      SmlaService* service, const std::string& tenant, absl::Time call_deadline, CancelFlag cancel,
      const v1::RingAttach& attach, std::function<void()> on_idle);
  ~StepRing();
  StepRing(const StepRing&) = delete;
  StepRing& operator=(const StepRing&) = delete;

  // Stops polling and waits for the poller to exit; idempotent. Must not be called from a
  // completion callback of this ring's steps.
  void Stop();

 private:
  // A slot's step while it is in flight; reused by the slot's next request.
  struct Work {
    Work();
    alignas(8) char first_block[8192];
    google::protobuf::Arena arena;
    // The request as protobuf read it; null when the packed-step decoder read it.
    v1::StepRequest* request = nullptr;
    v1::StepResponse* response = nullptr;
    ParseStorage storage;
    std::string request_id;
    uint32_t seq = 0;
    absl::Time start, parsed;
    std::atomic<bool> busy{false};
  };

  StepRing(SmlaService* service, std::string tenant, absl::Time call_deadline, CancelFlag cancel,
           std::shared_ptr<ShmMapping> mapping, uint8_t* ring, uint32_t slots, uint32_t slot_bytes,
           std::function<void()> on_idle);
  void Poll();
  bool Ready(uint64_t n) const;
  // Wakes the poller from the server's side (stop, a slot freed).
  void RingDoorbell();
  void Serve(uint64_t n);
  void Complete(uint32_t index, const absl::StatusOr<StepResult>& result);
  // Writes `resp` into slot `index`'s data and publishes it as the answer to `seq`.
  void Answer(uint32_t index, uint32_t seq, v1::StepResponse* resp);
  // One in-flight step fewer or the poller joined: the last of both closes the ring. Called
  // with mu_ held; releases it (before calling on_idle, which may destroy the ring).
  void MaybeIdle() ABSL_UNLOCK_FUNCTION(mu_);

  SmlaService* const service_;
  const std::string tenant_;
  const absl::Time call_deadline_;
  const CancelFlag cancel_;
  const std::shared_ptr<ShmMapping> mapping_;  // keeps ring_ mapped
  uint8_t* const ring_;
  const uint32_t slots_;
  const uint32_t slot_bytes_;
  const std::function<void()> on_idle_;
  std::vector<std::unique_ptr<Work>> work_;  // per slot
  std::vector<uint8_t> copy_;                // the request being served, copied (poller only)
  StepView view_;                            // the request decoded from copy_ (poller only)
  std::atomic<bool> stop_{false};
  std::atomic<bool> poller_sleeping_{false};
  std::thread poller_;
  absl::Mutex mu_;
  // Served steps not yet answered (Serve to Complete). Changed only under mu_ (MaybeIdle reads
  // it there); the poller reads it without the lock to decide whether to keep spinning, so it
  // is an atomic rather than ABSL_GUARDED_BY.
  std::atomic<int> outstanding_{0};
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool joined_ ABSL_GUARDED_BY(mu_) = false;
  bool idle_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace smla::server::edge

#include "step_ring.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "packed_step_decoder.h"
#include "ring_attach.h"
#include "shm_region.h"
#include "smla/v1/step_ring.h"
#include "smla_service.h"

namespace smla::server::edge {
namespace ring = v1::ring;
namespace {

// A sleep on the doorbell is bounded so a client that sets request_seq without ringing is
// still served, slowly, and a lost wake cannot stall the ring for long.
constexpr int64_t kSleepNs = 100'000'000;

absl::Status NoOutputs() {
  return absl::InvalidArgumentError(
      "out_region: a ring request names output regions (inline outputs do not fit a slot)");
}

}  // namespace

StepRing::Work::Work() : arena(FirstBlock(first_block, sizeof first_block)) {}

absl::StatusOr<std::unique_ptr<StepRing>> StepRing::Attach(
    SmlaService* service, const std::string& tenant, absl::Time call_deadline, CancelFlag cancel,
    const v1::RingAttach& attach, std::function<void()> on_idle) {
  absl::StatusOr<RingPlace> place = CheckRingAttach(service->regions(), tenant, attach);
  if (!place.ok()) return place.status();
  std::unique_ptr<StepRing> r(new StepRing(service, tenant, call_deadline, std::move(cancel),
                                           std::move(place->mapping), place->ring, place->slots,
                                           place->slot_bytes, std::move(on_idle)));
  r->poller_ = std::thread([p = r.get()] { p->Poll(); });
  return r;
}

StepRing::StepRing(SmlaService* service, std::string tenant, absl::Time call_deadline,
                   CancelFlag cancel, std::shared_ptr<ShmMapping> mapping, uint8_t* ring,
                   uint32_t slots, uint32_t slot_bytes, std::function<void()> on_idle)
    : service_(service),
      tenant_(std::move(tenant)),
      call_deadline_(call_deadline),
      cancel_(std::move(cancel)),
      mapping_(std::move(mapping)),
      ring_(ring),
      slots_(slots),
      slot_bytes_(slot_bytes),
      on_idle_(std::move(on_idle)) {
  // Nothing sized by slot_bytes is allocated here: a slot's memory follows what its requests
  // really hold (the arena grows with a request and is reset once it is answered).
  for (uint32_t i = 0; i < slots_; ++i) work_.push_back(std::make_unique<Work>());
}

StepRing::~StepRing() {
  stop_.store(true);
  if (poller_.joinable()) {
    RingDoorbell();
    poller_.join();
  }
}

void StepRing::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  stop_.store(true);
  RingDoorbell();
  poller_.join();
  mu_.Lock();
  joined_ = true;
  MaybeIdle();
}

void StepRing::RingDoorbell() {
  // Changing the word first means a poller about to sleep on its old value does not.
  uint32_t* bell = &ring::HeaderAt(ring_)->doorbell;
  std::atomic_ref<uint32_t>(*bell).fetch_add(1, std::memory_order_seq_cst);
  ring::FutexWakeAll(bell);
}

bool StepRing::Ready(uint64_t n) const {
  const uint32_t index = static_cast<uint32_t>((n - 1) % slots_);
  const ring::SlotHeader* s = ring::SlotAt(ring_, slot_bytes_, index);
  return ring::Load(s->request_seq) == static_cast<uint32_t>(n) &&
         !work_[index]->busy.load(std::memory_order_acquire);
}

void StepRing::Poll() {
  ring::Header* h = ring::HeaderAt(ring_);
  uint64_t n = 1;
  while (!stop_.load(std::memory_order_relaxed)) {
    if (Ready(n)) {
      Serve(n++);
      continue;
    }
    // Spin while steps this ring served are in service (the client sends its next request
    // right after reading a response), up to kBusySpin, and for kSpin after the last of them
    // completed.
    absl::Time spin_until = absl::Now() + kSpin;
    absl::Time busy_until = absl::InfiniteFuture();
    bool ready = false, in_service = false;
    while (!(ready = Ready(n)) && !stop_.load(std::memory_order_relaxed)) {
      if (outstanding_.load(std::memory_order_acquire) > 0) {
        if (!in_service) {
          in_service = true;
          busy_until = absl::Now() + kBusySpin;
        } else if (absl::Now() >= busy_until) {
          break;  // a long step: sleep, its completion rings the doorbell
        }
        // Between checks let any other runnable thread on this core go first (a no-op on an
        // idle core): the spin should not slow the work it waits for.
        for (int i = 0; i < 16; ++i) v1::CpuRelax();
        std::this_thread::yield();
        continue;
      }
      const absl::Time now = absl::Now();
      if (in_service) {
        in_service = false;
        spin_until = now + kSpin;  // the last step in service has just completed
      } else if (now >= spin_until) {
        break;
      }
      for (int i = 0; i < 16; ++i) v1::CpuRelax();
    }
    if (ready) continue;
    // Sleep: announce it, then re-check, so a request published meanwhile is not missed (the
    // client reads server_sleeping after ringing; a slot freed by a completion reads
    // poller_sleeping_ after freeing it).
    const uint32_t bell = ring::Load(h->doorbell);
    poller_sleeping_.store(true);
    ring::Store(h->server_sleeping, 1, std::memory_order_seq_cst);
    if (!Ready(n) && !stop_.load()) ring::FutexWait(&h->doorbell, bell, kSleepNs);
    ring::Store(h->server_sleeping, 0, std::memory_order_relaxed);
    poller_sleeping_.store(false, std::memory_order_relaxed);
  }
}

void StepRing::Serve(uint64_t n) {
  const uint32_t index = static_cast<uint32_t>((n - 1) % slots_);
  const uint32_t seq = static_cast<uint32_t>(n);
  ring::SlotHeader* s = ring::SlotAt(ring_, slot_bytes_, index);
  Work& w = *work_[index];
  w.busy.store(true, std::memory_order_relaxed);
  w.seq = seq;
  w.start = absl::Now();
  w.request_id.clear();
  w.arena.Reset();
  w.storage.Clear();
  w.request = nullptr;
  w.response = google::protobuf::Arena::CreateMessage<v1::StepResponse>(&w.arena);
  const uint32_t len = ring::Load(s->request_bytes, std::memory_order_relaxed);
  absl::Status st;
  StepRequest step;
  // Whether the request was read and st says how it was prepared (else st is the read's error).
  bool read = false;
  if (len > slot_bytes_) {
    st = absl::InvalidArgumentError(absl::StrCat("ring slot ", index, ": request_bytes ", len,
                                                 " exceeds slot_bytes ", slot_bytes_));
  } else {
    // One copy buffer for the ring (only the poller serves): sized by the longest request seen,
    // at most slot_bytes. Reading the request copies out what the step keeps (into the step,
    // the slot's arena and its storage).
    if (copy_.size() < len) copy_.resize(len);
    std::memcpy(copy_.data(), ring::SlotData(s), len);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (ring::Load(s->request_seq) != seq) {
      st = absl::InvalidArgumentError(
          absl::StrCat("ring slot ", index, ": request ", seq, " was rewritten while being read"));
    } else if (DecodePackedStep({copy_.data(), len}, &view_)) {
      // The packed form, read without protobuf (packed_step_decoder.h).
      read = true;
      st = !view_.outputs.out.set
               ? NoOutputs()
               : service_->PrepareView(tenant_, view_, call_deadline_, cancel_, &step, &w.storage);
      view_.Clear();  // frees what long role lists took; keeps the spans' capacity
    } else {
      w.request = google::protobuf::Arena::CreateMessage<v1::StepRequest>(&w.arena);
      if (!w.request->ParseFromArray(copy_.data(), static_cast<int>(len))) {
        st = absl::InvalidArgumentError(
            absl::StrCat("ring slot ", index, ": request ", seq, " is not a StepRequest"));
      } else if (w.request->has_ring_attach()) {
        st = absl::InvalidArgumentError("ring_attach: not allowed in a ring slot");
      } else {
        read = true;
        st = !w.request->has_out_region() ? NoOutputs()
                                          : service_->Prepare(tenant_, *w.request, call_deadline_,
                                                              cancel_, &step, &w.storage);
      }
    }
  }
  if (read) w.request_id = step.request_id;
  w.parsed = absl::Now();
  {
    absl::MutexLock lock(&mu_);
    ++outstanding_;
  }
  if (!st.ok()) {
    Complete(index, st);
    return;
  }
  service_->core()->Submit(
      std::move(step), [this, index](const absl::StatusOr<StepResult>& r) { Complete(index, r); });
}

void StepRing::Complete(uint32_t index, const absl::StatusOr<StepResult>& result) {
  Work& w = *work_[index];
  // Counted as the stream's steps: the ring is the stream's transport.
  service_->AnswerStreamStep(w.request_id, w.start, w.parsed, result, &w.storage.outputs,
                             w.response);
  Answer(index, w.seq, w.response);
  // Free what the step grew the arena by (all but its first block) while the slot is idle.
  w.request = nullptr;
  w.response = nullptr;
  w.arena.Reset();
  // The slot's work may be reused from here on.
  w.busy.store(false, std::memory_order_seq_cst);
  if (poller_sleeping_.load()) RingDoorbell();
  mu_.Lock();
  --outstanding_;
  MaybeIdle();
}

void StepRing::Answer(uint32_t index, uint32_t seq, v1::StepResponse* resp) {
  ring::SlotHeader* s = ring::SlotAt(ring_, slot_bytes_, index);
  size_t n = resp->ByteSizeLong();
  if (n > slot_bytes_) {
    // Only a long request id or message can do this (outputs are in regions): keep the code
    // and as much of the message as fits.
    v1::StepResponse small;
    small.set_code(resp->code());
    small.set_message(resp->message().substr(0, slot_bytes_ / 2));
    *resp = std::move(small);
    n = resp->ByteSizeLong();
  }
  resp->SerializeWithCachedSizesToArray(ring::SlotData(s));
  ring::Store(s->response_bytes, static_cast<uint32_t>(n), std::memory_order_relaxed);
  ring::Store(s->response_seq, seq, std::memory_order_seq_cst);
  if (ring::Load(s->client_waiting, std::memory_order_seq_cst) != 0) {
    ring::FutexWakeAll(&s->response_seq);
  }
}

void StepRing::MaybeIdle() {
  if (idle_ || !joined_ || outstanding_ > 0) {
    mu_.Unlock();
    return;
  }
  idle_ = true;
  mu_.Unlock();
  ring::Header* h = ring::HeaderAt(ring_);
  ring::Store(h->closed, 1, std::memory_order_seq_cst);
  for (uint32_t i = 0; i < slots_; ++i) {
    ring::FutexWakeAll(&ring::SlotAt(ring_, slot_bytes_, i)->response_seq);
  }
  // The owner may destroy this ring from on_idle: nothing of it is touched after the call.
  std::function<void()> done = on_idle_;
  done();
}

}  // namespace smla::server::edge

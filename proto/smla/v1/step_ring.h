// The step ring's layout in shared memory (StepRequest.ring_attach): a request ring in a
// registered region through which a client on the server's host sends step requests and reads
// their responses without a gRPC round trip. Server and client both include this header; it
// is part of the wire API, like step.proto, so it lives beside it.
//
//   offset 0            Header (128 bytes)
//   offset 128 + i * (64 + slot_bytes)
//                       SlotHeader of slot i (64 bytes), then slot_bytes of data
//
// All words are little-endian uint32, accessed atomically (std::atomic_ref). Request number n
// (n = 1, 2, ...; the 32-bit words wrap) goes to slot (n - 1) % slots:
//
//   client: waits until the slot's response_seq is n - slots (0 at first: the slot is free),
//           writes a serialized StepRequest into the data and its length into request_bytes,
//           stores request_seq = n (release), adds 1 to Header.doorbell and, when
//           Header.server_sleeping is 1, FUTEX_WAKEs the doorbell.
//   server: serves requests in order: it waits for request_seq == n of the next slot, copies
//           request_bytes (at most slot_bytes) of data into its own memory, then submits the
//           step. When it is done it writes a serialized StepResponse into the same data area
//           (the request is no longer needed), its length into response_bytes, stores
//           response_seq = n (release) and, when the slot's client_waiting is 1, FUTEX_WAKEs
//           response_seq. Output tensors go to the regions the request names, as on the stream.
//
// Waiting: either side spins a little, then sets its "sleeping"/"waiting" word, re-checks, and
// FUTEX_WAITs (shared, not FUTEX_PRIVATE: the mapping is shared between processes). When the
// ring stops (its stream ended) the server sets Header.closed to 1 after its last write and
// wakes every slot's response_seq; it touches the ring no more.
//
// Trust: the server treats every byte here as untrusted (lengths are bounded, sequence numbers
// compared, a request is copied before parsing); a client that scribbles on its ring only gets
// error responses or no responses. The ring's region is a sealed memfd
// (smla/v1/shm_handover.h) whose size cannot change, so nothing a client does to it can fault
// the server.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

#include "smla/v1/cpu_relax.h"
#include "smla/v1/shm_region.h"

namespace smla::v1::ring {

inline constexpr uint32_t kMagic = 0x474E5253;  // "SRNG"
inline constexpr uint32_t kVersion = 1;
// Bounds the server accepts: a ring holds at most kMaxSlots requests in flight.
inline constexpr uint32_t kMaxSlots = 256;
inline constexpr uint32_t kMinSlotBytes = 1024;
inline constexpr uint32_t kMaxSlotBytes = 1u << 20;
inline constexpr uint64_t kAlign = region::kRegionAlign;  // ring offset, slot_bytes

struct Header {
  // Written by the client before it attaches; the server checks them against the attach.
  uint32_t magic;
  uint32_t version;
  uint32_t slots;
  uint32_t slot_bytes;
  uint32_t reserved0[12];
  // Cache line 2.
  uint32_t doorbell;  // +1 per request (and by the server to wake its poller); its futex word
  uint32_t server_sleeping;  // server: 1 while it may be waiting on doorbell
  uint32_t closed;           // server: 1 once it no longer serves the ring
  uint32_t reserved1[13];
};
static_assert(sizeof(Header) == 128);

struct SlotHeader {
  uint32_t request_seq;     // client: request number in this slot (after its bytes)
  uint32_t request_bytes;   // client: serialized StepRequest length
  uint32_t response_seq;    // server: request number answered; the client's futex word
  uint32_t response_bytes;  // server: serialized StepResponse length
  uint32_t client_waiting;  // client: 1 while it may be waiting on response_seq
  uint32_t reserved[11];
};
static_assert(sizeof(SlotHeader) == 64);

inline constexpr uint64_t SlotStride(uint32_t slot_bytes) {
  return sizeof(SlotHeader) + uint64_t{slot_bytes};
}
// Bytes of a ring of `slots` slots of `slot_bytes` data each.
inline constexpr uint64_t RingBytes(uint32_t slots, uint32_t slot_bytes) {
  return sizeof(Header) + uint64_t{slots} * SlotStride(slot_bytes);
}
inline Header* HeaderAt(uint8_t* ring) { return reinterpret_cast<Header*>(ring); }
inline SlotHeader* SlotAt(uint8_t* ring, uint32_t slot_bytes, uint32_t i) {
  return reinterpret_cast<SlotHeader*>(ring + sizeof(Header) + i * SlotStride(slot_bytes));
}
inline uint8_t* SlotData(SlotHeader* slot) { return reinterpret_cast<uint8_t*>(slot + 1); }

inline uint32_t Load(const uint32_t& w, std::memory_order o = std::memory_order_acquire) {
  return std::atomic_ref<uint32_t>(const_cast<uint32_t&>(w)).load(o);
}
inline void Store(uint32_t& w, uint32_t v, std::memory_order o = std::memory_order_release) {
  std::atomic_ref<uint32_t>(w).store(v, o);
}

// Sleeps while *word == expected, at most `timeout_ns` (shared futex: the word may be in a
// mapping of another process). Returns on a wake, a changed word, the timeout or a signal.
inline void FutexWait(uint32_t* word, uint32_t expected, int64_t timeout_ns) {
  timespec ts{static_cast<time_t>(timeout_ns / 1000000000),
              static_cast<long>(timeout_ns % 1000000000)};
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
}
inline void FutexWakeAll(uint32_t* word) {
  syscall(SYS_futex, word, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

}  // namespace smla::v1::ring

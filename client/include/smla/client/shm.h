// The zero-copy transport on the client side (docs/architecture.md "Transport"): a sealed memfd
// this process creates, hands over to a server on the same host (smla/v1/shm_handover.h) and
// registers, and the helpers that make a step use it. After Place, a step request carries only
// (region, offset, size) references: the server reads the inputs from the region and writes the
// output (and MXFP8 scales, LSE) into it, so a decode step moves a few hundred bytes over gRPC.
//
// Lifetime: the registration lasts while the ShmRegion lives (its registering call stays
// open); Unregister ends it explicitly, destruction cancels the call and unmaps.
// One step at a time per region: Place reuses the region from offset 0, so a caller with
// several steps in flight uses one region per step (or per stream with one step in flight).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "smla/client/client.h"
#include "smla/client/region_lease.h"
#include "smla/v1/service.grpc.pb.h"

namespace smla::client {

// A memfd named "smla-<label>" of `size` bytes, sealed as the region contract requires
// (smla/v1/shm_region.h: its size can never change); the caller owns the descriptor.
absl::StatusOr<int> SealedMemfd(const std::string& label, uint64_t size);

// Hands `fd` to the server whose handover socket is `socket` (ServerInfo.shm_socket) and
// returns the token RegisterRegionRequest.handover claims it with. The server's refusal (not a
// sealed memfd, ...) comes back as FAILED_PRECONDITION with its text.
absl::StatusOr<std::string> HandOver(const std::string& socket, int fd);

class ShmRegion {
 public:
  // Creates a memfd (named "smla-<label>" for tools like /proc/PID/fd) of `size` bytes, seals
  // its size for good (smla/v1/shm_region.h), maps it, hands it over and
  // registers it with the server behind `client` (which must outlive the region). The server
  // must run with --allow_shm and on this host; it names the region (name()). The memory has
  // no name in any filesystem, so a client that dies leaves nothing behind.
  static absl::StatusOr<std::unique_ptr<ShmRegion>> Create(Client* client, const std::string& label,
                                                           uint64_t size);
  ~ShmRegion();
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;

  const std::string& name() const { return name_; }
  uint8_t* data() const { return data_; }
  // The memfd (tests try to resize it).
  int fd() const { return fd_; }
  uint64_t size() const { return size_; }

  // Ends the registration; later steps naming the region fail with NOT_FOUND.
  absl::Status Unregister();

  // How Place lays a request's inputs out in the region.
  enum class Layout {
    // Every span's tensors name their own range (Span.kv_rows.region, ...).
    kPerSpan,
    // One range per tensor kind for all spans (StepRequest.packed): the request carries a
    // few references whatever its span count, and the server resolves them once. Top-k ids
    // take the widest span's width, narrower rows padded with -1 (none).
    kPacked,
  };

  // Bytes Place needs for `request` (inputs and outputs, each at a multiple of
  // v1::region::kRegionAlign; the packed
  // layout needs at most as many).
  static uint64_t BytesFor(const v1::StepRequest& request);
  // Moves every inline input tensor of `request` into the region from `offset` (rounded up to
  // a multiple of v1::region::kRegionAlign) on and points the outputs (out, and mx_scales / lse
  // when the request asks for them) at it; returns the end of what it used. `request` must be fully
  // inline; OUT_OF_RANGE when the region is too small, INVALID_ARGUMENT when only some of a packed
  // request's spans carry top-k ids. Several requests can live side by side at different offsets.
  absl::StatusOr<uint64_t> Place(v1::StepRequest* request, uint64_t offset = 0,
                                 Layout layout = Layout::kPerSpan) const;
  // Place into any mapping of `size` bytes at `data` that the server knows as `name` (e.g. a
  // region registered by other means).
  static absl::StatusOr<uint64_t> PlaceInto(uint8_t* data, uint64_t size, const std::string& name,
                                            v1::StepRequest* request, uint64_t offset = 0,
                                            Layout layout = Layout::kPerSpan);
  // The bytes of a tensor that names this region (bounds checked).
  absl::StatusOr<std::span<const uint8_t>> Bytes(const v1::Tensor& tensor) const;
  // Replaces the response's region tensors by inline copies of their bytes, e.g. to compare
  // with an inline response.
  absl::Status Inline(v1::StepResponse* response) const;
  // Inline for any mapping of `size` bytes at `data` that the server knows as `name` (e.g. a
  // host copy of a GPU region).
  static absl::Status InlineFrom(const uint8_t* data, uint64_t size, const std::string& name,
                                 v1::StepResponse* response);

 private:
  ShmRegion() = default;
  std::string name_;
  int fd_ = -1;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  std::unique_ptr<RegionLease> lease_;
};

}  // namespace smla::client

#include "smla/client/shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "smla/base/status_macros.h"
#include "smla/kernels/formats.h"
#include "smla/v1/shm_handover.h"
#include "smla/v1/shm_region.h"

namespace smla::client {
namespace {

using v1::region::AlignUp;

// Every inline input tensor of a request, in a fixed order.
std::vector<v1::Tensor*> Inputs(v1::StepRequest* r) {
  std::vector<v1::Tensor*> t;
  for (v1::Span& s : *r->mutable_spans()) {
    for (v1::Tensor* x : {s.mutable_kv_rows(), s.mutable_q()}) t.push_back(x);
    if (s.has_q_scales()) t.push_back(s.mutable_q_scales());
    if (s.has_compressed_rows()) t.push_back(s.mutable_compressed_rows());
    if (s.has_topk()) t.push_back(s.mutable_topk());
  }
  return t;
}

struct OutputBytes {
  uint64_t out = 0, scales = 0, lse = 0;
};

OutputBytes OutputsOf(const v1::StepRequest& r) {
  int64_t rows = 0, heads = 0;
  for (const v1::Span& s : r.spans()) {
    rows += s.num_rows();
    if (s.q().shape_size() == 3) heads = s.q().shape(1);
  }
  const uint64_t cells = static_cast<uint64_t>(rows * heads);
  OutputBytes o;
  const bool mx = r.output_format() == v1::OUTPUT_FORMAT_MXFP8;
  o.out = cells * kernels::kValueWidth * (mx ? 1 : 2);
  if (mx) o.scales = cells * kernels::kMxGroupsPerHead;
  if (r.want_lse()) o.lse = cells * 4;
  return o;
}

}  // namespace

absl::StatusOr<int> SealedMemfd(const std::string& label, uint64_t size) {
  const std::string name = "smla-" + label;
  const int fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("memfd_create ", name, ": ", std::strerror(errno)));
  }
  // The server maps the memfd only once its size can never change (it could fault otherwise).
  if (ftruncate(fd, static_cast<off_t>(size)) != 0 ||
      fcntl(fd, F_ADD_SEALS, v1::region::kRegionSeals) != 0) {
    const int err = errno;
    close(fd);
    return absl::InternalError(
        absl::StrCat("sizing and sealing memfd ", name, ": ", std::strerror(err)));
  }
  return fd;
}

absl::StatusOr<std::string> HandOver(const std::string& socket, int fd) {
  sockaddr_un to{};
  socklen_t to_len = 0;
  if (!v1::handover::ToSockaddr(socket, &to, &to_len)) {
    return absl::InvalidArgumentError(absl::StrCat("handover socket '", socket, "': bad address"));
  }
  const int s = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  absl::Cleanup close_s = [s] { close(s); };
  // Autobind: an abstract address of our own for the server's answer.
  sockaddr_un self{};
  self.sun_family = AF_UNIX;
  const timeval timeout{10, 0};
  if (bind(s, reinterpret_cast<sockaddr*>(&self), sizeof(sa_family_t)) != 0 ||
      setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout) != 0) {
    return absl::InternalError(absl::StrCat("handover socket: ", std::strerror(errno)));
  }
  iovec iov{const_cast<char*>(v1::handover::kRequest), sizeof v1::handover::kRequest - 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_name = &to;
  msg.msg_namelen = to_len;
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  if (sendmsg(s, &msg, MSG_NOSIGNAL) < 0) {
    return absl::UnavailableError(absl::StrCat("handover to ", socket, ": ", std::strerror(errno)));
  }
  char reply[v1::handover::kMaxReplyBytes];
  const ssize_t n = recv(s, reply, sizeof reply, 0);
  if (n < 0) {
    return absl::UnavailableError(
        absl::StrCat("handover to ", socket, ": no answer: ", std::strerror(errno)));
  }
  const absl::string_view answer(reply, static_cast<size_t>(n));
  if (absl::StartsWith(answer, "OK ")) return std::string(answer.substr(3));
  absl::string_view why = answer;
  absl::ConsumePrefix(&why, "ERR ");
  return absl::FailedPreconditionError(std::string(why));
}

absl::StatusOr<std::unique_ptr<ShmRegion>> ShmRegion::Create(Client* client,
                                                             const std::string& label,
                                                             uint64_t size) {
  SMLA_ASSIGN_OR_RETURN(v1::ServerInfo info, client->Info());
  if (info.shm_socket().empty()) {
    return absl::FailedPreconditionError(
        "shared-memory regions are not enabled on this server (start it with --allow_shm)");
  }
  std::unique_ptr<ShmRegion> r(new ShmRegion());
  SMLA_ASSIGN_OR_RETURN(r->fd_, SealedMemfd(label, size));
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd_, 0);
  if (p == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("mmap smla-", label, ": ", std::strerror(errno)));
  }
  r->data_ = static_cast<uint8_t*>(p);
  r->size_ = size;
  SMLA_ASSIGN_OR_RETURN(std::string token, HandOver(info.shm_socket(), r->fd_));
  v1::RegisterRegionRequest req;
  req.set_size(size);
  req.set_handover(token);
  SMLA_ASSIGN_OR_RETURN(r->lease_, RegionLease::Open(client, req));
  r->name_ = r->lease_->name();
  return r;
}

absl::Status ShmRegion::Unregister() {
  if (!lease_) return absl::FailedPreconditionError(absl::StrCat(name_, ": not registered"));
  absl::Status st = lease_->Unregister();
  lease_.reset();
  return st;
}

ShmRegion::~ShmRegion() {
  lease_.reset();  // the server drops the region before the memory goes
  if (data_ != nullptr) munmap(data_, size_);
  if (fd_ >= 0) close(fd_);
}

uint64_t ShmRegion::BytesFor(const v1::StepRequest& request) {
  uint64_t n = 0;
  for (const v1::Span& s : request.spans()) {
    n += AlignUp(s.kv_rows().inline_data().size()) + AlignUp(s.q().inline_data().size());
    if (s.has_q_scales()) n += AlignUp(s.q_scales().inline_data().size());
    if (s.has_compressed_rows()) n += AlignUp(s.compressed_rows().inline_data().size());
    if (s.has_topk()) n += AlignUp(s.topk().inline_data().size());
  }
  const OutputBytes o = OutputsOf(request);
  return n + AlignUp(o.out) + AlignUp(o.scales) + AlignUp(o.lse);
}

absl::StatusOr<uint64_t> ShmRegion::Place(v1::StepRequest* request, uint64_t offset,
                                          Layout layout) const {
  return PlaceInto(data_, size_, name_, request, offset, layout);
}

absl::StatusOr<uint64_t> ShmRegion::PlaceInto(uint8_t* data, uint64_t size, const std::string& name,
                                              v1::StepRequest* request, uint64_t offset,
                                              Layout layout) {
  const OutputBytes o = OutputsOf(*request);  // before packing clears the spans' q
  uint64_t at = AlignUp(offset);
  auto take = [&](uint64_t bytes, v1::RegionRef* ref) -> absl::Status {
    if (!v1::region::RefInBounds(at, bytes, size)) {
      return absl::OutOfRangeError(absl::StrCat(
          "region ", name, " of ", size, " bytes is too small for the step at offset ", offset));
    }
    ref->set_region(name);
    ref->set_offset(at);
    ref->set_size(bytes);
    at = AlignUp(at + bytes);
    return absl::OkStatus();
  };
  for (v1::Tensor* t : Inputs(request)) {
    if (t->data_case() != v1::Tensor::kInlineData) {
      return absl::InvalidArgumentError("Place: the request is not fully inline");
    }
  }
  if (layout == Layout::kPacked) {
    // Each tensor kind of all spans, concatenated in span order, in one range.
    // One top-k width for all spans: the widest; narrower rows are padded with -1 (none).
    int64_t topk_width = -1, topk_rows = 0;
    int with_topk = 0;
    for (int i = 0; i < request->spans_size(); ++i) {
      const v1::Span& s = request->spans(i);
      if (!s.has_topk()) continue;
      ++with_topk;
      const v1::Tensor& t = s.topk();
      if (t.dtype() != v1::DTYPE_INT32 || t.shape_size() != 2 || t.shape(0) < 0 || t.shape(1) < 0 ||
          static_cast<int64_t>(t.inline_data().size()) != t.shape(0) * t.shape(1) * 4) {
        return absl::InvalidArgumentError(
            absl::StrCat("Place: spans[", i, "].topk is not int32 [rows, K]"));
      }
      topk_width = std::max<int64_t>(topk_width, t.shape(1));
      topk_rows += t.shape(0);
    }
    if (with_topk != 0 && with_topk != request->spans_size()) {
      return absl::InvalidArgumentError(
          "Place: packed spans need top-k ids in every span or in none");
    }
    v1::PackedInputs* packed = request->mutable_packed();
    using Field = v1::Tensor* (v1::Span::*)();
    auto pack = [&](Field field, bool (v1::Span::*has)() const,
                    v1::RegionRef* ref) -> absl::Status {
      uint64_t bytes = 0;
      bool any = false;
      for (v1::Span& s : *request->mutable_spans()) {
        if (!(s.*has)()) continue;
        any = true;
        bytes += (s.*field)()->inline_data().size();
      }
      if (!any) return absl::OkStatus();
      SMLA_RETURN_IF_ERROR(take(bytes, ref));
      uint64_t at_bytes = ref->offset();
      for (v1::Span& s : *request->mutable_spans()) {
        if (!(s.*has)()) continue;
        const std::string& b = (s.*field)()->inline_data();
        if (!b.empty()) std::memcpy(data + at_bytes, b.data(), b.size());
        at_bytes += b.size();
      }
      return absl::OkStatus();
    };
    if (absl::Status st =
            pack(&v1::Span::mutable_kv_rows, &v1::Span::has_kv_rows, packed->mutable_kv_rows());
        !st.ok()) {
      return st;
    }
    if (absl::Status st = pack(&v1::Span::mutable_q, &v1::Span::has_q, packed->mutable_q());
        !st.ok()) {
      return st;
    }
    // MXFP8 queries: their scale bytes (a request's spans share one query format). Asked for
    // only when present: mutable_q_scales() would mark the packed queries MXFP8.
    if (request->spans_size() > 0 && request->spans(0).has_q_scales()) {
      if (absl::Status st = pack(&v1::Span::mutable_q_scales, &v1::Span::has_q_scales,
                                 packed->mutable_q_scales());
          !st.ok()) {
        return st;
      }
    }
    bool any_compressed = false;
    for (const v1::Span& s : request->spans()) any_compressed |= s.has_compressed_rows();
    if (any_compressed) {
      if (absl::Status st = pack(&v1::Span::mutable_compressed_rows, &v1::Span::has_compressed_rows,
                                 packed->mutable_compressed_rows());
          !st.ok()) {
        return st;
      }
    }
    if (topk_width >= 0) {
      const uint64_t bytes = static_cast<uint64_t>(topk_rows * topk_width) * 4;
      SMLA_RETURN_IF_ERROR(take(bytes, packed->mutable_topk()));
      int32_t* out = reinterpret_cast<int32_t*>(data + packed->topk().offset());
      for (const v1::Span& s : request->spans()) {
        const int64_t rows = s.topk().shape(0), k = s.topk().shape(1);
        const char* in = s.topk().inline_data().data();
        for (int64_t t = 0; t < rows; ++t, out += topk_width) {
          if (k > 0) std::memcpy(out, in + t * k * 4, static_cast<size_t>(k) * 4);
          std::fill(out + k, out + topk_width, -1);
        }
      }
      packed->set_topk_width(static_cast<int32_t>(topk_width));
    }
    for (v1::Span& s : *request->mutable_spans()) {
      s.clear_kv_rows();
      s.clear_q();
      s.clear_q_scales();
      s.clear_compressed_rows();
      s.clear_topk();
    }
  }
  for (v1::Tensor* t : layout == Layout::kPacked ? std::vector<v1::Tensor*>{} : Inputs(request)) {
    std::string bytes = std::move(*t->mutable_inline_data());
    v1::RegionRef ref;
    SMLA_RETURN_IF_ERROR(take(bytes.size(), &ref));
    if (!bytes.empty()) std::memcpy(data + ref.offset(), bytes.data(), bytes.size());
    *t->mutable_region() = ref;
  }
  SMLA_RETURN_IF_ERROR(take(o.out, request->mutable_out_region()));
  if (o.scales > 0) {
    SMLA_RETURN_IF_ERROR(take(o.scales, request->mutable_mx_scales_region()));
  }
  if (o.lse > 0) {
    SMLA_RETURN_IF_ERROR(take(o.lse, request->mutable_lse_region()));
  }
  return at;
}

namespace {

// The bytes of a tensor that names region `name` of `size` bytes at `data` (bounds checked).
absl::StatusOr<std::span<const uint8_t>> BytesIn(const uint8_t* data, uint64_t size,
                                                 const std::string& name,
                                                 const v1::Tensor& tensor) {
  if (tensor.data_case() != v1::Tensor::kRegion || tensor.region().region() != name) {
    return absl::InvalidArgumentError(absl::StrCat("tensor does not name region ", name));
  }
  const v1::RegionRef& r = tensor.region();
  if (!v1::region::RefInBounds(r.offset(), r.size(), size)) {
    return absl::OutOfRangeError(v1::region::OutsideText(r.offset(), r.size(), name, size));
  }
  return std::span<const uint8_t>(data + r.offset(), r.size());
}

}  // namespace

absl::StatusOr<std::span<const uint8_t>> ShmRegion::Bytes(const v1::Tensor& tensor) const {
  return BytesIn(data_, size_, name_, tensor);
}

absl::Status ShmRegion::Inline(v1::StepResponse* response) const {
  return InlineFrom(data_, size_, name_, response);
}

absl::Status ShmRegion::InlineFrom(const uint8_t* data, uint64_t size, const std::string& name,
                                   v1::StepResponse* response) {
  for (v1::Tensor* t :
       {response->mutable_out(), response->mutable_mx_scales(), response->mutable_lse()}) {
    if (t->data_case() != v1::Tensor::kRegion) continue;
    SMLA_ASSIGN_OR_RETURN(auto b, BytesIn(data, size, name, *t));
    t->set_inline_data(b.data(), b.size());
  }
  // mutable_* above created empty tensors for unset fields; drop them again.
  if (response->mx_scales().dtype() == v1::DTYPE_UNSPECIFIED) response->clear_mx_scales();
  if (response->lse().dtype() == v1::DTYPE_UNSPECIFIED) response->clear_lse();
  return absl::OkStatus();
}

}  // namespace smla::client

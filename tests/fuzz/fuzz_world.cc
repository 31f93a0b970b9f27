#include "fuzz_world.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "edge/packed_step_decoder.h"
#include "edge/request_reader.h"
#include "edge/step_view.h"
#include "google/protobuf/stubs/logging.h"
#include "google/protobuf/util/message_differencer.h"
#include "smla/client/shm.h"
#include "smla/kernels/cpu_backend.h"
#include "smla/server/model_profile.h"

namespace smla::fuzz {
namespace {

constexpr char kTenant[] = "fuzz";

[[noreturn]] void Die(const absl::Status& st) {
  std::fprintf(stderr, "fuzz world: %s\n", st.ToString().c_str());
  std::abort();
}

// The input as gRPC might hand it over: slices whose lengths the input's own bytes pick.
grpc::ByteBuffer Sliced(const uint8_t* data, size_t size) {
  std::vector<grpc::Slice> slices;
  uint64_t h = 1469598103934665603ull;
  size_t at = 0;
  while (at < size) {
    h = (h ^ data[at]) * 1099511628211ull;
    const size_t n = std::min<size_t>(size - at, 1 + (h >> 40) % 97);
    slices.emplace_back(data + at, n);
    at += n;
  }
  if (slices.empty()) slices.emplace_back("", 0);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// `read` with its landed tensor bytes put back as inline_data: what protobuf would have parsed.
void Restore(const google::protobuf::Message& read, const server::edge::LandedTensors& landed,
             google::protobuf::Message* out) {
  const google::protobuf::Reflection* rr = read.GetReflection();
  const google::protobuf::Reflection* ro = out->GetReflection();
  if (read.GetDescriptor() == v1::Tensor::descriptor()) {
    const auto it = landed.bytes.find(static_cast<const v1::Tensor*>(&read));
    auto* t = static_cast<v1::Tensor*>(out);
    if (it != landed.bytes.end() && !t->has_region()) {
      t->set_inline_data(it->second.data(), it->second.size());
    }
    return;
  }
  const google::protobuf::Descriptor* d = read.GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    if (f->type() != google::protobuf::FieldDescriptor::TYPE_MESSAGE) continue;
    if (f->is_repeated()) {
      for (int j = 0; j < rr->FieldSize(read, f); ++j) {
        Restore(rr->GetRepeatedMessage(read, f, j), landed, ro->MutableRepeatedMessage(out, f, j));
      }
    } else if (rr->HasField(read, f)) {
      Restore(rr->GetMessage(read, f), landed, ro->MutableMessage(out, f));
    }
  }
}

}  // namespace

FuzzWorld& FuzzWorld::Get() {
  static FuzzWorld* world = [] {
    // Protobuf logs every string field with invalid UTF-8; mutated inputs are full of them.
    google::protobuf::SetLogHandler(
        [](google::protobuf::LogLevel, const char*, int, const std::string&) {});
    auto* w = new FuzzWorld();
    server::ServerConfig config;
    for (const char* spec : {"dsv4.1-flash:tp=8:kv=fp8_dsv4:page_rows=16:pool=4MiB",
                             "glm-5.3-flash:tp=8:page_rows=16:pool=4MiB"}) {
      auto m = server::ParseModelConfig(spec);
      if (!m.ok()) Die(m.status());
      config.models.push_back(*m);
    }
    // Small limits keep each input fast: a few hundred rows at most.
    config.limits.max_rows_per_step = 96;
    config.limits.max_spans_per_step = 6;
    config.limits.max_batch_rows = 96;
    config.limits.max_context = 2048;
    config.limits.max_sequences = 16;
    w->limits_ = config.limits;
    kernels::BackendOptions bo;
    bo.cpu_threads = 1;
    auto backend = kernels::CreateCpuBackend(bo);
    if (!backend.ok()) Die(backend.status());
    auto core = server::ServiceCore::Create(config, *std::move(backend));
    if (!core.ok()) Die(core.status());
    w->core_ = *std::move(core);
    for (const server::ModelConfig& m : w->core_->Info().models) {
      const server::ModelProfile* p = server::FindProfile(m.profile);
      w->models_[m.profile] = server::edge::MakeWireModel(m.heads_per_rank, *p);
      if (p->has_sink) {
        std::vector<float> sinks(int64_t{p->num_layers()} * m.heads_per_rank, 0.5f);
        if (auto st = w->core_->SetSinks(m.profile, sinks); !st.ok()) Die(st);
      }
      if (p->geometry != kernels::Geometry::kRopeInside) continue;
      const int32_t positions = static_cast<int32_t>(config.limits.max_context);
      std::vector<float> rope(int64_t{positions} * 64);
      for (int32_t pos = 0; pos < positions; ++pos) {
        for (int k = 0; k < 32; ++k) {
          const double a = pos * std::pow(10000.0, -k / 32.0);
          rope[pos * 64 + k] = static_cast<float>(std::cos(a));
          rope[pos * 64 + 32 + k] = static_cast<float>(std::sin(a));
        }
      }
      if (auto st = w->core_->SetRopeTable(m.profile, rope, positions); !st.ok()) Die(st);
    }
    // The regions: sealed memfds, as clients hand them over; the registry names them.
    w->regions_ = std::make_unique<server::edge::RegionRegistry>();
    for (const auto& [name, tenant, bytes] :
         {std::tuple{&w->region_name_, kTenant, kRegionBytes},
          std::tuple{&w->foreign_region_name_, "other", uint64_t{4096}}}) {
      absl::StatusOr<int> fd = client::SealedMemfd("fuzz", bytes);
      if (!fd.ok()) Die(fd.status());
      server::edge::OwnedFd object(*fd);
      if (name == &w->region_name_) {
        void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, object.get(), 0);
        if (p == MAP_FAILED) Die(absl::InternalError("fuzz world: cannot map the region"));
        w->region_data_ = static_cast<uint8_t*>(p);
      }
      absl::StatusOr<std::string> registered =
          w->regions_->Register(tenant, w->regions_->NewSession(), std::move(object), bytes, {});
      if (!registered.ok()) Die(registered.status());
      *name = *registered;
    }
    w->staging_ = std::make_unique<server::edge::StagingPool>(server::edge::HostPinning{},
                                                              server::edge::StagingPool::Options{});
    server::edge::EdgeOptions eo;
    eo.limits = config.limits;
    server::edge::FillServerInfo(*w->core_, eo, &w->info_);
    return w;
  }();
  return *world;
}

absl::Status FuzzWorld::RunOne(const uint8_t* data, size_t size) {
  v1::StepRequest want;
  const bool parses = want.ParseFromArray(data, static_cast<int>(size));
  v1::StepRequest pb;
  server::edge::ParseStorage storage;
  absl::Status read = server::edge::ReadStepRequest(
      Sliced(data, size), *staging_, nullptr, kTenant, &pb, &storage.landed,
      size % 2 == 0 ? 0 : server::edge::kWalkFromBytes);
  if (read.ok() != parses) {
    Die(absl::InternalError(absl::StrCat("the request reader ", read.ok() ? "accepts" : "refuses",
                                         " what protobuf ", parses ? "parses" : "refuses", ": ",
                                         read.ToString())));
  }
  // The packed-step decoder (the step ring's reader) reads only what protobuf reads, as it
  // reads it.
  server::edge::StepView decoded;
  if (server::edge::DecodePackedStep({data, size}, &decoded)) {
    server::edge::StepView want_view;
    if (parses) server::edge::ViewOf(want, &want_view);
    if (!parses || !(decoded == want_view)) {
      Die(absl::InternalError(absl::StrCat("the packed-step decoder accepts what protobuf ",
                                           parses ? "reads otherwise" : "refuses")));
    }
  }
  if (!parses) return read;
  v1::StepRequest restored = pb;
  Restore(pb, storage.landed, &restored);
  if (!google::protobuf::util::MessageDifferencer::Equals(want, restored)) {
    Die(absl::InternalError("the request reader's message differs from protobuf's"));
  }
  std::set<std::string> created;
  for (const v1::Span& s : pb.spans()) {
    if (created.size() >= 4) break;
    if (!created.contains(s.sequence_id()) &&
        core_->CreateSequence(kTenant, pb.model(), s.sequence_id()).ok()) {
      created.insert(s.sequence_id());
    }
  }
  std::memset(region_data_, 0, kIdsAt);
  std::memset(region_data_ + kIdsAt, 0xff, kOutputsAt - kIdsAt);
  server::StepRequest step;
  const auto it = models_.find(pb.model());
  const server::edge::RegionContext regions{regions_.get(), kTenant};
  absl::Status st = server::edge::ParseStepRequest(pb, it == models_.end() ? nullptr : &it->second,
                                                   limits_, &step, &storage, &regions);
  if (st.ok()) {
    step.tenant = kTenant;
    absl::Notification done;
    core_->Submit(std::move(step), [&](const absl::StatusOr<server::StepResult>& r) {
      st = r.status();
      done.Notify();
    });
    done.WaitForNotification();
  }
  for (const std::string& id : created) {
    if (absl::Status r = core_->ReleaseSequence(kTenant, pb.model(), id); !r.ok()) {
      Die(r);  // a sequence this input created must still be there
    }
  }
  return st;
}

}  // namespace smla::fuzz

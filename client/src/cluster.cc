#include "smla/client/cluster.h"

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "smla/base/status_macros.h"

namespace smla::client {
namespace {

// Marks the message of lost-sequence statuses so IsSequenceLost does not depend on wording.
constexpr char kLostTag[] = "sequence lost: ";

absl::StatusOr<std::pair<std::string, std::string>> SplitHostPort(const std::string& hp) {
  std::string host;
  std::string port;
  if (!hp.empty() && hp.front() == '[') {
    const size_t close = hp.find(']');
    if (close == std::string::npos || close + 1 >= hp.size() || hp[close + 1] != ':') {
      return absl::InvalidArgumentError(absl::StrCat("'", hp, "' is not [IPv6]:PORT"));
    }
    host = hp.substr(1, close - 1);
    port = hp.substr(close + 2);
  } else {
    const size_t colon = hp.rfind(':');
    if (colon == std::string::npos || hp.find(':') != colon) {
      return absl::InvalidArgumentError(absl::StrCat("'", hp, "' is not HOST:PORT"));
    }
    host = hp.substr(0, colon);
    port = hp.substr(colon + 1);
  }
  int p = 0;
  if (host.empty() || !absl::SimpleAtoi(port, &p) || p <= 0 || p > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("'", hp, "' is not HOST:PORT"));
  }
  return std::make_pair(host, port);
}

}  // namespace

uint64_t HashRing::Hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

void HashRing::Add(const std::string& server) {
  for (int i = 0; i < virtual_nodes_; ++i) {
    // A collision between two servers' points keeps the first; the loss is one point.
    points_.emplace(Hash(absl::StrCat(server, "#", i)), server);
  }
}

void HashRing::Remove(const std::string& server) {
  for (auto it = points_.begin(); it != points_.end();) {
    it = it->second == server ? points_.erase(it) : std::next(it);
  }
}

absl::StatusOr<std::vector<std::string>> ResolveServers(const std::string& host_port) {
  SMLA_ASSIGN_OR_RETURN(auto split, SplitHostPort(host_port));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  const int rc = getaddrinfo(split.first.c_str(), split.second.c_str(), &hints, &result);
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("resolving '", split.first, "': ", gai_strerror(rc)));
  }
  std::set<std::string> out;
  for (addrinfo* a = result; a != nullptr; a = a->ai_next) {
    char host[NI_MAXHOST];
    if (getnameinfo(a->ai_addr, a->ai_addrlen, host, sizeof host, nullptr, 0, NI_NUMERICHOST) !=
        0) {
      continue;
    }
    out.insert(a->ai_family == AF_INET6 ? absl::StrCat("[", host, "]:", split.second)
                                        : absl::StrCat(host, ":", split.second));
  }
  freeaddrinfo(result);
  if (out.empty()) {
    return absl::UnavailableError(absl::StrCat("'", split.first, "' has no addresses"));
  }
  return std::vector<std::string>(out.begin(), out.end());
}

bool IsSequenceLost(const absl::Status& status) {
  return status.code() == absl::StatusCode::kDataLoss &&
         absl::StartsWith(status.message(), kLostTag);
}

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Connect(const ClusterOptions& options) {
  std::vector<std::string> servers = options.servers;
  if (!options.dns_name.empty()) {
    SMLA_ASSIGN_OR_RETURN(auto resolved, ResolveServers(options.dns_name));
    servers.insert(servers.end(), resolved.begin(), resolved.end());
  }
  if (servers.empty()) return absl::InvalidArgumentError("cluster: no servers and no dns_name");
  if (options.virtual_nodes < 1) return absl::InvalidArgumentError("cluster: virtual_nodes < 1");
  std::unique_ptr<Cluster> c(new Cluster(options));
  {
    absl::MutexLock lock(&c->mu_);
    for (const std::string& s : servers) {
      SMLA_RETURN_IF_ERROR(SplitHostPort(s).status());
      c->AddServerLocked(s);
    }
  }
  SMLA_RETURN_IF_ERROR(c->Refresh());
  return c;
}

void Cluster::AddServerLocked(const std::string& server) {
  if (nodes_.contains(server)) return;
  ClientOptions o = options_.client;
  o.target = server;
  auto client = Client::Connect(o);
  // Connect only fails on an empty target, which SplitHostPort already rejected.
  nodes_[server].client = std::move(*client);
  ring_.Add(server);
}

std::vector<std::string> Cluster::Servers() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  out.reserve(nodes_.size());
  for (const auto& [s, n] : nodes_) out.push_back(s);
  return out;
}

std::vector<std::string> Cluster::LiveServers() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [s, n] : nodes_) {
    if (n.live) out.push_back(s);
  }
  return out;
}

std::unique_ptr<Client> Cluster::Probe(const std::string& server) const {
  // A fresh channel each time: a channel that failed before sits in reconnect backoff and
  // would fail the probe without trying, or keep a returned server waiting for minutes.
  ClientOptions o = options_.client;
  o.target = server;
  auto client = Client::Connect(o);
  if (!client.ok()) return nullptr;
  auto stub = grpc::health::v1::Health::NewStub((*client)->channel());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   absl::ToChronoMicroseconds(options_.probe_timeout));
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  if (!stub->Check(&ctx, req, &resp).ok() ||
      resp.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    return nullptr;
  }
  return *std::move(client);
}

absl::Status Cluster::LostStatus(const std::string& key, const std::string& server) const {
  return absl::DataLossError(absl::StrCat(
      kLostTag, "'", key, "' was on server ", server,
      ", which is down; its KV cache is gone (Release it, then create and prefill it again)"));
}

void Cluster::MarkDown(const std::string& server) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(server);
  if (it == nodes_.end()) return;
  it->second.live = false;
  for (auto& [key, p] : placements_) {
    if (p.server == server) p.lost = true;
  }
}

bool Cluster::ReportFailure(const std::string& server) {
  {
    absl::MutexLock lock(&mu_);
    if (!nodes_.contains(server)) return false;
  }
  if (Probe(server) != nullptr) return true;
  MarkDown(server);
  return false;
}

absl::Status Cluster::ReplayTables(Client& client) {
  std::map<std::string, Table> rope;
  std::map<std::string, Table> sinks;
  {
    absl::MutexLock lock(&mu_);
    rope = rope_tables_;
    sinks = sinks_;
  }
  for (const auto& [model, t] : rope) {
    SMLA_RETURN_IF_ERROR(client.SetRopeTable(model, t.values, t.dim0));
  }
  for (const auto& [model, t] : sinks) {
    SMLA_RETURN_IF_ERROR(client.SetSinks(model, t.values, t.dim0, t.dim1));
  }
  return absl::OkStatus();
}

absl::Status Cluster::Refresh() {
  if (!options_.dns_name.empty()) {
    auto resolved = ResolveServers(options_.dns_name);
    // A name that stops resolving (every pod gone) leaves the known servers as they are;
    // their probes below decide.
    if (resolved.ok()) {
      absl::MutexLock lock(&mu_);
      for (const std::string& s : *resolved) AddServerLocked(s);
    }
  }
  std::vector<std::string> down;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [s, n] : nodes_) {
      if (!n.live) down.push_back(s);
    }
  }
  for (const std::string& server : down) {
    std::unique_ptr<Client> client = Probe(server);
    if (client == nullptr || !ReplayTables(*client).ok()) continue;
    absl::MutexLock lock(&mu_);
    Node& node = nodes_[server];
    // The probe's channel is fresh; the old one may still be in reconnect backoff. Callers
    // may hold the old client (ClientFor), so it is kept.
    retired_.push_back(std::move(node.client));
    node.client = std::move(client);
    node.live = true;
  }
  return absl::OkStatus();
}

absl::StatusOr<Sequence> Cluster::CreateSequence(const std::string& model, const std::string& id) {
  const std::string key = Key(model, id);
  // Each failed server is probed and skipped; at most every server is tried once.
  for (;;) {
    std::string server;
    Client* client = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (placements_.contains(key)) {
        return absl::AlreadyExistsError(
            absl::StrCat("cluster: sequence '", key, "' exists on ", placements_[key].server));
      }
      server = ring_.Find(key, [this](const std::string& s)
                                   ABSL_NO_THREAD_SAFETY_ANALYSIS { return nodes_.at(s).live; });
      if (server.empty()) {
        return absl::UnavailableError(
            absl::StrCat("cluster: no live server for '", key, "' (", nodes_.size(), " known)"));
      }
      client = nodes_[server].client.get();
    }
    auto seq = client->CreateSequence(model, id);
    if (seq.ok()) {
      absl::MutexLock lock(&mu_);
      placements_[key] = Placement{server, false};
      return seq;
    }
    if (seq.status().code() != absl::StatusCode::kUnavailable || ReportFailure(server)) {
      return absl::Status(seq.status().code(), absl::StrCat(server, ": ", seq.status().message()));
    }
  }
}

absl::StatusOr<std::pair<std::string, Client*>> Cluster::Route(const std::string& model,
                                                               const std::string& id) const {
  const std::string key = Key(model, id);
  absl::MutexLock lock(&mu_);
  auto it = placements_.find(key);
  if (it == placements_.end()) {
    return absl::NotFoundError(absl::StrCat("cluster: sequence '", key, "' was not created here"));
  }
  if (it->second.lost) return LostStatus(key, it->second.server);
  return std::make_pair(it->second.server, nodes_.at(it->second.server).client.get());
}

absl::StatusOr<std::string> Cluster::ServerOf(const Sequence& sequence) const {
  SMLA_ASSIGN_OR_RETURN(auto r, Route(sequence.model, sequence.id));
  return r.first;
}

absl::StatusOr<Client*> Cluster::ClientFor(const Sequence& sequence) {
  SMLA_ASSIGN_OR_RETURN(auto r, Route(sequence.model, sequence.id));
  return r.second;
}

absl::Status Cluster::AfterFailure(const absl::Status& status, const std::string& server,
                                   const std::string& key) {
  // UNAVAILABLE is both "cannot connect" and "overloaded"; the probe tells them apart.
  if (status.code() == absl::StatusCode::kUnavailable && !ReportFailure(server)) {
    return absl::DataLossError(
        absl::StrCat(LostStatus(key, server).message(), " [", server, ": ", status.message(), "]"));
  }
  return status;
}

absl::StatusOr<v1::StepResponse> Cluster::Step(const v1::StepRequest& request,
                                               absl::Duration timeout) {
  if (request.spans_size() == 0) return absl::InvalidArgumentError("cluster: step has no spans");
  std::string server;
  Client* client = nullptr;
  std::string first;
  for (const v1::Span& span : request.spans()) {
    SMLA_ASSIGN_OR_RETURN(auto r, Route(request.model(), span.sequence_id()));
    if (server.empty()) {
      server = r.first;
      client = r.second;
      first = span.sequence_id();
    } else if (r.first != server) {
      return absl::InvalidArgumentError(
          absl::StrCat("cluster: one step spans two servers: '", first, "' is on ", server, ", '",
                       span.sequence_id(), "' on ", r.first, " (send one step per server)"));
    }
  }
  auto resp = client->Step(request, timeout);
  if (resp.ok()) return resp;
  return AfterFailure(resp.status(), server, Key(request.model(), first));
}

absl::Status Cluster::Truncate(const Sequence& sequence, int64_t length) {
  SMLA_ASSIGN_OR_RETURN(auto r, Route(sequence.model, sequence.id));
  absl::Status st = r.second->Truncate(sequence, length);
  return st.ok() ? st : AfterFailure(st, r.first, Key(sequence.model, sequence.id));
}

absl::StatusOr<int64_t> Cluster::Length(const Sequence& sequence, int32_t layer) {
  SMLA_ASSIGN_OR_RETURN(auto r, Route(sequence.model, sequence.id));
  auto len = r.second->Length(sequence, layer);
  if (len.ok()) return len;
  return AfterFailure(len.status(), r.first, Key(sequence.model, sequence.id));
}

absl::Status Cluster::Release(const Sequence& sequence) {
  const std::string key = Key(sequence.model, sequence.id);
  auto r = Route(sequence.model, sequence.id);
  if (!r.ok()) {
    if (!IsSequenceLost(r.status())) return r.status();
    absl::MutexLock lock(&mu_);
    placements_.erase(key);
    return absl::OkStatus();
  }
  absl::Status st = r->second->Release(sequence);
  if (!st.ok()) st = AfterFailure(st, r->first, key);
  if (st.ok() || IsSequenceLost(st)) {
    absl::MutexLock lock(&mu_);
    placements_.erase(key);
    return absl::OkStatus();
  }
  return st;
}

absl::Status Cluster::SetRopeTable(const std::string& model, std::span<const float> cos_sin,
                                   int32_t positions) {
  std::vector<std::pair<std::string, Client*>> live;
  {
    absl::MutexLock lock(&mu_);
    rope_tables_[model] = Table{{cos_sin.begin(), cos_sin.end()}, positions, 64};
    for (auto& [s, n] : nodes_) {
      if (n.live) live.emplace_back(s, n.client.get());
    }
  }
  for (auto& [server, client] : live) {
    absl::Status st = client->SetRopeTable(model, cos_sin, positions);
    if (!st.ok() && (st.code() != absl::StatusCode::kUnavailable || ReportFailure(server))) {
      return absl::Status(st.code(), absl::StrCat(server, ": ", st.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status Cluster::SetSinks(const std::string& model, std::span<const float> sinks,
                               int32_t layers, int32_t heads) {
  std::vector<std::pair<std::string, Client*>> live;
  {
    absl::MutexLock lock(&mu_);
    sinks_[model] = Table{{sinks.begin(), sinks.end()}, layers, heads};
    for (auto& [s, n] : nodes_) {
      if (n.live) live.emplace_back(s, n.client.get());
    }
  }
  for (auto& [server, client] : live) {
    absl::Status st = client->SetSinks(model, sinks, layers, heads);
    if (!st.ok() && (st.code() != absl::StatusCode::kUnavailable || ReportFailure(server))) {
      return absl::Status(st.code(), absl::StrCat(server, ": ", st.message()));
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> Cluster::LostSequences() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [key, p] : placements_) {
    if (p.lost) out.push_back(key);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace smla::client

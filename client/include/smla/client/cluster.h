// Scale-out: one logical service over several smla-servers. A sequence's KV cache lives in
// exactly one server's pools, so the cluster places each new sequence by consistent hashing
// of its id, remembers where it went, and sends every later call for it there. When that
// server dies the sequence is reported lost (DATA_LOSS naming sequence and server): the
// cache cannot be rebuilt elsewhere without the caller re-sending the prefix, so the
// cluster never does it behind the caller's back. New sequences go to live servers.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "smla/client/client.h"

namespace smla::client {

// A consistent-hash ring with virtual nodes. The hash is fixed (not process-salted), so
// every client process computes the same placement for the same server set.
class HashRing {
 public:
  explicit HashRing(int virtual_nodes = 160) : virtual_nodes_(virtual_nodes) {}

  void Add(const std::string& server);
  void Remove(const std::string& server);
  bool empty() const { return points_.empty(); }

  // The first server clockwise from hash(key) for which `usable(server)` is true; empty
  // when none is. `usable` lets dead servers stay on the ring (so placement of other keys
  // does not move) while being skipped.
  template <typename Pred>
  std::string Find(const std::string& key, Pred usable) const;
  std::string Find(const std::string& key) const {
    return Find(key, [](const std::string&) { return true; });
  }

  // 64-bit FNV-1a followed by a murmur3 finaliser (FNV alone clusters similar strings).
  static uint64_t Hash(const std::string& s);

 private:
  int virtual_nodes_;
  std::map<uint64_t, std::string> points_;
};

template <typename Pred>
std::string HashRing::Find(const std::string& key, Pred usable) const {
  if (points_.empty()) return {};
  auto it = points_.lower_bound(Hash(key));
  for (size_t n = 0; n < points_.size(); ++n, ++it) {
    if (it == points_.end()) it = points_.begin();
    if (usable(it->second)) return it->second;
  }
  return {};
}

// "HOST:PORT" -> every address getaddrinfo gives for HOST (a headless Service's name gives
// one per ready pod), as "IP:PORT" / "[IPv6]:PORT", sorted and without duplicates.
absl::StatusOr<std::vector<std::string>> ResolveServers(const std::string& host_port);

// True for the status a call gets when its sequence was on a server that died.
bool IsSequenceLost(const absl::Status& status);

struct ClusterOptions {
  // The servers, "HOST:PORT" each. Or, instead:
  std::vector<std::string> servers;
  // "NAME:PORT" resolved with ResolveServers at Connect and at every Refresh.
  std::string dns_name;
  int virtual_nodes = 160;
  // Per-server client settings (target is set per server).
  ClientOptions client;
  // Deadline of the health probe that decides whether a failed server is dead.
  absl::Duration probe_timeout = absl::Seconds(2);
};

class Cluster {
 public:
  // Probes every server once; those not SERVING start as down. Fails only when no server is
  // given or the name does not resolve.
  static absl::StatusOr<std::unique_ptr<Cluster>> Connect(const ClusterOptions& options);

  // Every known server, live or not, sorted.
  std::vector<std::string> Servers() const;
  std::vector<std::string> LiveServers() const;

  // Creates the sequence on the live server the ring picks for `id` and records it there.
  absl::StatusOr<Sequence> CreateSequence(const std::string& model, const std::string& id);
  // The server holding the sequence: NOT_FOUND when this cluster did not create it, the
  // lost status when its server died.
  absl::StatusOr<std::string> ServerOf(const Sequence& sequence) const;
  // The client of the sequence's server, for streams. The pointer lives as long as the
  // cluster. A failure seen on a stream should be passed to ReportFailure.
  absl::StatusOr<Client*> ClientFor(const Sequence& sequence);

  // One step; every span's sequence must be on the same server (one step is one launch).
  absl::StatusOr<v1::StepResponse> Step(const v1::StepRequest& request,
                                        absl::Duration timeout = absl::ZeroDuration());
  absl::Status Truncate(const Sequence& sequence, int64_t length);
  absl::StatusOr<int64_t> Length(const Sequence& sequence, int32_t layer);
  // Releases and forgets the sequence. A lost sequence is only forgotten (its server and
  // cache are gone) and OK is returned: Release is how a caller acknowledges the loss.
  absl::Status Release(const Sequence& sequence);

  // Per-model tables go to every live server and are replayed to servers that (re)join.
  absl::Status SetRopeTable(const std::string& model, std::span<const float> cos_sin,
                            int32_t positions);
  absl::Status SetSinks(const std::string& model, std::span<const float> sinks, int32_t layers,
                        int32_t heads);

  // Call after a failed call to `server` outside this class (a stream): probes it and, when
  // it is not SERVING, marks it down and its sequences lost. Returns the probe's verdict.
  bool ReportFailure(const std::string& server);
  // Re-resolves dns_name (new addresses join), and re-probes down servers: one that answers
  // SERVING again takes new sequences (after the tables are replayed); its old sequences
  // stay lost, since a restarted server has an empty cache.
  absl::Status Refresh();

  // Sequences recorded as lost and not yet released, "model/id".
  std::vector<std::string> LostSequences() const;

 private:
  struct Placement {
    std::string server;
    bool lost = false;
  };
  struct Table {
    std::vector<float> values;
    int32_t dim0 = 0;
    int32_t dim1 = 0;
  };
  struct Node {
    std::unique_ptr<Client> client;
    bool live = false;
  };

  explicit Cluster(const ClusterOptions& options)
      : options_(options), ring_(options.virtual_nodes) {}
  static std::string Key(const std::string& model, const std::string& id) {
    return model + "/" + id;
  }
  absl::Status LostStatus(const std::string& key, const std::string& server) const;
  // Adds a server (down until probed). Requires mu_.
  void AddServerLocked(const std::string& server) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A new client of `server` when it answers SERVING within probe_timeout, else null.
  std::unique_ptr<Client> Probe(const std::string& server) const;
  // Marks `server` down and every sequence on it lost.
  void MarkDown(const std::string& server);
  // Replays the recorded tables to `client`.
  absl::Status ReplayTables(Client& client);
  // Resolves the sequence to (server, client) or the lost / not-found status.
  absl::StatusOr<std::pair<std::string, Client*>> Route(const std::string& model,
                                                        const std::string& id) const;
  // Applied to every failed call: an UNAVAILABLE from a server that then fails its probe
  // turns into the lost status of `key`.
  absl::Status AfterFailure(const absl::Status& status, const std::string& server,
                            const std::string& key);

  const ClusterOptions options_;
  mutable absl::Mutex mu_;
  HashRing ring_ ABSL_GUARDED_BY(mu_);
  // Nodes are never erased and replaced clients are retired, not destroyed, so Client
  // pointers handed out stay valid.
  std::map<std::string, Node> nodes_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Client>> retired_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Placement> placements_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Table> rope_tables_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Table> sinks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace smla::client

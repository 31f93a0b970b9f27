// Authentication at the edge: TLS / mTLS server credentials from PEM files, bearer tokens
// mapped to tenants, and the tenant each call acts for.
//
// Tokens arrive as "authorization: Bearer <token>". With secure credentials an
// AuthMetadataProcessor checks them before the handler runs and records the tenant in the
// call's auth context; with plaintext (where gRPC runs no processor) the handler checks the
// metadata itself. A call without a token is refused by the smla.v1 handlers only, so health
// probes and reflection work without one; a call with a wrong token is refused everywhere on
// secure ports. Tokens are never logged or echoed in errors.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/security/auth_metadata_processor.h"

namespace smla::server::edge {

struct AuthOptions {
  std::string tls_cert;       // PEM server certificate chain; with tls_key enables TLS
  std::string tls_key;        // PEM private key
  std::string tls_client_ca;  // PEM CA bundle: clients must present a certificate it signed
  std::string token_file;     // lines "token tenant"; '#' starts a comment
  bool allow_insecure_remote = false;
};

// Tokens by value; loaded once at start.
class TokenTable {
 public:
  // Warns (spdlog) when the file is readable by group or others.
  static absl::StatusOr<std::shared_ptr<const TokenTable>> Load(const std::string& path);
  static std::shared_ptr<const TokenTable> FromMap(
      absl::flat_hash_map<std::string, std::string> tenant_by_token);

  // The tenant of `token`, or null. Compares every stored token in constant time per byte so
  // the answer's timing does not reveal a prefix.
  const std::string* Find(std::string_view token) const;
  size_t size() const { return tenant_by_token_.size(); }

 private:
  absl::flat_hash_map<std::string, std::string> tenant_by_token_;
};

// The tenant a call acts for.
class Authenticator {
 public:
  // `tokens` may be null (mTLS without tokens): then every call acts for its verified client
  // certificate's common name.
  explicit Authenticator(std::shared_ptr<const TokenTable> tokens);

  // UNAUTHENTICATED when tokens are configured and the call has none or a wrong one, or, without
  // tokens, when the client certificate has no common name or an empty one (such certificates
  // name no tenant; they must not share one).
  absl::StatusOr<std::string> TenantOf(const grpc::CallbackServerContext& ctx) const;

  const std::shared_ptr<const TokenTable>& tokens() const { return tokens_; }

 private:
  std::shared_ptr<const TokenTable> tokens_;
};

// The auth-context property the processor sets to the call's tenant.
inline constexpr char kTenantProperty[] = "smla_tenant";

// Checks bearer tokens on secure ports (gRPC runs processors only with secure credentials).
class TokenAuthProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenAuthProcessor(std::shared_ptr<const TokenTable> tokens)
      : tokens_(std::move(tokens)) {}
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

 private:
  std::shared_ptr<const TokenTable> tokens_;
};

// The token of an "authorization" value ("Bearer <token>"), or empty.
std::string_view BearerToken(std::string_view authorization);

// True for 127.0.0.0/8, ::1 and localhost.
bool IsLoopbackHost(std::string_view host);

// Server credentials for `options` (TLS when a certificate is given, else plaintext), and the
// start-up rule: plaintext without tokens only on loopback unless allow_insecure_remote.
// `listen` is the gRPC HOST:PORT.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const AuthOptions& options, const std::string& listen,
    const std::shared_ptr<const TokenTable>& tokens);

// Open StepStream calls per tenant, bounded by a quota (0 = none).
class TenantStreams {
 public:
  explicit TenantStreams(int32_t max_per_tenant) : max_(max_per_tenant) {}
  // RESOURCE_EXHAUSTED naming the quota when the tenant already has the most streams open.
  absl::Status Open(const std::string& tenant);
  void Close(const std::string& tenant);

 private:
  const int32_t max_;
  absl::Mutex mu_;
  std::map<std::string, int32_t> open_ ABSL_GUARDED_BY(mu_);
};

}  // namespace smla::server::edge

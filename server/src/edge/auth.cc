#include "auth.h"

#include <arpa/inet.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "edge_metrics.h"
#include "smla/base/strings.h"
#include "spdlog/spdlog.h"

namespace smla::server::edge {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(flag, ": cannot read '", path, "'"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool ConstantTimeEqual(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const TokenTable>> TokenTable::Load(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && (st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    spdlog::warn("token file {} is accessible by group or others (mode {:o}); chmod 600 it", path,
                 st.st_mode & 0777);
  }
  absl::StatusOr<std::string> text = ReadFile(path, "--token_file");
  if (!text.ok()) return text.status();
  absl::flat_hash_map<std::string, std::string> map;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> f =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    // Errors name the line, never the token.
    if (f.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat("--token_file ", path, ":", line_no,
                                                     ": expected \"token tenant\" (two fields)"));
    }
    if (!map.emplace(std::string(f[0]), std::string(f[1])).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--token_file ", path, ":", line_no, ": token listed twice"));
    }
  }
  if (map.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--token_file ", path, ": no tokens"));
  }
  return FromMap(std::move(map));
}

std::shared_ptr<const TokenTable> TokenTable::FromMap(
    absl::flat_hash_map<std::string, std::string> tenant_by_token) {
  auto t = std::make_shared<TokenTable>();
  t->tenant_by_token_ = std::move(tenant_by_token);
  return t;
}

const std::string* TokenTable::Find(std::string_view token) const {
  if (token.empty()) return nullptr;
  const std::string* found = nullptr;
  for (const auto& [t, tenant] : tenant_by_token_) {
    if (ConstantTimeEqual(t, token)) found = &tenant;
  }
  return found;
}

std::string_view BearerToken(std::string_view authorization) {
  constexpr std::string_view kPrefix = "Bearer ";
  if (authorization.size() <= kPrefix.size() ||
      !absl::EqualsIgnoreCase(Sv(authorization.substr(0, kPrefix.size())), Sv(kPrefix))) {
    return {};
  }
  return authorization.substr(kPrefix.size());
}

bool IsLoopbackHost(std::string_view host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host == "localhost") return true;
  const std::string h(host);
  in_addr v4;
  if (inet_pton(AF_INET, h.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6;
  if (inet_pton(AF_INET6, h.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

Authenticator::Authenticator(std::shared_ptr<const TokenTable> tokens)
    : tokens_(std::move(tokens)) {}

absl::StatusOr<std::string> Authenticator::TenantOf(const grpc::CallbackServerContext& ctx) const {
  const std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth != nullptr) {
    std::vector<grpc::string_ref> v = auth->FindPropertyValues(kTenantProperty);
    if (!v.empty()) return std::string(v.front().data(), v.front().size());
  }
  if (tokens_ != nullptr) {
    const auto& md = ctx.client_metadata();
    auto it = md.find("authorization");
    if (it == md.end()) {
      return absl::UnauthenticatedError("missing bearer token (authorization: Bearer <token>)");
    }
    const std::string_view value(it->second.data(), it->second.size());
    const std::string* tenant = tokens_->Find(BearerToken(value));
    if (tenant == nullptr) return absl::UnauthenticatedError("invalid bearer token");
    return *tenant;
  }
  // mTLS: gRPC has verified the certificate against --tls_client_ca before the call arrives.
  std::vector<grpc::string_ref> cn;
  if (auth != nullptr) cn = auth->FindPropertyValues("x509_common_name");
  if (cn.empty() || cn.front().empty()) {
    return absl::UnauthenticatedError(
        "client certificate has no common name (CN): without --token_file the CN names the "
        "tenant");
  }
  return std::string(cn.front().data(), cn.front().size());
}

grpc::Status TokenAuthProcessor::Process(const InputMetadata& auth_metadata,
                                         grpc::AuthContext* context,
                                         OutputMetadata* consumed_auth_metadata, OutputMetadata*) {
  auto it = auth_metadata.find("authorization");
  // No token: let the call through without a tenant; smla.v1 handlers refuse it, health and
  // reflection answer.
  if (it == auth_metadata.end()) return grpc::Status::OK;
  const std::string_view value(it->second.data(), it->second.size());
  const std::string* tenant = tokens_->Find(BearerToken(value));
  if (tenant == nullptr) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "invalid bearer token");
  }
  context->AddProperty(kTenantProperty, *tenant);
  // Consumed: the token does not reach handlers (or anything that might log metadata).
  consumed_auth_metadata->insert(std::make_pair(std::string(it->first.data(), it->first.size()),
                                                std::string(it->second.data(), it->second.size())));
  return grpc::Status::OK;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const AuthOptions& options, const std::string& listen,
    const std::shared_ptr<const TokenTable>& tokens) {
  const bool tls = !options.tls_cert.empty() || !options.tls_key.empty();
  if (tls && (options.tls_cert.empty() || options.tls_key.empty())) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key must be given together");
  }
  if (!tls && !options.tls_client_ca.empty()) {
    return absl::InvalidArgumentError("--tls_client_ca needs --tls_cert and --tls_key");
  }
  if (!tls) {
    absl::StatusOr<std::pair<std::string, int>> hp = SplitHostPort(listen);
    if (!hp.ok()) return hp.status();
    if (tokens == nullptr && !options.allow_insecure_remote && !IsLoopbackHost(hp->first)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "refusing to serve plaintext without tokens on non-loopback address ", listen,
          ": give --tls_cert/--tls_key or --token_file, or --allow_insecure_remote to accept "
          "unauthenticated remote clients"));
    }
    if (tokens != nullptr && !IsLoopbackHost(hp->first)) {
      spdlog::warn("bearer tokens over plaintext on {}: tokens cross the network in the clear",
                   listen);
    }
    return grpc::InsecureServerCredentials();
  }
  grpc::SslServerCredentialsOptions ssl;
  absl::StatusOr<std::string> cert = ReadFile(options.tls_cert, "--tls_cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadFile(options.tls_key, "--tls_key");
  if (!key.ok()) return key.status();
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  if (!options.tls_client_ca.empty()) {
    absl::StatusOr<std::string> ca = ReadFile(options.tls_client_ca, "--tls_client_ca");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::SslServerCredentials(ssl);
  if (tokens != nullptr) {
    creds->SetAuthMetadataProcessor(std::make_shared<TokenAuthProcessor>(tokens));
  }
  return creds;
}

absl::Status TenantStreams::Open(const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  int32_t& n = open_[tenant];
  if (max_ > 0 && n >= max_) {
    if (n == 0) open_.erase(tenant);
    return absl::ResourceExhaustedError(absl::StrCat(
        "tenant quota of streams reached: the tenant has ", n, " of ", max_, " streams open"));
  }
  ++n;
  return absl::OkStatus();
}

void TenantStreams::Close(const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(tenant);
  if (it != open_.end() && --it->second <= 0) open_.erase(it);
}

}  // namespace smla::server::edge

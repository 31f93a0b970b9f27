#include "channel_auth.h"

#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/support/client_interceptor.h"
#include "smla/base/status_macros.h"

namespace smla::client {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("client ", what, ": cannot read '", path, "'"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(const std::string* value) : value_(value) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", *value_});
    }
    methods->Proceed();
  }

 private:
  const std::string* value_;
};

class TokenInterceptorFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(std::string token) : value_("Bearer " + std::move(token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new TokenInterceptor(&value_);
  }

 private:
  const std::string value_;  // lives as long as the channel, which owns the factory
};

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const ClientOptions& options,
                                                           const grpc::ChannelArguments& args) {
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  const bool tls = options.tls || !options.tls_ca.empty() || !options.tls_cert.empty();
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError("client: tls_cert and tls_key must be given together");
  }
  grpc::ChannelArguments channel_args = args;
  if (tls) {
    grpc::SslCredentialsOptions ssl;
    if (!options.tls_ca.empty()) {
      SMLA_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPem(options.tls_ca, "tls_ca"));
    }
    if (!options.tls_cert.empty()) {
      SMLA_ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadPem(options.tls_cert, "tls_cert"));
      SMLA_ASSIGN_OR_RETURN(ssl.pem_private_key, ReadPem(options.tls_key, "tls_key"));
    }
    creds = grpc::SslCredentials(ssl);
    if (!options.tls_server_name.empty()) {
      channel_args.SetSslTargetNameOverride(options.tls_server_name);
    }
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  if (!options.token.empty()) {
    factories.push_back(std::make_unique<TokenInterceptorFactory>(options.token));
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      options.target, creds, channel_args, std::move(factories));
}

}  // namespace smla::client

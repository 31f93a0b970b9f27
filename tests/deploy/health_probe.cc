// smla-health-probe HOST:PORT SERVICE: what a Kubernetes gRPC probe asks (grpc.health.v1
// Check of SERVICE, "" = the whole server). Prints the answer; exit 0 only when SERVING.
// The deploy test uses it to check the probe service names of the manifests.
#include <cstdio>
#include <string>

#include "smla/client/client.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s HOST:PORT SERVICE\n", argv[0]);
    return 2;
  }
  smla::client::ClientOptions options;
  options.target = argv[1];
  options.timeout = absl::Seconds(20);  // generous: ctest runs it on loaded machines
  auto client = smla::client::Client::Connect(options);
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 2;
  }
  auto serving = (*client)->Health(argv[2]);
  if (!serving.ok()) {
    std::printf("%s\n", serving.status().ToString().c_str());
    return 1;
  }
  std::printf("%s\n", *serving ? "SERVING" : "NOT_SERVING");
  return *serving ? 0 : 1;
}

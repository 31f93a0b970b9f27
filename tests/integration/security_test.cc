// Tenants, tokens, TLS/mTLS, quotas and leases on the real smla-server, and the cross-tenant
// isolation test: a tenant's outputs equal the reference computed from its own writes only.
//
// The cross-tenant test runs on the backend named by SMLA_TEST_BACKEND (default cpu), so the
// same binary checks a GPU server: SMLA_TEST_BACKEND=cuda smla_security_test.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "harness.h"
#include "smla/v1/service.grpc.pb.h"

namespace smla::testing {
namespace {

using client::SpanSpec;

std::string TempDir() {
  std::string t = "/tmp/smla_sec_XXXXXX";
  EXPECT_NE(mkdtemp(t.data()), nullptr);
  return t;
}

std::string WriteTokens(const std::string& dir) {
  const std::string path = dir + "/tokens";
  std::ofstream(path) << "# token tenant\ntok-alice-1234 alice\ntok-bob-5678 bob\n";
  chmod(path.c_str(), 0600);
  return path;
}

std::vector<std::string> BackendArgs() {
  std::vector<std::string> a;
  if (const char* b = std::getenv("SMLA_TEST_BACKEND"); b != nullptr && *b != '\0') {
    a.push_back(std::string("--backend=") + b);
  }
  return a;
}

std::unique_ptr<client::Client> ConnectAs(const ServerProcess& s, const std::string& token,
                                          client::ClientOptions o = {}) {
  o.target = s.target();
  o.token = token;
  auto c = client::Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

int32_t FirstLayer(const v1::ModelInfo& m, v1::LayerKind kind) {
  for (int32_t l = 0; l < m.layers_size(); ++l) {
    if (m.layers(l).kind() == kind) return l;
  }
  return -1;
}

TEST(SecurityTest, TokensMapCallsToTenants) {
  const std::string dir = TempDir();
  auto s = ServerProcess::Start({kDsv41, "--token_file=" + WriteTokens(dir)});
  ASSERT_TRUE(s.ok()) << s.status();
  const std::string model = "dsv4.1-flash";

  auto anon = (*s)->Connect();
  EXPECT_EQ(anon->CreateSequence(model, "x").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(anon->Info().status().code(), absl::StatusCode::kUnauthenticated);
  auto health = anon->Health();  // probes need no token
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_TRUE(*health);

  auto wrong = ConnectAs(**s, "tok-alice-12345");
  absl::Status bad = wrong->CreateSequence(model, "x").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(std::string(bad.message()).find("tok-alice"), std::string::npos) << bad;

  auto alice = ConnectAs(**s, "tok-alice-1234");
  auto bob = ConnectAs(**s, "tok-bob-5678");
  ASSERT_TRUE(alice->CreateSequence(model, "shared").ok());
  ASSERT_TRUE(bob->CreateSequence(model, "shared").ok());  // same name, other tenant
  ASSERT_TRUE(alice->CreateSequence(model, "alice-only").ok());
  // Another tenant's sequence answers exactly like a missing one.
  const client::Sequence other{model, "alice-only"};
  const client::Sequence missing{model, "nobody"};
  EXPECT_EQ(bob->Length(other, 0).status().code(), absl::StatusCode::kNotFound);
  std::string missing_message(bob->Length(missing, 0).status().message());
  missing_message.replace(missing_message.find("nobody"), 6, "alice-only");
  EXPECT_EQ(std::string(bob->Length(other, 0).status().message()), missing_message);
  EXPECT_EQ(bob->Release(other).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(bob->Truncate(other, 0).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(alice->Length(other, 0).ok());  // untouched
  EXPECT_EQ(alice->CreateSequence(model, "shared").status().code(),
            absl::StatusCode::kAlreadyExists);
}

// Runs smla-server with `args`; returns its exit status when it exits within `wait_s`, else
// kills it and returns -1. `output` gets stdout and stderr.
int RunServer(const std::vector<std::string>& args, int wait_s, std::string* output) {
  int out[2];
  if (pipe(out) != 0) return -2;
  std::vector<std::string> argv_s = {ServerBinary(), "--metrics_listen=", "--backend=cpu"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    dup2(out[1], STDERR_FILENO);
    close(out[0]);
    close(out[1]);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  int status = -1;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(wait_s);
  bool exited = false;
  while (std::chrono::steady_clock::now() < end) {
    char buf[512];
    ssize_t n;
    while ((n = read(out[0], buf, sizeof buf)) > 0) output->append(buf, n);
    if (waitpid(pid, &status, WNOHANG) == pid) {
      exited = true;
      break;
    }
    if (output->find("listening on") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  close(out[0]);
  if (!exited) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -3;
}

TEST(SecurityTest, PlaintextWithoutTokensOnlyOnLoopback) {
  std::string out;
  EXPECT_NE(RunServer({kDsv41, "--listen=0.0.0.0:0"}, 120, &out), -1) << out;
  EXPECT_THAT(out, ::testing::HasSubstr("refusing to serve plaintext without tokens"));
  out.clear();
  EXPECT_EQ(RunServer({kDsv41, "--listen=0.0.0.0:0", "--allow_insecure_remote"}, 120, &out), -1);
  EXPECT_THAT(out, ::testing::HasSubstr("listening on 0.0.0.0:"));
  out.clear();
  const std::string dir = TempDir();
  EXPECT_EQ(
      RunServer({kDsv41, "--listen=0.0.0.0:0", "--token_file=" + WriteTokens(dir)}, 120, &out), -1);
  EXPECT_THAT(out, ::testing::HasSubstr("listening on 0.0.0.0:"));
}

TEST(SecurityTest, TenantQuotas) {
  const std::string dir = TempDir();
  auto s =
      ServerProcess::Start({kDsv41, "--token_file=" + WriteTokens(dir), "--tenant_max_sequences=2",
                            "--tenant_max_streams=1", "--tenant_max_pages=6"});
  ASSERT_TRUE(s.ok()) << s.status();
  const std::string model = "dsv4.1-flash";
  Harness a;
  ASSERT_NO_FATAL_FAILURE(a.Attach(ConnectAs(**s, "tok-alice-1234"), model));
  auto bob = ConnectAs(**s, "tok-bob-5678");
  ASSERT_TRUE(a.client->CreateSequence(model, "s1").ok());
  ASSERT_TRUE(a.client->CreateSequence(model, "s2").ok());
  absl::Status third = a.client->CreateSequence(model, "s3").status();
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(third.message()), ::testing::HasSubstr("tenant quota of sequences"));
  EXPECT_TRUE(bob->CreateSequence(model, "s3").ok());  // quotas are per tenant

  // Pages: layer 0 (page_rows 16) takes one page per 16 positions; 6 pages is 96 rows.
  ASSERT_NO_FATAL_FAILURE(a.UploadTables(4096));
  a.StepAndCheck(a.Make(0, {{"s1", 0, 80, 0}}));              // 5 pages
  auto over = a.client->Step(a.Make(0, {{"s2", 0, 40, 0}}));  // 3 more: over the quota
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(over.status().message()), ::testing::HasSubstr("tenant quota of pages"));
  a.StepAndCheck(a.Make(0, {{"s2", 0, 16, 0}}));  // exactly the 6th page

  // Streams: the second open stream of a tenant is refused at once. The two streams race to
  // the server, so the first answers a step (the page quota, per response) before the second
  // opens. Deadlines turn a wrong outcome into a failure instead of a hang.
  const absl::Duration limit = absl::Seconds(60);
  auto s1 = a.client->OpenStream(limit);
  ASSERT_TRUE(s1.ok());
  v1::StepResponse r;
  ASSERT_TRUE((*s1)->Write(a.Make(0, {{"s2", 16, 16, 0}})));
  ASSERT_TRUE((*s1)->Read(&r));
  EXPECT_EQ(r.code(), static_cast<int32_t>(grpc::StatusCode::RESOURCE_EXHAUSTED)) << r.message();
  auto s2 = a.client->OpenStream(limit);
  ASSERT_TRUE(s2.ok());
  EXPECT_FALSE((*s2)->Read(&r));
  absl::Status refused = (*s2)->Finish();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr("tenant quota of streams"));
  auto bob_stream = bob->OpenStream(limit);  // bob's own quota
  ASSERT_TRUE(bob_stream.ok());
  ASSERT_TRUE((*bob_stream)->WritesDone());
  EXPECT_TRUE((*bob_stream)->Finish().ok());
  ASSERT_TRUE((*s1)->WritesDone());
  EXPECT_TRUE((*s1)->Finish().ok());
}

TEST(SecurityTest, IdleSequencesAreReleased) {
  // The lease is long against the 100 ms between uses of "busy", so a loaded machine (the
  // sanitizer suite on 2 cores) cannot let it lapse, and short against the test's length.
  auto s = ServerProcess::Start({kDsv41, "--sequence_idle_timeout=1s"});
  ASSERT_TRUE(s.ok()) << s.status();
  Harness h;
  ASSERT_NO_FATAL_FAILURE(h.Attach((*s)->Connect(), "dsv4.1-flash"));
  ASSERT_NO_FATAL_FAILURE(h.UploadTables(4096));
  const int32_t topk_layer = FirstLayer(h.model_, v1::LAYER_KIND_SWA_TOPK);
  ASSERT_GE(topk_layer, 0);
  ASSERT_TRUE(h.client->CreateSequence(h.ModelName(), "idle").ok());
  ASSERT_TRUE(h.client->CreateSequence(h.ModelName(), "busy").ok());
  h.StepAndCheck(h.Make(0, {{"idle", 0, 64, 0}, {"busy", 0, 64, 0}}));
  h.StepAndCheck(h.Make(topk_layer, {{"idle", 0, 64, 0}, {"busy", 0, 64, 0}}));
  for (int i = 0; i < 30; ++i) {  // 3 s: "busy" is used every 100 ms
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSERT_TRUE(h.client->Length({h.ModelName(), "busy"}, 0).ok());
  }
  EXPECT_EQ(h.client->Length({h.ModelName(), "idle"}, 0).status().code(),
            absl::StatusCode::kNotFound);
  std::this_thread::sleep_for(std::chrono::milliseconds(3000));
  auto info = h.client->Info();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->sequences(), 0);
  EXPECT_EQ(info->models(0).pool().pages_used(), 0);  // every layer's pages came back
}

// Certificates: a CA, a server certificate for 127.0.0.1 / localhost, a client certificate
// with CN=carol, one from another CA, and two of the CA without a common name (anon-o: only
// O=acme; anon-empty: an empty subject).
void MakeCerts(const std::string& d) {
  const std::string cmd =
      "set -e; cd " + d +
      "; openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=test-ca -keyout ca.key "
      "-out ca.pem 2>/dev/null"
      "; openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout server.key -out "
      "server.csr 2>/dev/null"
      "; printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > san.ext"
      "; openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
      "-extfile san.ext -out server.pem 2>/dev/null"
      "; openssl req -newkey rsa:2048 -nodes -subj /CN=carol -keyout client.key -out client.csr "
      "2>/dev/null"
      "; openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
      "-out client.pem 2>/dev/null"
      "; openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=mallory -keyout rogue.key "
      "-out rogue.pem 2>/dev/null"
      "; for c in anon-o:/O=acme anon-empty:/; do n=${c%%:*}"
      "; openssl req -newkey rsa:2048 -nodes -subj ${c#*:} -keyout $n.key -out $n.csr 2>/dev/null"
      "; openssl x509 -req -in $n.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
      "-out $n.pem 2>/dev/null; done";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "openssl failed (is it installed?)";
}

TEST(SecurityTest, MutualTls) {
  const std::string d = TempDir();
  ASSERT_NO_FATAL_FAILURE(MakeCerts(d));
  auto s =
      ServerProcess::Start({kDsv41, "--tls_cert=" + d + "/server.pem",
                            "--tls_key=" + d + "/server.key", "--tls_client_ca=" + d + "/ca.pem"});
  ASSERT_TRUE(s.ok()) << s.status();
  const std::string model = "dsv4.1-flash";
  client::ClientOptions o;
  o.tls_ca = d + "/ca.pem";
  o.tls_cert = d + "/client.pem";
  o.tls_key = d + "/client.key";
  o.timeout = absl::Seconds(10);
  auto carol = ConnectAs(**s, "", o);
  ASSERT_TRUE(carol->CreateSequence(model, "c").ok());
  // The tenant is the certificate's CN: the same name from a plaintext client is refused at
  // the transport, and a certificate of another CA is refused.
  auto plain = (*s)->Connect();
  EXPECT_FALSE(plain->Info().ok());
  client::ClientOptions no_cert;
  no_cert.tls_ca = d + "/ca.pem";
  no_cert.timeout = absl::Seconds(10);
  EXPECT_FALSE(ConnectAs(**s, "", no_cert)->Info().ok());
  client::ClientOptions rogue = o;
  rogue.tls_cert = d + "/rogue.pem";
  rogue.tls_key = d + "/rogue.key";
  EXPECT_FALSE(ConnectAs(**s, "", rogue)->Info().ok());
  EXPECT_TRUE(carol->Length({model, "c"}, 0).ok());
}

// mTLS without tokens: a certificate of the CA without a common name names no tenant. It is
// refused, so such certificates cannot share one tenant (and its sequences).
TEST(SecurityTest, MutualTlsRefusesCertificatesWithoutCommonName) {
  const std::string d = TempDir();
  ASSERT_NO_FATAL_FAILURE(MakeCerts(d));
  auto s =
      ServerProcess::Start({kDsv41, "--tls_cert=" + d + "/server.pem",
                            "--tls_key=" + d + "/server.key", "--tls_client_ca=" + d + "/ca.pem"});
  ASSERT_TRUE(s.ok()) << s.status();
  const std::string model = "dsv4.1-flash";
  for (const std::string name : {"anon-o", "anon-empty"}) {
    SCOPED_TRACE(name);
    client::ClientOptions o;
    o.tls_ca = d + "/ca.pem";
    o.tls_cert = d + "/" + name + ".pem";
    o.tls_key = d + "/" + name + ".key";
    o.timeout = absl::Seconds(10);
    auto anon = ConnectAs(**s, "", o);
    const absl::Status created = anon->CreateSequence(model, "shared").status();
    EXPECT_EQ(created.code(), absl::StatusCode::kUnauthenticated) << created;
    EXPECT_THAT(std::string(created.message()), ::testing::HasSubstr("no common name"));
    EXPECT_EQ(anon->Info().status().code(), absl::StatusCode::kUnauthenticated);
  }
}

TEST(SecurityTest, TlsWithTokens) {
  const std::string d = TempDir();
  ASSERT_NO_FATAL_FAILURE(MakeCerts(d));
  auto s =
      ServerProcess::Start({kDsv41, "--tls_cert=" + d + "/server.pem",
                            "--tls_key=" + d + "/server.key", "--token_file=" + WriteTokens(d)});
  ASSERT_TRUE(s.ok()) << s.status();
  const std::string model = "dsv4.1-flash";
  client::ClientOptions o;
  o.tls_ca = d + "/ca.pem";
  o.timeout = absl::Seconds(10);
  auto alice = ConnectAs(**s, "tok-alice-1234", o);
  auto bob = ConnectAs(**s, "tok-bob-5678", o);
  auto wrong = ConnectAs(**s, "nope", o);
  auto none = ConnectAs(**s, "", o);
  ASSERT_TRUE(alice->CreateSequence(model, "a").ok());
  EXPECT_EQ(bob->Length({model, "a"}, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(wrong->Info().status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(none->Info().status().code(), absl::StatusCode::kUnauthenticated);
  auto health = none->Health();
  EXPECT_TRUE(health.ok() && *health);
}

// The smla tool with --token_file and --tls_ca against a TLS server with tokens.
TEST(SecurityTest, ToolFlags) {
  const std::string d = TempDir();
  ASSERT_NO_FATAL_FAILURE(MakeCerts(d));
  auto s =
      ServerProcess::Start({kDsv41, "--tls_cert=" + d + "/server.pem",
                            "--tls_key=" + d + "/server.key", "--token_file=" + WriteTokens(d)});
  ASSERT_TRUE(s.ok()) << s.status();
  std::ofstream(d + "/alice") << "tok-alice-1234\n";
  const std::string base = ToolBinary(SMLA_TOOL_BINARY) + " --server=" + (*s)->target() +
                           " --timeout_s=20 --tls_ca=" + d + "/ca.pem";
  auto run = [](const std::string& cmd) {
    const int st = std::system((cmd + " >/dev/null 2>&1").c_str());
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  };
  EXPECT_EQ(run(base + " --token_file=" + d + "/alice info"), 0);
  EXPECT_NE(run(base + " info"), 0);  // no token
  EXPECT_NE(run(ToolBinary(SMLA_TOOL_BINARY) + " --server=" + (*s)->target() +
                " --timeout_s=20 --token_file=" + d + "/alice info"),
            0);  // plaintext client against a TLS server
}

// Overwrites the first id of every top-k row of span 0 with `id`.
void CraftTopK(v1::StepRequest* req, int32_t id) {
  v1::Tensor* t = req->mutable_spans(0)->mutable_topk();
  std::string* data = t->mutable_inline_data();
  const int64_t k = t->shape(1);
  for (int64_t r = 0; r < t->shape(0); ++r) std::memcpy(data->data() + r * k * 4, &id, 4);
}

// Two tenants with the same sequence names: B's outputs equal the reference built from B's
// writes alone, and top-k ids naming entries only A's sequence has are refused.
TEST(SecurityTest, CrossTenantIsolation) {
  const std::string dir = TempDir();
  std::vector<std::string> args = {kDsv41, "--token_file=" + WriteTokens(dir)};
  for (const std::string& b : BackendArgs()) args.push_back(b);
  auto s = ServerProcess::Start(args);
  ASSERT_TRUE(s.ok()) << s.status();
  const std::string model = "dsv4.1-flash";
  Harness a, b;
  ASSERT_NO_FATAL_FAILURE(a.Attach(ConnectAs(**s, "tok-alice-1234"), model));
  ASSERT_NO_FATAL_FAILURE(b.Attach(ConnectAs(**s, "tok-bob-5678"), model));
  b.rng.seed(999);  // different data from a; the same tables below
  ASSERT_NO_FATAL_FAILURE(a.UploadTables(4096));
  std::mt19937_64 same_tables{12345};
  std::swap(b.rng, same_tables);
  ASSERT_NO_FATAL_FAILURE(b.UploadTables(4096));  // the same sinks and rope as a's
  std::swap(b.rng, same_tables);

  std::vector<int32_t> layers = {0};
  for (v1::LayerKind k : {v1::LAYER_KIND_SWA_TOPK, v1::LAYER_KIND_TOPK}) {
    if (FirstLayer(a.model_, k) >= 0) layers.push_back(FirstLayer(a.model_, k));
  }
  ASSERT_GT(layers.size(), 1u) << "the model has no top-k layer";
  for (Harness* h : {&a, &b}) {
    ASSERT_TRUE(h->client->CreateSequence(model, "s").ok());
    ASSERT_TRUE(h->client->CreateSequence(model, "t").ok());
  }
  for (int32_t layer : layers) {
    for (int32_t first = 0; first < 400; first += 100) {  // a: 400 positions
      a.StepAndCheck(a.Make(layer, {{"s", first, 100, 0}, {"t", first, 100, 0}}));
    }
    b.StepAndCheck(b.Make(layer, {{"s", 0, 24, 0}, {"t", 0, 24, 0}}));  // b: 24 positions
  }
  for (int32_t layer : layers) {
    const auto& spec = a.model_.layers(layer);
    // Interleaved steps of both tenants on the same names; each checked against its own data.
    for (int round = 0; round < 3; ++round) {
      b.StepAndCheck(b.Make(layer, {{"s", 24 + round, 1, 0}, {"t", 24 + round, 1, 0}}));
      a.StepAndCheck(a.Make(layer, {{"s", 400 + round, 1, 0}, {"t", 400 + round, 1, 0}}));
    }
    if (spec.topk() == 0) continue;
    // Entries that exist in a's "s" only (a has 400+ positions, b 27).
    const int32_t ratio = std::max(1, spec.compression_ratio());
    for (int32_t id : {27 / ratio + 1, 200 / ratio, 399 / ratio}) {
      v1::StepRequest req = b.Make(layer, {{"s", 27, 1, 0}});
      CraftTopK(&req, id);
      auto resp = b.client->Step(req);
      ASSERT_FALSE(resp.ok()) << "layer " << layer << " id " << id << " was accepted";
      EXPECT_EQ(resp.status().code(), absl::StatusCode::kInvalidArgument) << resp.status();
    }
    EXPECT_EQ(b.Length("s", layer), 27);  // the refused steps wrote nothing
    b.StepAndCheck(b.Make(layer, {{"s", 27, 1, 0}}));
    a.StepAndCheck(a.Make(layer, {{"s", 403, 1, 0}}));
  }
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// What a call's request id and a sequence id that carry a log line of their own would forge.
constexpr char kForged[] = "\n2030-01-01T00:00:00.000 info [1] rpc=Step req=\"forged\" code=OK";

// Client strings reach the log escaped and bounded: a newline in a request id or in a sequence
// id (echoed in a NOT_FOUND message) cannot start a line of its own, and calls with 1 MiB
// request ids are refused naming the length and add a few short lines.
TEST(SecurityTest, ClientStringsReachTheLogEscapedAndBounded) {
  const std::string log = TempDir() + "/server.log";
  auto s = ServerProcess::Start({kDsv41}, log);
  ASSERT_TRUE(s.ok()) << s.status();
  auto c = (*s)->Connect();
  auto stub = v1::Smla::NewStub(c->channel());
  {
    grpc::ClientContext ctx;
    v1::StepRequest req;
    req.set_request_id(std::string("r1") + kForged);
    req.set_model("dsv4.1-flash");  // no spans: INVALID_ARGUMENT, logged with the request id
    v1::StepResponse resp;
    EXPECT_EQ(stub->Step(&ctx, req, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    grpc::ClientContext ctx;
    v1::GetSequenceRequest req;
    req.set_model("dsv4.1-flash");
    req.set_sequence_id(std::string("nobody") + kForged);
    v1::GetSequenceResponse resp;
    EXPECT_EQ(stub->GetSequence(&ctx, req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  const std::string huge(1 << 20, 'x');
  for (int i = 0; i < 10; ++i) {
    grpc::ClientContext ctx;
    v1::StepRequest req;
    req.set_request_id(huge);
    req.set_model("dsv4.1-flash");
    v1::StepResponse resp;
    const grpc::Status st = stub->Step(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(st.error_message(), "request_id: 1048576 bytes, at most 256");
  }
  ASSERT_EQ((*s)->Terminate(), 0);
  const std::string text = ReadFile(log);
  EXPECT_LT(text.size(), 64u << 10) << "ten 1 MiB request ids reached the log";
  EXPECT_NE(text.find("req=\"r1\\n2030-01-01"), std::string::npos) << "escaped request id";
  EXPECT_NE(text.find("sequence 'nobody\\\\n2030-01-01"), std::string::npos)
      << "escaped sequence id";
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    EXPECT_FALSE(absl::StartsWith(line, "2030-01-01"))
        << "forged log line: " << line.substr(0, 200);
  }
}

// Names far past any real one are refused at the edge naming the field and its length; the
// status stays small, so the client sees the real code rather than RESOURCE_EXHAUSTED for an
// oversized trailer.
TEST(SecurityTest, OverlongNamesAreRefusedWithoutEcho) {
  auto s = ServerProcess::Start({kDsv41});
  ASSERT_TRUE(s.ok()) << s.status();
  auto c = (*s)->Connect();
  auto stub = v1::Smla::NewStub(c->channel());
  const std::string name(100 << 10, 'm');
  const std::string want_model = "model: 102400 bytes, at most 256";
  auto get_sequence = [&](const std::string& model) {
    grpc::ClientContext ctx;
    v1::GetSequenceRequest req;
    req.set_model(model);
    req.set_sequence_id("s");
    v1::GetSequenceResponse resp;
    return stub->GetSequence(&ctx, req, &resp);
  };
  auto expect_refused = [](const grpc::Status& st, const std::string& want) {
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << st.error_message().substr(0, 200);
    EXPECT_EQ(st.error_message(), want);
  };
  expect_refused(get_sequence(name), want_model);
  {
    grpc::ClientContext ctx;
    v1::CreateSequenceRequest req;
    req.set_model("dsv4.1-flash");
    req.set_sequence_id(name);
    v1::CreateSequenceResponse resp;
    expect_refused(stub->CreateSequence(&ctx, req, &resp),
                   "sequence_id: 102400 bytes, at most 256");
  }
  {
    grpc::ClientContext ctx;
    v1::StepRequest req;
    req.set_model(name);
    req.add_spans()->set_sequence_id("s");
    v1::StepResponse resp;
    expect_refused(stub->Step(&ctx, req, &resp), want_model);
  }
  // The longest accepted id is an ordinary one: an unknown 256-byte model is NOT_FOUND.
  const grpc::Status st = get_sequence(std::string(256, 'm'));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND) << st.error_message().substr(0, 200);
}

}  // namespace
}  // namespace smla::testing

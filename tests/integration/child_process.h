// A child process of an integration test: another test of the same binary, run in its own
// process against the parent's server, so that the parent can kill it at a chosen moment (a
// client that dies mid-stream, a region owner that dies mid-step).
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

#include "harness.h"
#include "smla/client/client.h"
#include "smla/v1/info.pb.h"

namespace smla::testing {

// A child test's connection to the parent's server (SMLA_FAULT_CHILD_TARGET), with the served
// model's info; `client` stays null when the variable is unset (no parent started the test,
// which then skips).
struct ChildClient {
  std::unique_ptr<client::Client> client;
  v1::ModelInfo model;
};
void ConnectChild(ChildClient* out);

// Runs this binary's test `test` ("Suite.Name") in a new process against `target`.
pid_t StartChild(const std::string& target, const std::string& test);

// The one step a region owner's child sends (KillOwnerMidStep): OwnerStepRows rows, two pages,
// of sequence "owner" from position 0 at layer 0, with random contents.
int32_t OwnerStepRows(const v1::ModelInfo& model);
v1::StepRequest OwnerStep(const v1::ModelInfo& model);
// Sends `step` and waits, never answered, until the parent kills this process.
[[noreturn]] void SendUntilKilled(client::Client& client, const v1::StepRequest& step);

// Runs child test `test`, which creates sequence "owner" and sends its OwnerStep with the
// tensors in a region of its own, and kills it once the server has launched the step (reserved
// two pages). Returns the sequence's stored length once it reaches OwnerStepRows (the step,
// launched, committed whole), or the last length seen (-1: none) after 10 s.
int64_t KillOwnerMidStep(Harness& h, const std::string& test);

}  // namespace smla::testing

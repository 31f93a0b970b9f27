#include "id_limits.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "smla/base/strings.h"

namespace smla::server::edge {

absl::Status CheckIdLength(std::string_view field, std::string_view value) {
  if (value.size() <= kMaxIdBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(Sv(field), ": ", value.size(), " bytes, at most ", kMaxIdBytes));
}

absl::Status CheckStepIds(const StepView& request) {
  if (absl::Status st = CheckIdLength("request_id", request.request_id); !st.ok()) return st;
  if (absl::Status st = CheckIdLength("model", request.model); !st.ok()) return st;
  for (size_t i = 0; i < request.spans.size(); ++i) {
    const std::string_view id = request.spans[i].sequence_id;
    // The field's name is built only for the error: this runs on every step.
    if (id.size() > kMaxIdBytes) {
      return CheckIdLength(absl::StrCat("spans[", i, "].sequence_id"), id);
    }
  }
  return absl::OkStatus();
}

}  // namespace smla::server::edge

// Status propagation with abseil's names (abseil keeps its own macros internal).
//
//   SMLA_RETURN_IF_ERROR(WriteRows(...));            // returns the Status when not ok
//   SMLA_ASSIGN_OR_RETURN(auto info, client->Info()); // info is the value; else returns
//
// Both work in functions returning absl::Status or any absl::StatusOr<T>. The left side of
// SMLA_ASSIGN_OR_RETURN is a declaration or an lvalue without unbracketed commas; the macro
// expands to several statements, so it cannot be the body of an unbraced if.
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SMLA_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::absl::Status smla_status_ = (expr);        \
    if (!smla_status_.ok()) return smla_status_; \
  } while (0)

#define SMLA_ASSIGN_OR_RETURN(lhs, expr) \
  SMLA_ASSIGN_OR_RETURN_IMPL_(SMLA_STATUS_CONCAT_(smla_statusor_, __COUNTER__), lhs, expr)

#define SMLA_STATUS_CONCAT_INNER_(a, b) a##b
#define SMLA_STATUS_CONCAT_(a, b) SMLA_STATUS_CONCAT_INNER_(a, b)
// `statusor` names a variable and `lhs` may declare one: parentheses would break both.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define SMLA_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr)   \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = *std::move(statusor)
// NOLINTEND(bugprone-macro-parentheses)

// Status propagation helpers used across the project (Abseil tip #76 style).
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define FLOTILLA_CONCAT_INNER_(a, b) a##b
#define FLOTILLA_CONCAT_(a, b) FLOTILLA_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` (an absl::Status) is not ok.
#define FLOTILLA_RETURN_IF_ERROR(expr)                  \
  do {                                                  \
    if (::absl::Status _st = (expr); !_st.ok()) {       \
      return _st;                                       \
    }                                                   \
  } while (0)

// `lhs = value of expr` when the absl::StatusOr `expr` is ok; otherwise returns
// its status from the enclosing function. `lhs` may declare a variable.
#define FLOTILLA_ASSIGN_OR_RETURN(lhs, expr) \
  FLOTILLA_ASSIGN_OR_RETURN_IMPL_(FLOTILLA_CONCAT_(_statusor_, __LINE__), lhs, expr)

#define FLOTILLA_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                    \
  if (!tmp.ok()) return std::move(tmp).status();        \
  lhs = std::move(tmp).value()

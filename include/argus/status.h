// Errors for the whole library: Status and Result<T>.
//
// Library code never throws and never aborts on conditions derived from input: it returns a
// Status (or a Result<T> holding a value or a Status). Messages name the thing that is wrong:
// the file, the page, the field, the budget. Both types are cheap to move and not thread-safe
// to share mutably (like any value type).
#pragma once

#include <cassert>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace argus {

// Append only: codes reach the C API.
enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,
  kNotFound = 2,
  kCorruption = 3,
  kIOError = 4,
  kNoSpace = 5,            // retryable: the device is full
  kResourceExhausted = 6,  // a budget is exceeded
  kUnsupported = 7,
  kInternal = 8,
  kAborted = 9,  // work staged on a copy was overtaken by a change; redo it or drop it
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }
  static Status InvalidArgument(std::string m) {
    return {StatusCode::kInvalidArgument, std::move(m)};
  }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status Corruption(std::string m) { return {StatusCode::kCorruption, std::move(m)}; }
  static Status IOError(std::string m) { return {StatusCode::kIOError, std::move(m)}; }
  static Status NoSpace(std::string m) { return {StatusCode::kNoSpace, std::move(m)}; }
  static Status ResourceExhausted(std::string m) {
    return {StatusCode::kResourceExhausted, std::move(m)};
  }
  static Status Unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
  static Status Aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "Corruption: q4_0 tile of 33x64 needs 1188 bytes, got 1000"
  std::string ToString() const;

  // Prefixes context to the message, e.g. the file name: WithContext("k.npy").
  Status WithContext(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) { assert(!std::get<Status>(v_).ok()); }  // NOLINT

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(v_); }
  // REQUIRES: ok().
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace argus

#define ARGUS_CONCAT_INNER_(a, b) a##b
#define ARGUS_CONCAT_(a, b) ARGUS_CONCAT_INNER_(a, b)

#define ARGUS_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::argus::Status argus_status_ = (expr);        \
    if (!argus_status_.ok()) return argus_status_; \
  } while (0)

#define ARGUS_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

// ARGUS_ASSIGN_OR_RETURN(auto x, MakeX()); declares x or returns the error.
#define ARGUS_ASSIGN_OR_RETURN(lhs, expr) \
  ARGUS_ASSIGN_OR_RETURN_IMPL_(ARGUS_CONCAT_(argus_result_, __LINE__), lhs, expr)

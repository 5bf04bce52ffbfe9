// Errors are values: every fallible internal call returns a Status or a Result<T>.
// The numeric codes equal the public taiji_status_t values (checked in capi/).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>

namespace taiji {

enum class Code : int32_t {
  Ok = 0,
  InProgress = 1,
  InvalidArgument = -1,
  NoMemory = -2,
  Timeout = -3,
  Mismatch = -4,
  PeerLost = -5,
  Duplicate = -6,
  StaleVersion = -7,
  Protocol = -8,
  Io = -9,
  Config = -10,
  Aborted = -11,
  Finalized = -12,
  VersionMismatch = -13,
  Internal = -14,
  Unsupported = -15,
  Bootstrap = -16,
  Auth = -17,
};

class Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok() { return {}; }

  bool is_ok() const { return code_ == Code::Ok; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Code code_ = Code::Ok;
  std::string message_;
};

template <typename T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status error) : v_(std::move(error)) {}  // NOLINT
  bool is_ok() const { return v_.index() == 0; }
  T& value() { return std::get<0>(v_); }
  const T& value() const { return std::get<0>(v_); }
  const Status& status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<1>(v_);
  }

 private:
  std::variant<T, Status> v_;
};

}  // namespace taiji

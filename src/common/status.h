// Errors are values: every fallible internal call returns a Status or a Result<T>.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>

namespace taiji {

// X(Code, public name after TAIJI_, value, metrics label). The public header lists the same
// codes for C (it stands alone); capi/ checks, from this list, that every code has its public
// twin with the same number and that neither list has one the other lacks.
#define TAIJI_CODE_LIST(X)                                        \
  X(Ok, OK, 0, "ok")                                              \
  X(InProgress, IN_PROGRESS, 1, "in_progress")                    \
  X(InvalidArgument, ERR_INVALID_ARGUMENT, -1, "invalid_argument") \
  X(NoMemory, ERR_NO_MEMORY, -2, "no_memory")                     \
  X(Timeout, ERR_TIMEOUT, -3, "timeout")                          \
  X(Mismatch, ERR_MISMATCH, -4, "mismatch")                       \
  X(PeerLost, ERR_PEER_LOST, -5, "peer_lost")                     \
  X(Duplicate, ERR_DUPLICATE, -6, "duplicate")                    \
  X(StaleVersion, ERR_STALE_VERSION, -7, "stale_version")         \
  X(Protocol, ERR_PROTOCOL, -8, "protocol")                       \
  X(Io, ERR_IO, -9, "io")                                         \
  X(Config, ERR_CONFIG, -10, "config")                            \
  X(Aborted, ERR_ABORTED, -11, "aborted")                         \
  X(Finalized, ERR_FINALIZED, -12, "finalized")                   \
  X(VersionMismatch, ERR_VERSION, -13, "version")                 \
  X(Internal, ERR_INTERNAL, -14, "internal")                      \
  X(Unsupported, ERR_UNSUPPORTED, -15, "unsupported")             \
  X(Bootstrap, ERR_BOOTSTRAP, -16, "bootstrap")                   \
  X(Auth, ERR_AUTH, -17, "auth")                                  \
  X(NotFound, ERR_NOT_FOUND, -18, "not_found")                    \
  X(NoDevice, ERR_NO_DEVICE, -19, "no_device")

enum class Code : int32_t {
#define TAIJI_CODE_ENUM_(code, public_name, value, label) code = value,
  TAIJI_CODE_LIST(TAIJI_CODE_ENUM_)
#undef TAIJI_CODE_ENUM_
};

// "ok", "timeout", "peer_lost", ...; nullptr for a value off the list.
constexpr const char* code_label(int32_t code) {
  switch (code) {
#define TAIJI_CODE_LABEL_(code, public_name, value, label) \
  case value:                                              \
    return label;
    TAIJI_CODE_LIST(TAIJI_CODE_LABEL_)
#undef TAIJI_CODE_LABEL_
  }
  return nullptr;
}

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

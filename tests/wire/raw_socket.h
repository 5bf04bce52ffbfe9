// A plain TCP client for feeding hand-made bytes to a peer: sends never raise SIGPIPE,
// every read is bounded by a deadline, and frames are built and parsed with the runtime's
// own header codec so a test states only the fields it gets wrong.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/frame.h"

namespace wire {

using Clock = std::chrono::steady_clock;

Clock::time_point after_ms(int64_t ms);
double ms_between(Clock::time_point from, Clock::time_point to);

class RawSocket {
 public:
  RawSocket() = default;
  RawSocket(RawSocket&& other) noexcept;
  RawSocket& operator=(RawSocket&& other) noexcept;
  RawSocket(const RawSocket&) = delete;
  RawSocket& operator=(const RawSocket&) = delete;
  ~RawSocket();

  // Connects to "host:port"; on failure the socket is invalid and *error says why.
  static RawSocket connect_to(const std::string& address, std::string* error);

  bool valid() const { return fd_ >= 0; }
  // Sends every byte; false when the peer closed or reset the connection first.
  bool send_all(const std::vector<uint8_t>& bytes);
  // The same, but also false when the peer stopped reading and the bytes did not fit
  // before the deadline.
  bool send_all(const std::vector<uint8_t>& bytes, Clock::time_point deadline);
  // Half-close: the peer reads EOF, and this side can still see how it reacts.
  void shutdown_write();
  void close();
  // Reads exactly n bytes before the deadline; false on EOF, reset or timeout.
  bool read_exact(void* out, size_t n, Clock::time_point deadline);

  enum class Closed { Eof, Reset, StillOpen };
  // Reads (and drops) whatever arrives until the peer closes or the deadline passes;
  // *received counts the dropped bytes.
  Closed wait_closed(Clock::time_point deadline, size_t* received = nullptr);
  // True while the peer has neither closed nor sent anything (does not wait).
  bool open_and_quiet();

 private:
  explicit RawSocket(int fd) : fd_(fd) {}
  int fd_ = -1;
};

const char* closed_name(RawSocket::Closed c);

// The header exactly as given (name_len and payload_len too, so a header can lie about
// what follows), then the name and payload bytes.
std::vector<uint8_t> raw_frame(const taiji::FrameHeader& h, const std::string& name = "",
                               const std::vector<uint8_t>& payload = {});
// A well-formed frame: name_len and payload_len are those of name and payload.
std::vector<uint8_t> frame(taiji::FrameHeader h, const std::string& name,
                           const std::vector<uint8_t>& payload = {});
std::vector<uint8_t> concat(std::vector<std::vector<uint8_t>> parts);

struct Frame {
  taiji::FrameHeader header;
  std::string name;
  std::vector<uint8_t> payload;
};
// Reads one frame and validates its header with decode_header.
taiji::Status read_frame(RawSocket& s, const taiji::FrameLimits& limits, Clock::time_point deadline,
                         Frame* out);

}  // namespace wire

#include "raw_socket.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "transport/address.h"

namespace wire {

Clock::time_point after_ms(int64_t ms) { return Clock::now() + std::chrono::milliseconds(ms); }

double ms_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

namespace {

int ms_left(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1 << 30));
}

// Waits until fd is readable (or has an error/hang-up); false at the deadline.
bool readable(int fd, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    int rc = poll(&p, 1, ms_left(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return true;  // let recv report the error
  }
}

}  // namespace

RawSocket::RawSocket(RawSocket&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }

RawSocket& RawSocket::operator=(RawSocket&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

RawSocket::~RawSocket() { close(); }

void RawSocket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

RawSocket RawSocket::connect_to(const std::string& address, std::string* error) {
  std::string host;
  uint16_t port = 0;
  if (std::string why = taiji::split_host_port(address, false, &host, &port); !why.empty()) {
    *error = "bad address '" + address + "': " + why;
    return {};
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    *error = "cannot resolve '" + host + "': " + gai_strerror(rc);
    return {};
  }
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || ::connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
    *error = "cannot connect to " + address + ": " + std::strerror(errno);
    if (fd >= 0) ::close(fd);
    freeaddrinfo(res);
    return {};
  }
  freeaddrinfo(res);
  return RawSocket(fd);
}

bool RawSocket::send_all(const std::vector<uint8_t>& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

bool RawSocket::send_all(const std::vector<uint8_t>& bytes, Clock::time_point deadline) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    pollfd p{fd_, POLLOUT, 0};
    int rc = poll(&p, 1, ms_left(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) return false;
    ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

void RawSocket::shutdown_write() { ::shutdown(fd_, SHUT_WR); }

bool RawSocket::read_exact(void* out, size_t n, Clock::time_point deadline) {
  auto* p = static_cast<uint8_t*>(out);
  size_t have = 0;
  while (have < n) {
    if (!readable(fd_, deadline)) return false;
    ssize_t got = ::recv(fd_, p + have, n - have, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    have += static_cast<size_t>(got);
  }
  return true;
}

RawSocket::Closed RawSocket::wait_closed(Clock::time_point deadline, size_t* received) {
  uint8_t buf[4096];
  size_t total = 0;
  Closed result = Closed::StillOpen;
  while (readable(fd_, deadline)) {
    ssize_t got = ::recv(fd_, buf, sizeof buf, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got == 0) {
      result = Closed::Eof;
      break;
    }
    if (got < 0) {
      result = Closed::Reset;
      break;
    }
    total += static_cast<size_t>(got);
  }
  if (received != nullptr) *received = total;
  return result;
}

bool RawSocket::open_and_quiet() {
  uint8_t byte;
  ssize_t got = ::recv(fd_, &byte, 1, MSG_DONTWAIT | MSG_PEEK);
  return got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

const char* closed_name(RawSocket::Closed c) {
  switch (c) {
    case RawSocket::Closed::Eof: return "EOF";
    case RawSocket::Closed::Reset: return "reset";
    case RawSocket::Closed::StillOpen: return "still open";
  }
  return "?";
}

std::vector<uint8_t> raw_frame(const taiji::FrameHeader& h, const std::string& name,
                               const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> out(taiji::kHeaderSize);
  taiji::encode_header(h, out.data());
  out.insert(out.end(), name.begin(), name.end());
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

std::vector<uint8_t> frame(taiji::FrameHeader h, const std::string& name,
                           const std::vector<uint8_t>& payload) {
  h.name_len = static_cast<uint16_t>(name.size());
  h.payload_len = payload.size();
  return raw_frame(h, name, payload);
}

std::vector<uint8_t> concat(std::vector<std::vector<uint8_t>> parts) {
  std::vector<uint8_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

taiji::Status read_frame(RawSocket& s, const taiji::FrameLimits& limits, Clock::time_point deadline,
                         Frame* out) {
  uint8_t hdr[taiji::kHeaderSize];
  if (!s.read_exact(hdr, sizeof hdr, deadline)) {
    return {taiji::Code::Io, "no complete frame header before the deadline (closed or silent)"};
  }
  taiji::Status st = taiji::decode_header(hdr, limits, &out->header);
  if (!st.is_ok()) return st;
  out->name.assign(out->header.name_len, '\0');
  out->payload.assign(out->header.payload_len, 0);
  if (!s.read_exact(out->name.data(), out->name.size(), deadline) ||
      !s.read_exact(out->payload.data(), out->payload.size(), deadline)) {
    return {taiji::Code::Io, "frame cut short"};
  }
  return {};
}

}  // namespace wire

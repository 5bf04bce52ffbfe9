#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <thread>

#include "bootstrap/rendezvous.h"
#include "bootstrap/store_wire.h"
#include "common/socket_server.h"
#include "common/time_limit.h"
#include "transport/address.h"

namespace taiji {

namespace {

using namespace store_wire;
using Clock = std::chrono::steady_clock;

// How long past a get's or watch's own timeout the client waits for the server's answer.
constexpr int64_t kReplyGraceMs = 5000;
constexpr int kRetrySleepMs = 20;

// Milliseconds left until `deadline`, rounded up so a poll never wakes just short of it.
int ms_until(Clock::time_point deadline) {
  auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

Clock::time_point deadline_after(int64_t ms) {
  return Clock::now() + std::chrono::milliseconds(clamp_timeout_ms(ms));
}

std::string sockaddr_text(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf));
    return std::string(buf) + ":" + std::to_string(ntohs(in->sin_port));
  }
  if (sa->sa_family == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof(buf));
    return "[" + std::string(buf) + "]:" + std::to_string(ntohs(in6->sin6_port));
  }
  return "?";
}

std::string peer_text(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "rendezvous server";
  return "rendezvous server " + sockaddr_text(reinterpret_cast<sockaddr*>(&ss));
}

enum class IoResult { Ok, Timeout, Closed, Error };

struct Io {
  IoResult result;
  int err;
};

Io send_all(int fd, const std::string& data, Clock::time_point deadline) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return {IoResult::Error, errno};
    pollfd p{fd, POLLOUT, 0};
    int rc = poll(&p, 1, ms_until(deadline));
    if (rc < 0 && errno != EINTR) return {IoResult::Error, errno};
    if (rc == 0) return {IoResult::Timeout, 0};
  }
  return {IoResult::Ok, 0};
}

Io recv_all(int fd, char* buf, size_t len, Clock::time_point deadline) {
  size_t off = 0;
  while (off < len) {
    ssize_t n = recv(fd, buf + off, len - off, 0);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return {IoResult::Closed, 0};
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return {IoResult::Error, errno};
    pollfd p{fd, POLLIN, 0};
    int rc = poll(&p, 1, ms_until(deadline));
    if (rc < 0 && errno != EINTR) return {IoResult::Error, errno};
    if (rc == 0) return {IoResult::Timeout, 0};
  }
  return {IoResult::Ok, 0};
}

std::string io_text(const Io& io) {
  switch (io.result) {
    case IoResult::Ok: return "ok";
    case IoResult::Timeout: return "timed out";
    case IoResult::Closed: return "connection closed by the server";
    case IoResult::Error: return errno_text(io.err);
  }
  return "?";
}

// One attempt at every address of `host`; returns the connected socket or -1.
int try_connect(const std::string& host, const std::string& port, Clock::time_point deadline,
                std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  int gai = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (gai != 0) {
    *error = gai == EAI_SYSTEM ? errno_text(errno) : gai_strerror(gai);
    return -1;
  }
  int result = -1;
  for (addrinfo* ai = res; ai != nullptr && result < 0; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    ai->ai_protocol);
    if (fd < 0) {
      *error = errno_text(errno);
      continue;
    }
    int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int prc;
      do {
        prc = poll(&p, 1, ms_until(deadline));
      } while (prc < 0 && errno == EINTR);
      if (prc <= 0) {
        *error = prc == 0 ? "timed out" : errno_text(errno);
        close(fd);
        continue;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc != 0) {
      *error = errno_text(errno);
      close(fd);
      continue;
    }
    // Retrying loopback connects to a port in the ephemeral range can end up connected
    // to itself (TCP simultaneous open) when nothing listens there yet.
    sockaddr_storage self{}, peer{};
    socklen_t self_len = sizeof(self), peer_len = sizeof(peer);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&self), &self_len) == 0 &&
        getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) == 0 &&
        self_len == peer_len && std::memcmp(&self, &peer, self_len) == 0) {
      *error = "connected to itself (nothing listening)";
      close(fd);
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    result = fd;
  }
  freeaddrinfo(res);
  return result;
}

// Why the sizes cannot go on the wire ("" when they can).
Status invalid(const std::string& op, const std::string& key, const std::string& why) {
  return Status(Code::InvalidArgument,
                "rendezvous: " + op + " '" + key.substr(0, 64) + "': " + why);
}

std::string unexpected(uint8_t status, size_t length) {
  return "unexpected reply (status " + std::to_string(status) + ", length " +
         std::to_string(length) + ")";
}

uint32_t wire_timeout(int64_t timeout_ms) {
  return static_cast<uint32_t>(std::clamp<int64_t>(timeout_ms, 0, int64_t{UINT32_MAX}));
}

}  // namespace

RendezvousClient::~RendezvousClient() {
  if (fd_ >= 0) close(fd_);
}

Result<std::unique_ptr<RendezvousClient>> RendezvousClient::connect(const std::string& address,
                                                                    int64_t timeout_ms) {
  std::string host;
  uint16_t port_number = 0;
  if (!split_host_port(address, false, &host, &port_number).empty()) {
    return Status(Code::Bootstrap,
                  "rendezvous: bad address '" + address + "' (expected host:port)");
  }
  std::string port = std::to_string(port_number);
  auto deadline = deadline_after(timeout_ms);
  std::string error = "no attempt made";
  for (;;) {
    int fd = try_connect(host, port, deadline, &error);
    if (fd >= 0) return std::unique_ptr<RendezvousClient>(new RendezvousClient(fd, peer_text(fd)));
    int left = ms_until(deadline);
    if (left <= 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(left, kRetrySleepMs)));
  }
  return Status(Code::Bootstrap, "rendezvous: cannot connect to " + address + " within " +
                                     std::to_string(timeout_ms) + " ms: " + error);
}

Status RendezvousClient::drop(const std::string& what, Code code, const std::string& why) {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  return Status(code, "rendezvous: " + what + " " + server_ + ": " + why);
}

Result<RendezvousClient::Reply> RendezvousClient::call(const std::string& what,
                                                       const std::string& request,
                                                       int64_t timeout_ms, bool waits) {
  if (fd_ < 0) {
    return Status(Code::Bootstrap,
                  "rendezvous: " + what + " " + server_ + ": connection lost by an earlier error");
  }
  auto deadline = deadline_after(waits ? timeout_ms + kReplyGraceMs : timeout_ms);
  Io io = send_all(fd_, request, deadline);
  if (io.result != IoResult::Ok) return drop(what, Code::Bootstrap, io_text(io));
  char hdr[kReplyHeader];
  io = recv_all(fd_, hdr, sizeof(hdr), deadline);
  if (io.result == IoResult::Timeout && waits) {
    return drop(what, Code::Timeout, "no reply within " + std::to_string(timeout_ms) + " ms");
  }
  if (io.result != IoResult::Ok) return drop(what, Code::Bootstrap, io_text(io));
  Reply reply;
  reply.status = static_cast<uint8_t>(hdr[0]);
  uint32_t len = read_u32(hdr + 1);
  if (reply.status == kStatusBadRequest) {
    return drop(what, Code::Bootstrap, "rejected as a bad request");
  }
  if (reply.status > kStatusLimit || len > kRendezvousMaxValue + 2) {
    return drop(what, Code::Bootstrap, unexpected(reply.status, len));
  }
  reply.value.resize(len);
  io = recv_all(fd_, reply.value.data(), len, deadline);
  if (io.result != IoResult::Ok) return drop(what, Code::Bootstrap, io_text(io));
  return reply;
}

Status RendezvousClient::set(const std::string& key, const std::string& value, int64_t timeout_ms) {
  if (std::string why = store_bounds_error(key, value.size()); !why.empty()) return invalid("set", key, why);
  const std::string what = "set '" + key + "' on";
  Request req;
  req.op = 'S';
  req.key = key;
  req.value = value;
  auto r = call(what, encode_request(req), timeout_ms, false);
  if (!r.is_ok()) return r.status();
  if (r.value().status != kStatusOk || !r.value().value.empty()) {
    return drop(what, Code::Bootstrap, unexpected(r.value().status, r.value().value.size()));
  }
  return Status::ok();
}

Result<std::string> RendezvousClient::get(const std::string& key, int64_t timeout_ms) {
  if (std::string why = store_bounds_error(key, 0); !why.empty()) return invalid("get", key, why);
  const std::string what = "get '" + key + "' from";
  Request req;
  req.op = 'G';
  req.key = key;
  req.timeout_ms = wire_timeout(timeout_ms);
  auto r = call(what, encode_request(req), req.timeout_ms, true);
  if (!r.is_ok()) return r.status();
  Reply& reply = r.value();
  if (reply.status == kStatusTimeout && reply.value.empty()) {
    return Status(Code::Timeout, "rendezvous: key '" + key + "' not set within " +
                                     std::to_string(req.timeout_ms) + " ms (" + server_ + ")");
  }
  if (reply.status != kStatusOk || reply.value.size() > kRendezvousMaxValue) {
    return drop(what, Code::Bootstrap, unexpected(reply.status, reply.value.size()));
  }
  return std::move(reply.value);
}

Result<int64_t> RendezvousClient::add(const std::string& key, int64_t delta, int64_t timeout_ms) {
  if (std::string why = store_bounds_error(key, 0); !why.empty()) return invalid("add to", key, why);
  const std::string what = "add to '" + key + "' on";
  Request req;
  req.op = 'A';
  req.key = key;
  req.delta = delta;
  auto r = call(what, encode_request(req), timeout_ms, false);
  if (!r.is_ok()) return r.status();
  const Reply& reply = r.value();
  if (reply.status == kStatusInvalid) return invalid("add to", key, reply.value);
  if (reply.status == kStatusLimit) {
    return Status(Code::Bootstrap, "rendezvous: " + what + " " + server_ + ": " + reply.value);
  }
  if (reply.status != kStatusOk || reply.value.size() != 8) {
    return drop(what, Code::Bootstrap, unexpected(reply.status, reply.value.size()));
  }
  return read_i64(reply.value.data());
}

Result<CasResult> RendezvousClient::compare_and_set(const std::string& key,
                                                    const std::optional<std::string>& expected,
                                                    const std::string& value, int64_t timeout_ms) {
  const size_t longest = std::max(value.size(), expected ? expected->size() : 0);
  if (std::string why = store_bounds_error(key, longest); !why.empty()) {
    return invalid("compare-and-set", key, why);
  }
  const std::string what = "compare-and-set '" + key + "' on";
  Request req;
  req.op = 'C';
  req.key = key;
  req.absent = !expected;
  req.expected = expected.value_or("");
  req.value = value;
  auto r = call(what, encode_request(req), timeout_ms, false);
  if (!r.is_ok()) return r.status();
  const Reply& reply = r.value();
  if (reply.status == kStatusLimit) {
    return Status(Code::Bootstrap, "rendezvous: " + what + " " + server_ + ": " + reply.value);
  }
  if (reply.status != kStatusOk || reply.value.size() < 2 ||
      (reply.value[1] == '\0' && reply.value.size() != 2)) {
    return drop(what, Code::Bootstrap, unexpected(reply.status, reply.value.size()));
  }
  CasResult result;
  result.swapped = reply.value[0] != '\0';
  if (reply.value[1] != '\0') result.current = reply.value.substr(2);
  return result;
}

Result<bool> RendezvousClient::remove(const std::string& key, int64_t timeout_ms) {
  if (std::string why = store_bounds_error(key, 0); !why.empty()) return invalid("delete", key, why);
  const std::string what = "delete '" + key + "' on";
  Request req;
  req.op = 'D';
  req.key = key;
  auto r = call(what, encode_request(req), timeout_ms, false);
  if (!r.is_ok()) return r.status();
  const Reply& reply = r.value();
  if (reply.status != kStatusOk || reply.value.size() != 1) {
    return drop(what, Code::Bootstrap, unexpected(reply.status, reply.value.size()));
  }
  return reply.value[0] != '\0';
}

Result<std::optional<std::string>> RendezvousClient::watch(const std::string& key,
                                                           const std::optional<std::string>& known,
                                                           int64_t timeout_ms) {
  if (std::string why = store_bounds_error(key, known ? known->size() : 0); !why.empty()) {
    return invalid("watch", key, why);
  }
  const std::string what = "watch '" + key + "' on";
  Request req;
  req.op = 'W';
  req.key = key;
  req.timeout_ms = wire_timeout(timeout_ms);
  req.absent = !known;
  req.expected = known.value_or("");
  auto r = call(what, encode_request(req), req.timeout_ms, true);
  if (!r.is_ok()) return r.status();
  Reply& reply = r.value();
  if (reply.status == kStatusTimeout && reply.value.empty()) {
    return Status(Code::Timeout, "rendezvous: key '" + key + "' did not change within " +
                                     std::to_string(req.timeout_ms) + " ms (" + server_ + ")");
  }
  if (reply.status == kStatusLimit) {
    return Status(Code::Bootstrap, "rendezvous: " + what + " " + server_ + ": " + reply.value);
  }
  if (reply.status != kStatusOk || reply.value.empty() ||
      (reply.value[0] == '\0' && reply.value.size() != 1)) {
    return drop(what, Code::Bootstrap, unexpected(reply.status, reply.value.size()));
  }
  if (reply.value[0] == '\0') return std::optional<std::string>();
  return std::optional<std::string>(reply.value.substr(1));
}

}  // namespace taiji

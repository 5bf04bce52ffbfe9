// A raw TCP client on loopback for tests that speak a server's bytes themselves (the
// rendezvous store): connect, send, and read until the server closes, every wait bounded.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <optional>
#include <string>

struct LoopbackClient {
  int fd = -1;
  explicit LoopbackClient(uint16_t port) {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0);
  }
  ~LoopbackClient() { close_now(); }
  LoopbackClient(const LoopbackClient&) = delete;
  LoopbackClient& operator=(const LoopbackClient&) = delete;
  void close_now() {
    if (fd >= 0) close(fd);
    fd = -1;
  }
  void send_bytes(const std::string& data) {
    REQUIRE(send(fd, data.data(), data.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(data.size()));
  }
  // Everything the server sends until it closes the connection, or nullopt when it has not
  // closed it within timeout_ms.
  std::optional<std::string> until_closed(int timeout_ms) {
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    std::string got;
    char buf[256];
    for (;;) {
      const int left = static_cast<int>(
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
      if (left <= 0) return std::nullopt;
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, left) <= 0) return std::nullopt;
      const ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) return got;
      got.append(buf, static_cast<size_t>(n));
    }
  }
  // True when the server closed the connection within timeout_ms (any bytes before the
  // end, such as a bad-request reply, are skipped).
  bool closed_by_server(int timeout_ms) { return until_closed(timeout_ms).has_value(); }
};

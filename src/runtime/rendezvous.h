// The rendezvous store: a tiny key/value service where peers publish their listen
// addresses at start-up and wait for everyone else's. Served by taiji-run (or by rank 0
// when another launcher started the job); clients use blocking sockets with deadlines.
//
// Wire protocol (all integers little-endian):
//   request:  op u8 ('S' set | 'G' get), key_len u32, key, then for 'S': value_len u32, value;
//             for 'G': timeout_ms u32
//   response: status u8 (0 ok, 1 timeout, 2 bad request), value_len u32, value (for 'G')
// Keys are at most 1 KiB, values at most 64 KiB, and the store holds at most 64 MiB; a
// malformed request, or a set past that, closes that client's connection and nothing else.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"

namespace taiji {

inline constexpr uint32_t kRendezvousMaxKey = 1024;
inline constexpr uint32_t kRendezvousMaxValue = 64 * 1024;
inline constexpr uint64_t kRendezvousMaxStoreBytes = 64 << 20;

// What clients may hold on a server. The process that serves may be rank 0 itself, so a
// flood of connections must not take every descriptor it has (its own links need them):
// past max_clients, new connections wait in the listen backlog until a client leaves. A
// connection that sends nothing, or half a request, would hold its place forever, so a
// client with no 'G' parked that completes no request for idle_ms is closed. (A peer's
// own client sends each request whole, right after the last answer.)
struct RendezvousLimits {
  size_t max_clients = 0;  // 0: half the process's descriptor limit (RLIMIT_NOFILE), at least 16
  int64_t idle_ms = 60000;
};

class RendezvousServer {
 public:
  // Binds host:port (port 0: any free port) and serves on a background thread.
  static Result<std::unique_ptr<RendezvousServer>> start(const std::string& host,
                                                         uint16_t port,
                                                         RendezvousLimits limits = {});
  ~RendezvousServer();  // stops and joins
  uint16_t port() const;

  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  struct Impl;

 private:
  explicit RendezvousServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class RendezvousClient {
 public:
  // Connects to "host:port", retrying until timeout_ms (the server may start later).
  static Result<std::unique_ptr<RendezvousClient>> connect(const std::string& address,
                                                           int64_t timeout_ms);
  ~RendezvousClient();
  // Sets the key; fails (Code::Bootstrap) without an answer within timeout_ms.
  Status set(const std::string& key, const std::string& value, int64_t timeout_ms);
  // Blocks until the key is set or timeout_ms passes (Code::Timeout naming the key).
  Result<std::string> get(const std::string& key, int64_t timeout_ms);

  RendezvousClient(const RendezvousClient&) = delete;
  RendezvousClient& operator=(const RendezvousClient&) = delete;

 private:
  explicit RendezvousClient(int fd);
  int fd_;
};

}  // namespace taiji

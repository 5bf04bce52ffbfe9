// The rendezvous store: the embedded Store backend, where peers publish their listen
// addresses at start-up and wait for everyone else's, and where membership keeps its
// counters and watches. Served by taiji-run (or by rank 0 when another launcher started
// the job); clients use blocking sockets with deadlines. The wire format is in
// bootstrap/store_wire.h.
//
// Keys are at most 1 KiB, values at most 64 KiB, and the store holds at most 64 MiB; a
// malformed request, or a set past that, closes that client's connection and nothing else.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "bootstrap/store.h"
#include "common/status.h"

namespace taiji {

// What clients may hold on a server. The process that serves may be rank 0 itself, so a
// flood of connections must not take every descriptor it has (its own links need them):
// past max_clients, new connections wait in the listen backlog until a client leaves. A
// connection that sends nothing, or half a request, would hold its place forever, so a
// client with no get or watch parked that completes no request for idle_ms is closed. (A
// peer's own client sends each request whole, right after the last answer.)
struct RendezvousLimits {
  size_t max_clients = 0;  // 0: half the process's descriptor limit (RLIMIT_NOFILE), at least 16
  int64_t idle_ms = 60000;
  // Past these an add, compare-and-set or watch is refused (Code::Bootstrap), and a set
  // of a new key closes the connection as a full store does.
  size_t max_keys = 1 << 20;
  size_t max_watchers = 4096;
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

// One connection to a RendezvousServer. Not thread-safe: one call at a time. A call that
// fails for any reason but the store's own answer (timeout of a get or watch, a refused
// add, compare-and-set or watch) closes the connection, and later calls fail at once.
class RendezvousClient final : public Store {
 public:
  // Connects to "host:port", retrying until timeout_ms (the server may start later).
  static Result<std::unique_ptr<RendezvousClient>> connect(const std::string& address,
                                                           int64_t timeout_ms);
  ~RendezvousClient() override;
  // Fails with Code::Bootstrap without an answer within timeout_ms.
  Status set(const std::string& key, const std::string& value, int64_t timeout_ms) override;
  Result<std::string> get(const std::string& key, int64_t timeout_ms) override;
  Result<int64_t> add(const std::string& key, int64_t delta, int64_t timeout_ms) override;
  Result<CasResult> compare_and_set(const std::string& key,
                                    const std::optional<std::string>& expected,
                                    const std::string& value, int64_t timeout_ms) override;
  Result<bool> remove(const std::string& key, int64_t timeout_ms) override;
  Result<std::optional<std::string>> watch(const std::string& key,
                                           const std::optional<std::string>& known,
                                           int64_t timeout_ms) override;

  RendezvousClient(const RendezvousClient&) = delete;
  RendezvousClient& operator=(const RendezvousClient&) = delete;

 private:
  struct Reply {
    uint8_t status = 0;
    std::string value;
  };
  RendezvousClient(int fd, std::string server) : fd_(fd), server_(std::move(server)) {}
  // Sends `request` and reads its reply. `waits`: the server may hold it for timeout_ms (a
  // get or a watch), so the reply is awaited that long and a grace after.
  Result<Reply> call(const std::string& what, const std::string& request, int64_t timeout_ms,
                     bool waits);
  // Closes the connection (the stream may hold half a message now) and says why.
  Status drop(const std::string& what, Code code, const std::string& why);
  int fd_;
  std::string server_;  // "rendezvous server host:port", for messages
};

}  // namespace taiji

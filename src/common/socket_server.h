// A listening TCP socket served by one poll() thread: accept, buffered non-blocking reads
// and writes per connection, and stop-then-join. What the bytes mean is the Service's:
// the metrics endpoint and the rendezvous store are both one of these.
//
// Every Service call runs on the server's thread, so a Service needs no lock for the state
// it keeps there. Out of descriptors (or on any other accept failure) the server stops
// accepting for 100 ms rather than spin on a listener that stays readable.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "common/status.h"

namespace taiji {

// strerror for `err`, without strerror's shared buffer.
std::string errno_text(int err);

class SocketServer {
 public:
  using Clock = std::chrono::steady_clock;

  // One accepted client. Services derive from it to keep their own state beside the buffers.
  struct Connection {
    virtual ~Connection() = default;
    int fd = -1;
    std::string in;            // received, not yet consumed by the Service
    std::string out;           // to send; the server flushes it as the socket allows
    bool dead = false;         // closed at the next turn of the loop
    bool close_when_sent = false;  // stop reading; close once `out` is sent
    Clock::time_point opened;
    Clock::time_point last_sent;  // when bytes last left (opened, before any)

    // Sends what the socket takes now; false (and dead) once the connection failed.
    bool flush();
  };
  using Connections = std::map<int, std::unique_ptr<Connection>>;

  class Service {
   public:
    virtual ~Service() = default;
    // A connection was accepted; returns the object that will hold its state.
    virtual std::unique_ptr<Connection> open() { return std::make_unique<Connection>(); }
    // `c.in` grew, or `c.out` drained: consume what can be, append answers to `c.out`
    // (or to another of `all`, which an answer may wake).
    virtual void input(Connection& c, Connections& all) = 0;
    // Once per turn of the loop, before waiting: deadlines, work queued across
    // connections. Returns when it next needs a turn (max: only on I/O).
    virtual Clock::time_point tick(Connections&) { return Clock::time_point::max(); }
    // Something the server could not do, for the Service to log; `fatal`: the thread ended.
    virtual void failed(const std::string& what, bool fatal) = 0;
  };

  struct Options {
    std::string name;          // in error messages: "rendezvous", "metrics endpoint"
    Code error_code = Code::Io;  // of the Status that start() returns
    size_t max_connections = 32;
    // Past max_connections: true, accept and close at once; false, leave new connections
    // in the listen backlog until one leaves.
    bool refuse_excess = true;
    size_t input_cap = 64 * 1024;  // a connection holding this much unconsumed is not read
    int backlog = 64;
  };

  // Binds host:port ("" host: every address; port 0: any free one; IPv4 addresses of a
  // name first) and serves `service`, which must outlive the server, on a new thread.
  static Result<std::unique_ptr<SocketServer>> start(const std::string& host, uint16_t port,
                                                     Options options, Service& service);
  ~SocketServer();  // stops and joins
  uint16_t port() const { return port_; }

  SocketServer(const SocketServer&) = delete;
  SocketServer& operator=(const SocketServer&) = delete;

 private:
  SocketServer(Options options, Service& service)
      : options_(std::move(options)), service_(service) {}
  void run();
  void accept_all();

  Options options_;
  Service& service_;
  int listen_fd_ = -1;
  int wake_read_ = -1;
  int wake_write_ = -1;
  uint16_t port_ = 0;
  Connections connections_;
  Clock::time_point accept_paused_until_{};
  bool warned_full_ = false;
  std::thread thread_;
};

}  // namespace taiji

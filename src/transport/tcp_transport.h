// TCP transport over libuv: one connection per peer pair (the higher rank connects to the
// lower), each opened by a handshake (transport/handshake.h) that states job id, rank and
// cluster version and, with a job secret, authenticates both ends. Connections that do not
// finish it in time are closed, and only so many may be pending at once.
// Frames are parsed as a stream; a payload whose destination is known is read straight
// into it, skipping the scratch buffer.
#pragma once

#include <uv.h>

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/cluster.h"
#include "monitor/link_counters.h"
#include "monitor/refusals.h"
#include "transport/handshake.h"
#include "transport/transport.h"

namespace taiji {

struct TcpOptions {
  // The membership (rank, size, version), read where needed: it changes in place.
  const Cluster* cluster = nullptr;
  std::string job_id;
  std::string listen_host;
  FrameLimits limits;
  std::string secret;                  // empty: connections are not authenticated
  uint64_t handshake_timeout_ms = 10000;
  int max_pending_connections = 64;    // accepted connections still in their handshake
  LinkCounters* link_counters = nullptr;  // size entries, by rank: bytes per link; or none
  RefusalCounters* refusals = nullptr;    // connections refused by reason; or none
  // TCP congestion control of every link (TCP_CONGESTION); empty: the system's default.
  std::string congestion;
};

class TcpTransport final : public Transport {
 public:
  TcpTransport(uv_loop_t* loop, TcpOptions options, ReceiveHandler* handler);
  ~TcpTransport() override;
  // For a handler layered over this transport (it is built after it); before listen().
  void set_handler(ReceiveHandler* handler) { handler_ = handler; }

  // Binds listen_host on a free port; returns the "host:port" peers should dial.
  Result<std::string> listen();
  // Dials every lower rank and waits for every higher one. on_ready runs once: OK when
  // all size-1 links completed their Hello, else an error naming the missing ranks.
  void connect_all(std::vector<std::string> addresses, uint64_t timeout_ms,
                   std::function<void(const Status&)> on_ready);

  void send(int dst, OutMessage msg) override;
  uint64_t queued_bytes(int dst) const override;
  void pause_reading(int src) override;
  void resume_reading(int src) override;
  void drop(int rank, const Status& why) override;
  void shutdown(std::function<void()> on_closed) override;
  void close_now(std::function<void()> on_closed) override;
  void defer(std::function<void()> fn) override;
  // Between cork() and uncork() (they nest) frames to a peer are held, then leave in one
  // write per peer: an op's Ready and Data frames cost one syscall, not two.
  void cork();
  void uncork();
  // Reads that delivered bytes so far: a cheap sign of traffic for a polling loop.
  uint64_t read_events() const { return read_events_; }
  uint64_t read_bytes() const { return read_bytes_; }
  // Whether libuv holds writes it will finish when the socket takes more (a loop round
  // may then write: see transport/sigpipe.h).
  bool writes_queued() const { return queued_writes_ > 0; }

  struct Conn;
  struct WriteReq;
  // Entry points for libuv's connection callbacks.
  void conn_failed(Conn* c, const Status& why);
  void conn_closed(Conn* c);
  // Closes without reporting link_down (the transport itself is stopping).
  void close_conn(Conn* c);

 private:
  friend struct Conn;
  void start_connect(int rank);
  void on_connected(Conn* c, int status);
  void on_accept();
  void on_handshake_frame(Conn* c);
  void start_handshake(Conn* c);
  // Applies opt_.congestion to a socket (nothing when empty).
  Status set_congestion(uv_tcp_t* tcp) const;
  // Every link, dialed or accepted: no Nagle delay, and opt_.congestion.
  void tune_link(uv_tcp_t* tcp) const;
  void sweep_handshakes();
  WriteReq* frame(Conn* c, OutMessage msg);
  int write(Conn* c, OutMessage msg);
  int write_frames(Conn* c, WriteReq* const* ws, size_t n);
  void fail_frames(WriteReq* const* ws, size_t n, const Status& why);
  void flush_corked();
  void check_ready();
  void finish_ready(const Status& s);
  void run_deferred();
  void maybe_closed();

  uv_loop_t* loop_;
  TcpOptions opt_;
  ReceiveHandler* handler_;
  uv_tcp_t listener_{};
  bool listening_ = false;
  uv_timer_t connect_timer_{};
  uv_timer_t sweep_timer_{};           // closes connections stuck in their handshake
  uv_idle_t idle_{};
  std::vector<std::string> addresses_;
  std::vector<Conn*> by_rank_;
  std::set<Conn*> conns_;  // every open connection, identified or not
  std::vector<std::function<void()>> deferred_;
  std::function<void(const Status&)> on_ready_;
  std::function<void()> on_closed_;
  int open_handles_ = 0;
  bool stopping_ = false;
  uint64_t connect_deadline_ = 0;
  uint64_t read_events_ = 0;
  uint64_t read_bytes_ = 0;
  int corked_ = 0;
  uint64_t queued_writes_ = 0;  // uv_write requests not yet called back
  std::vector<Conn*> corked_conns_;    // connections with frames held by the cork
  std::string last_refusal_;           // why the latest handshake failed, for set-up errors
  RefusalLog refusal_log_;
  // Counts an accepted connection refused before its handshake ended, and logs it (bounded).
  void refused(RefusalReason reason, const std::string& why);
  static RefusalReason refusal_reason(const Status& why);
};

}  // namespace taiji

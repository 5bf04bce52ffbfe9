// The transports a peer sends through, as one: TCP to every rank, with shared memory
// layered over it for the ranks on this host. The runtime sees this and the Transport
// interface only, so a transport can be added or rearranged here without touching it.
// Everything here runs on the owning peer's I/O thread, but for the constructor.
#pragma once

#include <uv.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "transport/shm_transport.h"
#include "transport/tcp_transport.h"

namespace taiji {

class TransportStack {
 public:
  // handler receives every frame and link loss; shm.request_poll must run poll() on the
  // loop soon.
  TransportStack(uv_loop_t* loop, TcpOptions tcp, ShmOptions shm, ReceiveHandler* handler);
  ~TransportStack();

  // What ops send through: shared memory where a ring is up, else TCP.
  Transport& top() { return *shm_; }

  // Binds a free port; returns the "host:port" peers should dial. Before the loop runs.
  Result<std::string> listen() { return tcp_->listen(); }
  // Connects to every rank (addresses by rank), then offers shared memory to the ranks on
  // this host (host_of by rank). on_ready runs once, as TcpTransport::connect_all says.
  void connect(std::vector<std::string> addresses, std::vector<int> host_of, uint64_t timeout_ms,
               std::function<void(const Status&)> on_ready);

  // Between cork() and uncork() (they nest) frames to a peer leave in one write.
  void cork() { tcp_->cork(); }
  void uncork() { tcp_->uncork(); }
  // Changes whenever frames arrive: a cheap sign of traffic for a polling loop.
  uint64_t arrivals() const { return tcp_->read_events() + shm_->mail_delivered(); }
  // Bytes read from sockets so far (bulk from another host comes at the link's pace).
  uint64_t socket_bytes() const { return tcp_->read_bytes(); }
  // Whether a loop round may write (transport/sigpipe.h).
  bool writes_queued() const { return tcp_->writes_queued(); }
  // A polling loop: senders ring no doorbell while it is on; poll() delivers what waits.
  void set_polling(bool on) { shm_->set_polling(on); }
  void poll() { shm_->poll(); }
  // Periodic work the loop may not otherwise get to (credits waiting for room).
  void tick() { shm_->retry_waiting(); }

  void shutdown(std::function<void()> on_closed) { shm_->shutdown(std::move(on_closed)); }
  void close_now(std::function<void()> on_closed) { shm_->close_now(std::move(on_closed)); }

  TransportStack(const TransportStack&) = delete;
  TransportStack& operator=(const TransportStack&) = delete;

 private:
  std::unique_ptr<TcpTransport> tcp_;
  std::unique_ptr<ShmTransport> shm_;  // over tcp_
};

}  // namespace taiji

// TcpTransport's connection set-up: listen, dial the lower ranks (retrying until the
// deadline), accept the higher ones, and run each connection's handshake.
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "monitor/log.h"
#include "transport/address.h"
#include "transport/tcp_conn.h"

namespace taiji {

namespace {

constexpr size_t kScratchBytes = 256 << 10;
constexpr uint64_t kConnectRetryMs = 50;

uint64_t now_ms(uv_loop_t* loop) { return uv_now(loop); }

// Resolves host (literal or name) and port into a sockaddr.
Status resolve(const std::string& host, uint16_t port, sockaddr_storage* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return {Code::Bootstrap, "cannot resolve '" + host + "': " + gai_strerror(rc)};
  }
  std::memcpy(out, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  return {};
}

}  // namespace

Result<std::string> TcpTransport::listen() {
  sockaddr_storage addr{};
  Status s = resolve(opt_.listen_host, 0, &addr);
  if (!s.is_ok()) return s;
  uv_tcp_init(loop_, &listener_);
  listener_.data = this;
  listening_ = true;
  open_handles_++;
  int rc = uv_tcp_bind(&listener_, reinterpret_cast<const sockaddr*>(&addr), 0);
  if (rc == 0) {
    rc = uv_listen(reinterpret_cast<uv_stream_t*>(&listener_), 128, [](uv_stream_t* server, int status) {
      if (status == 0) static_cast<TcpTransport*>(server->data)->on_accept();
    });
  }
  if (rc != 0) return tcp::uv_error("cannot listen on " + opt_.listen_host, rc);
  // Checked here, so that a name this host lacks fails init; every link then sets it.
  if (Status cc = set_congestion(&listener_); !cc.is_ok()) return cc;
  sockaddr_storage bound{};
  int len = sizeof(bound);
  uv_tcp_getsockname(&listener_, reinterpret_cast<sockaddr*>(&bound), &len);
  uint16_t port = ntohs(bound.ss_family == AF_INET6
                            ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  bool v6 = opt_.listen_host.find(':') != std::string::npos;
  return (v6 ? "[" + opt_.listen_host + "]" : opt_.listen_host) + ":" + std::to_string(port);
}

Status TcpTransport::set_congestion(uv_tcp_t* tcp) const {
  if (opt_.congestion.empty()) return {};
  uv_os_fd_t fd = -1;
  if (uv_fileno(reinterpret_cast<uv_handle_t*>(tcp), &fd) != 0) return {};
  const std::string& name = opt_.congestion;
  if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name.data(), static_cast<socklen_t>(name.size())) == 0) {
    return {};
  }
  const int err = errno;
  return {Code::Config, "TCP congestion control '" + name + "' (TAIJI_TCP_CONGESTION): " + std::strerror(err) +
                            (err == ENOENT ? " (not in /proc/sys/net/ipv4/tcp_available_congestion_control)"
                             : err == EPERM ? " (not in /proc/sys/net/ipv4/tcp_allowed_congestion_control)"
                                            : "")};
}

void TcpTransport::tune_link(uv_tcp_t* tcp) const {
  uv_tcp_nodelay(tcp, 1);
  // The listener accepted the same name, so this fails only if the system changed since.
  if (Status cc = set_congestion(tcp); !cc.is_ok()) log().warn("{}", cc.message());
}

void TcpTransport::connect_all(std::vector<std::string> addresses, uint64_t timeout_ms,
                               std::function<void(const Status&)> on_ready) {
  addresses_ = std::move(addresses);
  on_ready_ = std::move(on_ready);
  connect_deadline_ = now_ms(loop_) + timeout_ms;
  for (int r = 0; r < opt_.cluster->rank; ++r) start_connect(r);
  uv_timer_start(&connect_timer_, [](uv_timer_t* t) {
    auto* self = static_cast<TcpTransport*>(t->data);
    if (!self->on_ready_) return;
    std::string missing;
    for (int r = 0; r < self->opt_.cluster->size; ++r) {
      if (r != self->opt_.cluster->rank && self->by_rank_[r] == nullptr) missing += " " + std::to_string(r);
    }
    std::string refusal = self->last_refusal_.empty()
                              ? ""
                              : "; the last connection refused said: " + self->last_refusal_;
    self->finish_ready({Code::Timeout,
                        "connection set-up timed out; no link to rank(s):" + missing + refusal});
  }, timeout_ms, 0);
  check_ready();
}

void TcpTransport::start_connect(int rank) {
  std::string host;
  uint16_t port = 0;
  sockaddr_storage addr{};
  Status s;
  if (std::string why = split_host_port(addresses_[rank], false, &host, &port); !why.empty()) {
    s = {Code::Bootstrap, "bad address '" + addresses_[rank] + "' for rank " + std::to_string(rank) + ": " + why};
  }
  if (s.is_ok()) s = resolve(host, port, &addr);
  if (!s.is_ok()) return finish_ready(s);
  auto* c = new Conn();
  c->owner = this;
  c->dial_rank = rank;
  uv_tcp_init(loop_, &c->tcp);
  c->tcp.data = c;
  c->connect_req.data = c;
  conns_.insert(c);
  open_handles_++;
  int rc = uv_tcp_connect(&c->connect_req, &c->tcp, reinterpret_cast<const sockaddr*>(&addr),
                          [](uv_connect_t* req, int status) {
                            auto* conn = static_cast<Conn*>(req->data);
                            conn->owner->on_connected(conn, status);
                          });
  if (rc != 0) on_connected(c, rc);
}

void TcpTransport::on_connected(Conn* c, int status) {
  if (c->closing) return;
  if (status != 0) {
    int rank = c->dial_rank;
    c->closing = true;
    uv_close(reinterpret_cast<uv_handle_t*>(&c->tcp), tcp::on_close);
    // The peer may not be listening yet (a restarted process); retry until the deadline.
    if (stopping_ || !on_ready_) return;
    if (now_ms(loop_) + kConnectRetryMs >= connect_deadline_) {
      return finish_ready(tcp::uv_error("cannot connect to rank " + std::to_string(rank) + " at " +
                                       addresses_[rank], status));
    }
    auto* timer = new uv_timer_t;
    uv_timer_init(loop_, timer);
    open_handles_++;
    struct Retry { TcpTransport* self; int rank; };
    timer->data = new Retry{this, rank};
    uv_timer_start(timer, [](uv_timer_t* t) {
      auto* retry = static_cast<Retry*>(t->data);
      if (!retry->self->stopping_) retry->self->start_connect(retry->rank);
      uv_close(reinterpret_cast<uv_handle_t*>(t), [](uv_handle_t* h) {
        auto* r = static_cast<Retry*>(h->data);
        r->self->open_handles_--;
        r->self->maybe_closed();
        delete r;
        delete reinterpret_cast<uv_timer_t*>(h);
      });
    }, kConnectRetryMs, 0);
    return;
  }
  tune_link(&c->tcp);
  c->rank = c->dial_rank;
  c->start_reading();
  start_handshake(c);
}

void TcpTransport::start_handshake(Conn* c) {
  HandshakeParams params{opt_.cluster->rank, opt_.cluster->size, opt_.cluster->version, opt_.job_id, opt_.secret};
  bool dialer = c->dial_rank >= 0;
  c->hs = std::make_unique<Handshake>(std::move(params),
                                      dialer ? Handshake::Role::Dialer : Handshake::Role::Acceptor,
                                      c->dial_rank);
  c->opened_at = std::max<uint64_t>(now_ms(loop_), 1);
  std::vector<OutMessage> out;
  if (Status s = c->hs->start(&out); !s.is_ok()) return conn_failed(c, s);
  for (OutMessage& m : out) write(c, std::move(m));
}

void TcpTransport::on_accept() {
  auto* c = new Conn();
  c->owner = this;
  uv_tcp_init(loop_, &c->tcp);
  c->tcp.data = c;
  conns_.insert(c);
  open_handles_++;
  if (uv_accept(reinterpret_cast<uv_stream_t*>(&listener_), c->stream()) != 0 || stopping_) {
    c->closing = true;
    uv_close(reinterpret_cast<uv_handle_t*>(&c->tcp), tcp::on_close);
    return;
  }
  int pending = 0;
  for (Conn* other : conns_) {
    if (other->dial_rank < 0 && !other->identified && !other->closing) pending++;
  }
  // The new connection counts itself.
  if (pending > opt_.max_pending_connections) {
    refused(RefusalReason::TooManyPending,
            std::to_string(pending - 1) + " connections are already in their handshake");
    c->closing = true;
    uv_close(reinterpret_cast<uv_handle_t*>(&c->tcp), tcp::on_close);
    return;
  }
  tune_link(&c->tcp);
  c->start_reading();
  start_handshake(c);
}

void TcpTransport::on_handshake_frame(Conn* c) {
  std::vector<OutMessage> out;
  Status s = c->hs->on_frame(c->h, c->name, c->hs_payload, &out);
  int src = c->hs->peer_rank();
  if (s.is_ok() && c->hs->done() && by_rank_[src] != nullptr) {
    s = {Code::Protocol, "Hello from rank " + std::to_string(src) + ": rank already connected"};
  }
  if (!s.is_ok()) {
    // A refusal is one small frame on a fresh connection: the kernel takes it at once, and
    // the close that follows sends it before the FIN.
    for (OutMessage& m : out) write(c, std::move(m));
    return conn_failed(c, s);
  }
  for (OutMessage& m : out) write(c, std::move(m));
  if (!c->hs->done() || c->closing) return;
  c->hs.reset();
  c->hs_payload = {};
  // Bytes already read past the handshake stay where they are; the buffer only grows.
  c->buf.resize(kScratchBytes);
  c->rank = src;
  c->identified = true;
  by_rank_[src] = c;
  check_ready();
}

void TcpTransport::sweep_handshakes() {
  uint64_t now = now_ms(loop_);
  refusal_log_.flush(now);
  for (Conn* c : std::vector<Conn*>(conns_.begin(), conns_.end())) {
    if (c->identified || c->closing || c->opened_at == 0) continue;
    if (now - c->opened_at >= opt_.handshake_timeout_ms) {
      conn_failed(c, {Code::Timeout, "handshake not finished within " +
                                         std::to_string(opt_.handshake_timeout_ms) + " ms"});
    }
  }
}

void TcpTransport::check_ready() {
  if (!on_ready_) return;
  for (int r = 0; r < opt_.cluster->size; ++r) {
    if (r != opt_.cluster->rank && by_rank_[r] == nullptr) return;
  }
  finish_ready({});
}

void TcpTransport::finish_ready(const Status& s) {
  if (!on_ready_) return;
  auto cb = std::move(on_ready_);
  on_ready_ = nullptr;
  uv_timer_stop(&connect_timer_);
  defer([cb, s] { cb(s); });
}

}  // namespace taiji

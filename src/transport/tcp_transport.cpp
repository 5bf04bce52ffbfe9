#include "transport/tcp_transport.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstring>

#include "monitor/log.h"
#include "transport/address.h"
#include "transport/sigpipe.h"

namespace taiji {

namespace {

constexpr size_t kScratchBytes = 256 << 10;
// Until its handshake is done a connection only reads small frames: a small buffer keeps
// many pending (possibly hostile) connections cheap.
constexpr size_t kHandshakeScratchBytes = 4 << 10;
// Payload reads at least this large go straight into their destination.
constexpr uint64_t kDirectReadMin = 4096;
constexpr uint64_t kConnectRetryMs = 50;
// The most one uv_buf_t carries: its length is 32 bits, and the kernel moves at most
// 2 GiB per call anyway.
constexpr size_t kMaxBufBytes = size_t{1} << 30;

uint64_t now_ms(uv_loop_t* loop) { return uv_now(loop); }

Status uv_error(const std::string& what, int err) {
  return {Code::Io, what + ": " + uv_strerror(err)};
}

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

// One encoded frame on its way out, and whom to tell once the kernel has it.
struct TcpTransport::WriteReq {
  uv_write_t req{};
  TcpTransport* owner = nullptr;
  uint8_t header[kHeaderSize];
  std::string name;
  std::vector<uint8_t> owned;
  const uint8_t* payload = nullptr;
  size_t len = 0;
  std::function<void(const Status&)> on_sent;

  size_t bytes() const { return kHeaderSize + name.size() + len; }
  // Appends the frame's non-empty pieces after its first `skip` bytes. uv_buf_t holds a
  // 32-bit length, so a piece longer than kMaxBufBytes is split, never cut short.
  void bufs(std::vector<uv_buf_t>* out, size_t skip) {
    char* base[3] = {reinterpret_cast<char*>(header), name.data(),
                     const_cast<char*>(reinterpret_cast<const char*>(payload))};
    size_t size[3] = {kHeaderSize, name.size(), len};
    for (int i = 0; i < 3; ++i) {
      size_t cut = std::min(skip, size[i]);
      skip -= cut;
      for (size_t at = cut; at < size[i]; at += kMaxBufBytes) {
        const size_t piece = std::min(size[i] - at, kMaxBufBytes);
        out->push_back(uv_buf_init(base[i] + at, static_cast<unsigned>(piece)));
      }
    }
  }
};

struct TcpTransport::Conn {
  enum class State { Header, Name, Payload };

  TcpTransport* owner = nullptr;
  uv_tcp_t tcp{};
  uv_connect_t connect_req{};
  int rank = -1;          // known once the peer's Hello arrived (dialled: expected rank)
  int dial_rank = -1;     // the rank this side dialled, -1 for accepted connections
  bool identified = false;
  bool reading = false;
  bool paused = false;
  bool closing = false;
  bool got_bye = false;
  bool draining = false;  // graceful shutdown: closes itself once queued writes are out
  std::unique_ptr<Handshake> hs;      // until identified
  std::vector<uint8_t> hs_payload;    // a handshake frame's payload
  uint64_t opened_at = 0;             // loop time the handshake began; 0: not connected yet

  State state = State::Header;
  uint8_t hdr[kHeaderSize];
  size_t hdr_have = 0;
  FrameHeader h;
  std::string name;
  uint8_t* target = nullptr;
  uint64_t payload_have = 0;
  bool direct = false;

  std::vector<uint8_t> buf = std::vector<uint8_t>(kHandshakeScratchBytes);
  std::vector<WriteReq*> outbox;  // frames sent while the transport is corked
  size_t begin = 0;
  size_t end = 0;

  uv_stream_t* stream() { return reinterpret_cast<uv_stream_t*>(&tcp); }

  void start_reading();
  // A pause takes effect between frames: stopped inside one, the payload that a handler
  // pausing for lack of room may be waiting on would never arrive.
  bool at_boundary() const { return state == State::Header && hdr_have == 0; }
  void settle_pause();
  void count_read(size_t n) {
    ++owner->read_events_;
    owner->read_bytes_ += n;
    if (identified && owner->opt_.link_counters != nullptr) owner->opt_.link_counters[rank].add_received(n);
  }
  void process();
  Status consume_header();
  Status name_complete();
  void frame_complete();
};

namespace {

void on_alloc(uv_handle_t* handle, size_t, uv_buf_t* out) {
  auto* c = static_cast<TcpTransport::Conn*>(handle->data);
  uint64_t remaining = c->h.payload_len - c->payload_have;
  if (c->state == TcpTransport::Conn::State::Payload && c->target != nullptr &&
      c->begin == c->end && remaining >= kDirectReadMin) {
    c->direct = true;
    *out = uv_buf_init(reinterpret_cast<char*>(c->target + c->payload_have),
                       static_cast<unsigned>(std::min<uint64_t>(remaining, 1u << 30)));
    return;
  }
  c->direct = false;
  if (c->begin == c->end) c->begin = c->end = 0;
  if (c->buf.size() - c->end < c->buf.size() / 4) {
    std::memmove(c->buf.data(), c->buf.data() + c->begin, c->end - c->begin);
    c->end -= c->begin;
    c->begin = 0;
  }
  *out = uv_buf_init(reinterpret_cast<char*>(c->buf.data() + c->end),
                     static_cast<unsigned>(c->buf.size() - c->end));
}

void on_read(uv_stream_t* stream, ssize_t nread, const uv_buf_t*) {
  auto* c = static_cast<TcpTransport::Conn*>(stream->data);
  if (nread < 0) {
    std::string why = nread == UV_EOF ? "connection closed by peer" : uv_strerror(static_cast<int>(nread));
    if (c->hdr_have > 0) {
      why += " after " + std::to_string(c->hdr_have) + " of the " + std::to_string(kHeaderSize) +
             " bytes of a frame header";
    } else if (c->state != TcpTransport::Conn::State::Header) {
      why += " in the middle of a frame";
    }
    c->owner->conn_failed(c, {Code::PeerLost, why});
    return;
  }
  if (nread == 0) return;
  c->count_read(static_cast<size_t>(nread));
  // Replies to every frame of this read leave together, one write per peer.
  TcpTransport* owner = c->owner;
  owner->cork();
  if (c->direct) {
    c->payload_have += static_cast<uint64_t>(nread);
    if (c->payload_have == c->h.payload_len) c->frame_complete();
    c->settle_pause();
  } else {
    c->end += static_cast<size_t>(nread);
    c->process();
  }
  owner->uncork();
}

void on_close(uv_handle_t* handle) {
  auto* c = static_cast<TcpTransport::Conn*>(handle->data);
  c->owner->conn_closed(c);
}

}  // namespace

void TcpTransport::Conn::start_reading() {
  if (reading || paused || closing) return;
  reading = uv_read_start(stream(), on_alloc, on_read) == 0;
}

void TcpTransport::Conn::settle_pause() {
  if (!paused || !reading || !at_boundary()) return;
  uv_read_stop(stream());
  reading = false;
}

void TcpTransport::Conn::process() {
  while (begin < end && !(paused && at_boundary()) && !closing) {
    size_t avail = end - begin;
    uint8_t* p = buf.data() + begin;
    switch (state) {
      case State::Header: {
        size_t n = std::min(avail, kHeaderSize - hdr_have);
        std::memcpy(hdr + hdr_have, p, n);
        hdr_have += n;
        begin += n;
        if (hdr_have == kHeaderSize) {
          Status s = consume_header();
          if (!s.is_ok()) return owner->conn_failed(this, s);
        }
        break;
      }
      case State::Name: {
        size_t n = std::min<size_t>(avail, h.name_len - name.size());
        name.append(reinterpret_cast<const char*>(p), n);
        begin += n;
        if (name.size() == h.name_len) {
          Status s = name_complete();
          if (!s.is_ok()) return owner->conn_failed(this, s);
        }
        break;
      }
      case State::Payload: {
        size_t n = static_cast<size_t>(std::min<uint64_t>(avail, h.payload_len - payload_have));
        if (target != nullptr) std::memcpy(target + payload_have, p, n);
        payload_have += n;
        begin += n;
        if (payload_have == h.payload_len) frame_complete();
        break;
      }
    }
  }
  settle_pause();
}

Status TcpTransport::Conn::consume_header() {
  hdr_have = 0;
  FrameLimits limits = owner->opt_.limits;
  limits.world_size = static_cast<uint32_t>(owner->opt_.size);
  limits.cluster_version = owner->opt_.cluster_version;
  Status s = decode_header(hdr, limits, &h);
  if (!s.is_ok()) return s;
  name.clear();
  state = State::Name;
  if (h.name_len == 0) return name_complete();
  return {};
}

Status TcpTransport::Conn::name_complete() {
  target = nullptr;
  payload_have = 0;
  state = State::Payload;
  if (!identified) {
    // Until the handshake is done only its own small frames are read; nothing else is
    // buffered or reaches the op engine.
    if (h.type != MsgType::Hello && h.type != MsgType::Auth) {
      return {Code::Protocol, "frame of type " + std::to_string(static_cast<int>(h.type)) +
                                  " before the handshake finished"};
    }
    if (h.payload_len > Handshake::kMaxPayload) {
      return {Code::Protocol, "handshake frame with a " + std::to_string(h.payload_len) +
                                  "-byte payload"};
    }
    hs_payload.resize(h.payload_len);
    target = hs_payload.data();
  } else if (h.type == MsgType::Hello || h.type == MsgType::Auth) {
    return {Code::Protocol, "handshake frame on an open connection"};
  } else if (h.type == MsgType::Bye) {
    got_bye = true;
  } else if (static_cast<int>(h.src_rank) != rank) {
    return {Code::Protocol, "frame claims rank " + std::to_string(h.src_rank) +
                                " on the connection of rank " + std::to_string(rank)};
  } else {
    Status s = owner->handler_->accept_frame(rank, h, name, nullptr, &target);
    if (!s.is_ok()) return s;
  }
  if (h.payload_len == 0) frame_complete();
  return {};
}

void TcpTransport::Conn::frame_complete() {
  state = State::Header;
  if (!identified) return owner->on_handshake_frame(this);
  if (identified && h.type != MsgType::Hello && h.type != MsgType::Bye && !closing) {
    owner->handler_->frame_done(rank, h, name);
  }
}

TcpTransport::TcpTransport(uv_loop_t* loop, TcpOptions options, ReceiveHandler* handler)
    : loop_(loop), opt_(std::move(options)), handler_(handler), by_rank_(opt_.size, nullptr) {
  uv_timer_init(loop_, &connect_timer_);
  connect_timer_.data = this;
  uv_idle_init(loop_, &idle_);
  idle_.data = this;
  uv_timer_init(loop_, &sweep_timer_);
  sweep_timer_.data = this;
  open_handles_ = 3;
  uint64_t period = std::clamp<uint64_t>(opt_.handshake_timeout_ms / 4, 10, 250);
  uv_timer_start(&sweep_timer_, [](uv_timer_t* t) {
    static_cast<TcpTransport*>(t->data)->sweep_handshakes();
  }, period, period);
}

TcpTransport::~TcpTransport() = default;

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
  if (rc != 0) return uv_error("cannot listen on " + opt_.listen_host, rc);
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
  for (int r = 0; r < opt_.rank; ++r) start_connect(r);
  uv_timer_start(&connect_timer_, [](uv_timer_t* t) {
    auto* self = static_cast<TcpTransport*>(t->data);
    if (!self->on_ready_) return;
    std::string missing;
    for (int r = 0; r < self->opt_.size; ++r) {
      if (r != self->opt_.rank && self->by_rank_[r] == nullptr) missing += " " + std::to_string(r);
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
    uv_close(reinterpret_cast<uv_handle_t*>(&c->tcp), on_close);
    // The peer may not be listening yet (a restarted process); retry until the deadline.
    if (stopping_ || !on_ready_) return;
    if (now_ms(loop_) + kConnectRetryMs >= connect_deadline_) {
      return finish_ready(uv_error("cannot connect to rank " + std::to_string(rank) + " at " +
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
  HandshakeParams params{opt_.rank, opt_.size, opt_.cluster_version, opt_.job_id, opt_.secret};
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
    uv_close(reinterpret_cast<uv_handle_t*>(&c->tcp), on_close);
    return;
  }
  int pending = 0;
  for (Conn* other : conns_) {
    if (other->dial_rank < 0 && !other->identified && !other->closing) pending++;
  }
  // The new connection counts itself.
  if (pending > opt_.max_pending_connections) {
    log().warn("refusing a connection: {} connections are already in their handshake",
               pending - 1);
    c->closing = true;
    uv_close(reinterpret_cast<uv_handle_t*>(&c->tcp), on_close);
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
  if (!s.is_ok()) return conn_failed(c, s);
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
  for (int r = 0; r < opt_.size; ++r) {
    if (r != opt_.rank && by_rank_[r] == nullptr) return;
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

void TcpTransport::send(int dst, OutMessage msg) {
  Conn* c = (dst >= 0 && dst < opt_.size) ? by_rank_[dst] : nullptr;
  if (c == nullptr || c->closing) {
    auto cb = std::move(msg.on_sent);
    if (cb) defer([cb, dst] { cb({Code::PeerLost, "no connection to rank " + std::to_string(dst)}); });
    return;
  }
  if (c->draining) {
    // Our Bye is queued: nothing may follow it (an Answer or a credit the engine still
    // sends while we leave). Written, it would fail with EPIPE once the write side is
    // shut and drop the link before the Bye is out, so the peer would see a loss.
    auto cb = std::move(msg.on_sent);
    if (cb) defer([cb] { cb({Code::Finalized, "this rank is leaving the job"}); });
    return;
  }
  if (corked_ > 0) {
    if (c->outbox.empty()) corked_conns_.push_back(c);
    c->outbox.push_back(frame(c, std::move(msg)));
    return;
  }
  if (int rc = write(c, std::move(msg)); rc != 0) {
    defer([this, dst, rc] { drop(dst, uv_error("write failed", rc)); });
  }
}

TcpTransport::WriteReq* TcpTransport::frame(Conn* c, OutMessage msg) {
  auto* w = new WriteReq();
  w->owner = this;
  w->name = std::move(msg.name);
  w->owned = std::move(msg.owned);
  w->on_sent = std::move(msg.on_sent);
  w->payload = w->owned.empty() ? msg.payload : w->owned.data();
  w->len = w->owned.empty() ? msg.payload_len : w->owned.size();
  msg.header.src_rank = static_cast<uint32_t>(opt_.rank);
  msg.header.cluster_version = opt_.cluster_version;
  msg.header.name_len = static_cast<uint16_t>(w->name.size());
  msg.header.payload_len = w->len;
  encode_header(msg.header, w->header);
  if (c->identified && opt_.link_counters != nullptr) {
    opt_.link_counters[c->rank].add_sent(w->bytes());
  }
  return w;
}

int TcpTransport::write(Conn* c, OutMessage msg) {
  WriteReq* w = frame(c, std::move(msg));
  return write_frames(c, &w, 1);
}

namespace {

// What uv_try_write does, but with MSG_NOSIGNAL: a connection whose other end has gone
// fails with EPIPE instead of raising SIGPIPE, so the writing thread needs no signal mask
// (three system calls per wait for a caller that runs the loop). Bytes written, or a
// negative libuv error; UV_EAGAIN when nothing could be written now.
int write_now(uv_stream_t* stream, const uv_buf_t* bufs, unsigned nbufs) {
  // Behind queued writes: they go first, from the loop (as in uv_try_write).
  if (uv_stream_get_write_queue_size(stream) != 0) return UV_EAGAIN;
  uv_os_fd_t fd;
  if (int rc = uv_fileno(reinterpret_cast<const uv_handle_t*>(stream), &fd); rc != 0) return rc;
  // On Unix a uv_buf_t is laid out as an iovec (libuv passes them to writev as they are).
  static_assert(sizeof(uv_buf_t) == sizeof(iovec) && offsetof(uv_buf_t, base) == offsetof(iovec, iov_base) &&
                offsetof(uv_buf_t, len) == offsetof(iovec, iov_len));
  msghdr msg{};
  msg.msg_iov = reinterpret_cast<iovec*>(const_cast<uv_buf_t*>(bufs));
  msg.msg_iovlen = std::min<unsigned>(nbufs, IOV_MAX);
  for (;;) {
    const ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return static_cast<int>(std::min<ssize_t>(n, INT_MAX));
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS) return UV_EAGAIN;
    return -errno;  // libuv's error codes are negated errno values on Unix
  }
}

}  // namespace

int TcpTransport::write_frames(Conn* c, WriteReq* const* ws, size_t n) {
  size_t sent = 0;
  // With nothing queued on the connection, write now, all frames in one call: a frame the
  // kernel takes whole needs no write request, and libuv no POLLOUT round (two epoll_ctl
  // calls) to complete it.
  if (!uv_is_closing(reinterpret_cast<uv_handle_t*>(&idle_))) {
    std::vector<uv_buf_t> bufs;
    bufs.reserve(3 * n);
    for (size_t i = 0; i < n; ++i) ws[i]->bufs(&bufs, 0);
    int rc = write_now(c->stream(), bufs.data(), static_cast<unsigned>(bufs.size()));
    if (rc < 0 && rc != UV_EAGAIN) {
      fail_frames(ws, n, uv_error("write failed", rc));
      // The other side closed: its Bye, if it said one, and the end of the stream are still
      // to be read, and the read side tells a goodbye from a loss (as for a write that
      // fails later, in its callback). Dropping the link here would call a finalized peer
      // lost.
      if (rc == UV_EPIPE || rc == UV_ECONNRESET) return 0;
      return rc;
    }
    sent = rc > 0 ? static_cast<size_t>(rc) : 0;
  }
  for (size_t i = 0; i < n; ++i) {
    WriteReq* w = ws[i];
    if (sent >= w->bytes()) {
      sent -= w->bytes();
      // Reported from the loop, never from inside the caller's send().
      auto cb = std::move(w->on_sent);
      delete w;
      if (cb) defer([cb] { cb({}); });
      continue;
    }
    std::vector<uv_buf_t> rest;
    w->bufs(&rest, sent);
    const unsigned nrest = static_cast<unsigned>(rest.size());
    sent = 0;
    w->req.data = w;
    // libuv writes without MSG_NOSIGNAL, now or from the loop later (which then blocks
    // SIGPIPE while writes are queued, see Peer).
    block_sigpipe_here();
    int rc = uv_write(&w->req, c->stream(), rest.data(), nrest, [](uv_write_t* req, int status) {
      auto* wr = static_cast<WriteReq*>(req->data);
      wr->owner->queued_writes_--;
      if (wr->on_sent) {
        wr->on_sent(status == 0 ? Status{} : uv_error("write failed", status));
      }
      delete wr;
    });
    if (rc != 0) {
      fail_frames(ws + i, n - i, uv_error("write failed", rc));
      return rc;
    }
    queued_writes_++;
  }
  return 0;
}

void TcpTransport::fail_frames(WriteReq* const* ws, size_t n, const Status& why) {
  for (size_t i = 0; i < n; ++i) {
    auto cb = std::move(ws[i]->on_sent);
    delete ws[i];
    // Reported from the loop, never from inside the caller's send().
    if (cb) defer([cb, why] { cb(why); });
  }
}

void TcpTransport::cork() { ++corked_; }

void TcpTransport::uncork() {
  if (--corked_ == 0) flush_corked();
}

void TcpTransport::flush_corked() {
  auto conns = std::move(corked_conns_);
  corked_conns_.clear();
  for (Conn* c : conns) {
    auto batch = std::move(c->outbox);
    c->outbox.clear();
    if (c->closing) {
      fail_frames(batch.data(), batch.size(),
                  {Code::PeerLost, "no connection to rank " + std::to_string(c->rank)});
    } else if (int rc = write_frames(c, batch.data(), batch.size()); rc != 0) {
      int dst = c->rank;
      defer([this, dst, rc] { drop(dst, uv_error("write failed", rc)); });
    }
  }
}

uint64_t TcpTransport::queued_bytes(int dst) const {
  Conn* c = (dst >= 0 && dst < opt_.size) ? by_rank_[dst] : nullptr;
  return c == nullptr ? 0 : uv_stream_get_write_queue_size(c->stream());
}

void TcpTransport::pause_reading(int src) {
  Conn* c = by_rank_[src];
  if (c == nullptr || c->paused) return;
  c->paused = true;
  c->settle_pause();
}

void TcpTransport::resume_reading(int src) {
  Conn* c = by_rank_[src];
  if (c == nullptr || !c->paused) return;
  c->paused = false;
  // Bytes already buffered are parsed from the loop, not from inside the caller's handler.
  defer([this, src] {
    Conn* conn = by_rank_[src];
    if (conn == nullptr || conn->paused || conn->closing) return;
    conn->process();
    if (!conn->paused && !conn->closing) conn->start_reading();
  });
}

void TcpTransport::drop(int rank, const Status& why) {
  Conn* c = (rank >= 0 && rank < opt_.size) ? by_rank_[rank] : nullptr;
  if (c != nullptr) conn_failed(c, why);
}

void TcpTransport::conn_failed(Conn* c, const Status& why) {
  if (c->closing) return;
  c->closing = true;
  if (c->reading) uv_read_stop(c->stream());
  int rank = c->identified ? c->rank : -1;
  if (rank >= 0 && by_rank_[rank] == c) by_rank_[rank] = nullptr;
  uv_close(reinterpret_cast<uv_handle_t*>(&c->tcp), on_close);
  if (stopping_) return;
  if (rank < 0) {
    log().warn("dropping unidentified connection: {}", why.message());
    last_refusal_ = why.message();
    if (c->dial_rank >= 0 && on_ready_) {
      Code code = why.code() == Code::Auth ? Code::Auth : Code::Bootstrap;
      std::string what = why.message();
      // The acceptor refuses a handshake by closing: its own log says why.
      if (c->hs != nullptr && why.code() == Code::PeerLost) {
        what = "it closed the connection during the handshake (a job secret on one side only, "
               "another job id, or another library version; rank " +
               std::to_string(c->dial_rank) + "'s log says which): " + what;
      }
      finish_ready({code, "connection to rank " + std::to_string(c->dial_rank) + " failed: " + what});
    }
    return;
  }
  bool graceful = c->got_bye;
  if (!graceful) log().error("link to rank {} lost: {}", rank, why.message());
  if (on_ready_) finish_ready({Code::Bootstrap, "link to rank " + std::to_string(rank) + " lost during set-up: " + why.message()});
  handler_->link_down(rank, graceful, why);
}

void TcpTransport::close_conn(Conn* c) {
  c->closing = true;
  if (c->identified && by_rank_[c->rank] == c) by_rank_[c->rank] = nullptr;
  uv_close(reinterpret_cast<uv_handle_t*>(&c->tcp), on_close);
}

void TcpTransport::conn_closed(Conn* c) {
  if (c->identified && by_rank_[c->rank] == c) by_rank_[c->rank] = nullptr;
  conns_.erase(c);
  delete c;
  open_handles_--;
  maybe_closed();
}

void TcpTransport::defer(std::function<void()> fn) {
  if (uv_is_closing(reinterpret_cast<uv_handle_t*>(&idle_))) return fn();
  if (deferred_.empty() && !uv_is_closing(reinterpret_cast<uv_handle_t*>(&idle_))) {
    uv_idle_start(&idle_, [](uv_idle_t* h) { static_cast<TcpTransport*>(h->data)->run_deferred(); });
  }
  deferred_.push_back(std::move(fn));
}

void TcpTransport::run_deferred() {
  auto work = std::move(deferred_);
  deferred_.clear();
  uv_idle_stop(&idle_);
  for (auto& fn : work) fn();
}

void TcpTransport::shutdown(std::function<void()> on_closed) {
  if (stopping_) return;
  // Frames held by a cork go before the Bye.
  flush_corked();
  stopping_ = true;
  on_closed_ = std::move(on_closed);
  for (Conn* c : std::vector<Conn*>(conns_.begin(), conns_.end())) {
    if (c->closing) continue;
    if (!c->identified) {
      close_conn(c);
      continue;
    }
    OutMessage bye;
    bye.header.type = MsgType::Bye;
    bye.name = opt_.job_id;
    send(c->rank, std::move(bye));
    // Queued writes drain first, then the write side closes; the peer sees Bye, then EOF.
    auto* req = new uv_shutdown_t;
    req->data = c;
    c->draining = true;
    if (uv_shutdown(req, c->stream(), [](uv_shutdown_t* r, int) {
          auto* conn = static_cast<Conn*>(r->data);
          delete r;
          if (!uv_is_closing(reinterpret_cast<uv_handle_t*>(&conn->tcp))) {
            conn->owner->close_conn(conn);
          }
        }) != 0) {
      delete req;
      close_conn(c);
    }
  }
  close_now(nullptr);
}

void TcpTransport::close_now(std::function<void()> on_closed) {
  flush_corked();
  stopping_ = true;
  const bool forced = static_cast<bool>(on_closed);
  if (forced) on_closed_ = std::move(on_closed);
  on_ready_ = nullptr;
  for (Conn* c : std::vector<Conn*>(conns_.begin(), conns_.end())) {
    // Connections in a graceful shutdown close themselves once their writes drain;
    // close_now with a callback means "do not wait for that".
    if (uv_is_closing(reinterpret_cast<uv_handle_t*>(&c->tcp))) continue;
    if (c->draining && !forced) continue;
    close_conn(c);
  }
  auto close_member = [](uv_handle_t* h) {
    if (uv_is_closing(h)) return;
    uv_close(h, [](uv_handle_t* handle) {
      auto* self = static_cast<TcpTransport*>(handle->data);
      self->open_handles_--;
      self->maybe_closed();
    });
  };
  if (listening_) close_member(reinterpret_cast<uv_handle_t*>(&listener_));
  close_member(reinterpret_cast<uv_handle_t*>(&connect_timer_));
  close_member(reinterpret_cast<uv_handle_t*>(&sweep_timer_));
  if (!uv_is_closing(reinterpret_cast<uv_handle_t*>(&idle_))) {
    // Work deferred before the stop (failed-send notices) still runs.
    run_deferred();
    close_member(reinterpret_cast<uv_handle_t*>(&idle_));
  }
}

void TcpTransport::maybe_closed() {
  if (stopping_ && open_handles_ == 0 && on_closed_) {
    auto cb = std::move(on_closed_);
    on_closed_ = nullptr;
    cb();
  }
}

}  // namespace taiji

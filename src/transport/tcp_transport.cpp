#include "transport/tcp_transport.h"

#include "monitor/log.h"
#include "transport/tcp_conn.h"

namespace taiji {

namespace tcp {

Status uv_error(const std::string& what, int err) {
  return {Code::Io, what + ": " + uv_strerror(err)};
}

void on_close(uv_handle_t* handle) {
  auto* c = static_cast<TcpTransport::Conn*>(handle->data);
  c->owner->conn_closed(c);
}

}  // namespace tcp

TcpTransport::TcpTransport(uv_loop_t* loop, TcpOptions options, ReceiveHandler* handler)
    : loop_(loop), opt_(std::move(options)), handler_(handler), by_rank_(opt_.cluster->size, nullptr) {
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

void TcpTransport::send(int dst, OutMessage msg) {
  Conn* c = (dst >= 0 && dst < opt_.cluster->size) ? by_rank_[dst] : nullptr;
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
    defer([this, dst, rc] { drop(dst, tcp::uv_error("write failed", rc)); });
  }
}

uint64_t TcpTransport::queued_bytes(int dst) const {
  Conn* c = (dst >= 0 && dst < opt_.cluster->size) ? by_rank_[dst] : nullptr;
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
  Conn* c = (rank >= 0 && rank < opt_.cluster->size) ? by_rank_[rank] : nullptr;
  if (c != nullptr) conn_failed(c, why);
}

void TcpTransport::conn_failed(Conn* c, const Status& why) {
  if (c->closing) return;
  c->closing = true;
  if (c->reading) uv_read_stop(c->stream());
  int rank = c->identified ? c->rank : -1;
  if (rank >= 0 && by_rank_[rank] == c) by_rank_[rank] = nullptr;
  uv_close(reinterpret_cast<uv_handle_t*>(&c->tcp), tcp::on_close);
  if (stopping_) return;
  if (rank < 0) {
    if (c->dial_rank < 0) {
      refused(refusal_reason(why), why.message());
    } else {
      log().warn("dropping unidentified connection: {}", why.message());
    }
    last_refusal_ = why.message();
    if (c->dial_rank >= 0 && on_ready_) {
      Code code = why.code() == Code::Auth ? Code::Auth : Code::Bootstrap;
      std::string what = why.message();
      // The acceptor refuses a handshake by closing: its own log says why.
      if (c->hs != nullptr && why.code() == Code::PeerLost) {
        what = "it closed the connection during the handshake (a job secret on one side only, "
               "another job id, another cluster version (a stale member), or another library "
               "version; rank " +
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

RefusalReason TcpTransport::refusal_reason(const Status& why) {
  switch (why.code()) {
    case Code::Auth: return RefusalReason::Auth;
    case Code::Timeout: return RefusalReason::HandshakeTimeout;
    case Code::Protocol: return RefusalReason::Malformed;
    case Code::PeerLost: case Code::Io: return RefusalReason::Closed;
    default: return RefusalReason::Other;
  }
}

void TcpTransport::refused(RefusalReason reason, const std::string& why) {
  if (opt_.refusals != nullptr) opt_.refusals->add(reason);
  refusal_log_.refused(reason, why, uv_now(loop_));
}

void TcpTransport::close_conn(Conn* c) {
  c->closing = true;
  if (c->identified && by_rank_[c->rank] == c) by_rank_[c->rank] = nullptr;
  uv_close(reinterpret_cast<uv_handle_t*>(&c->tcp), tcp::on_close);
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

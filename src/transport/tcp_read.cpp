// TcpTransport's read path: bytes from the socket parsed frame by frame, a payload read
// straight into its destination when the handler names one.
#include <cstring>
#include <string>

#include "transport/tcp_conn.h"

namespace taiji {

namespace {

// Payload reads at least this large go straight into their destination.
constexpr uint64_t kDirectReadMin = 4096;

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
  limits.world_size = static_cast<uint32_t>(owner->opt_.cluster->size);
  limits.cluster_version = owner->opt_.cluster->version;
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
    if (h.type != MsgType::Hello && h.type != MsgType::Auth && h.type != MsgType::Refuse) {
      return {Code::Protocol, "frame of type " + std::to_string(static_cast<int>(h.type)) +
                                  " before the handshake finished"};
    }
    if (h.payload_len > Handshake::kMaxPayload) {
      return {Code::Protocol, "handshake frame with a " + std::to_string(h.payload_len) +
                                  "-byte payload"};
    }
    hs_payload.resize(h.payload_len);
    target = hs_payload.data();
  } else if (h.type == MsgType::Hello || h.type == MsgType::Auth || h.type == MsgType::Refuse) {
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

}  // namespace taiji

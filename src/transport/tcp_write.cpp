// TcpTransport's write path: frames encoded, held while corked, then written at once
// where the socket takes them and queued with libuv where it does not.
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <climits>

#include "transport/sigpipe.h"
#include "transport/tcp_conn.h"

namespace taiji {

TcpTransport::WriteReq* TcpTransport::frame(Conn* c, OutMessage msg) {
  auto* w = new WriteReq();
  w->owner = this;
  w->name = std::move(msg.name);
  w->owned = std::move(msg.owned);
  w->on_sent = std::move(msg.on_sent);
  w->payload = w->owned.empty() ? msg.payload : w->owned.data();
  w->len = w->owned.empty() ? msg.payload_len : w->owned.size();
  msg.header.src_rank = static_cast<uint32_t>(opt_.cluster->rank);
  msg.header.cluster_version = opt_.cluster->version;
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
      fail_frames(ws, n, tcp::uv_error("write failed", rc));
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
        wr->on_sent(status == 0 ? Status{} : tcp::uv_error("write failed", status));
      }
      delete wr;
    });
    if (rc != 0) {
      fail_frames(ws + i, n - i, tcp::uv_error("write failed", rc));
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
      defer([this, dst, rc] { drop(dst, tcp::uv_error("write failed", rc)); });
    }
  }
}

}  // namespace taiji

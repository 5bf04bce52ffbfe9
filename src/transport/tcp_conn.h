// TcpTransport's records of a connection and of a frame on its way out, shared by its
// source files: tcp_connect.cpp (listen, dial, accept, handshake), tcp_read.cpp (frames
// parsed into their targets), tcp_write.cpp (frames encoded, corked and written) and
// tcp_transport.cpp (the links' lifecycle and shutdown).
#pragma once

#include <uv.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "transport/tcp_transport.h"

namespace taiji {

namespace tcp {

// Until its handshake is done a connection only reads small frames: a small buffer keeps
// many pending (possibly hostile) connections cheap.
constexpr size_t kHandshakeScratchBytes = 4 << 10;
// The most one uv_buf_t carries: its length is 32 bits, and the kernel moves at most
// 2 GiB per call anyway.
constexpr size_t kMaxBufBytes = size_t{1} << 30;

Status uv_error(const std::string& what, int err);
// A connection's close callback: the owner forgets and frees it.
void on_close(uv_handle_t* handle);

}  // namespace tcp

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
  // 32-bit length, so a piece longer than tcp::kMaxBufBytes is split, never cut short.
  void bufs(std::vector<uv_buf_t>* out, size_t skip) {
    char* base[3] = {reinterpret_cast<char*>(header), name.data(),
                     const_cast<char*>(reinterpret_cast<const char*>(payload))};
    size_t size[3] = {kHeaderSize, name.size(), len};
    for (int i = 0; i < 3; ++i) {
      size_t cut = std::min(skip, size[i]);
      skip -= cut;
      for (size_t at = cut; at < size[i]; at += tcp::kMaxBufBytes) {
        const size_t piece = std::min(size[i] - at, tcp::kMaxBufBytes);
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

  std::vector<uint8_t> buf = std::vector<uint8_t>(tcp::kHandshakeScratchBytes);
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

}  // namespace taiji

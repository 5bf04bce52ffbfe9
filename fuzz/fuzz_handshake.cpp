// The connection handshake fed with what an unauthenticated client could send.
//
// Input: one mode byte (bit 0: the peer under test dials rather than accepts; bit 1: the job
// has a secret), then a stream of frames as on the wire: a 64-byte header, name_len bytes of
// name, payload_len bytes of payload. Frames go through decode_header with the limits the
// transport uses before a handshake is done (payload at most Handshake::kMaxPayload), then to
// Handshake::on_frame, until one is refused or the input ends.
//
// The property: with a secret, no input finishes the handshake, since finishing needs an
// HMAC over a nonce this side drew after the input was fixed. Without a secret a finished
// handshake must name a valid peer rank. Either violation aborts: it would let a stranger in.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "transport/frame.h"
#include "transport/handshake.h"

namespace {

using namespace taiji;

constexpr int kRank = 1;
constexpr int kSize = 4;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_handshake: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool dialer = (data[0] & 1) != 0;
  const bool with_secret = (data[0] & 2) != 0;
  HandshakeParams params;
  params.rank = kRank;
  params.size = kSize;
  params.cluster_version = 0;
  params.job_id = "job";
  if (with_secret) params.secret = "fuzzing secret, not in any input";
  Handshake hs(params, dialer ? Handshake::Role::Dialer : Handshake::Role::Acceptor, dialer ? 0 : -1);
  std::vector<OutMessage> hello;
  if (!hs.start(&hello).is_ok()) return 0;

  FrameLimits limits;
  limits.world_size = kSize;
  limits.cluster_version = 0;
  limits.max_name_len = 256;
  limits.max_payload = Handshake::kMaxPayload;
  size_t at = 1;
  while (at + kHeaderSize <= size && !hs.done()) {
    FrameHeader h;
    if (!decode_header(data + at, limits, &h).is_ok()) break;
    at += kHeaderSize;
    if (size - at < h.name_len) break;
    std::string name(reinterpret_cast<const char*>(data + at), h.name_len);
    at += h.name_len;
    if (size - at < h.payload_len) break;
    std::vector<uint8_t> payload(data + at, data + at + h.payload_len);
    at += h.payload_len;
    std::vector<OutMessage> out;
    if (!hs.on_frame(h, name, payload, &out).is_ok()) {
      check(!hs.done(), "a refused handshake reports done");
      break;
    }
    for (const OutMessage& m : out) {
      check(m.header.src_rank == static_cast<uint32_t>(kRank), "a reply carries another rank");
      check(m.owned.size() <= Handshake::kMaxPayload, "a reply is larger than a handshake frame");
    }
  }
  if (hs.done()) {
    check(!with_secret, "a stranger finished an authenticated handshake");
    check(hs.peer_rank() >= 0 && hs.peer_rank() < kSize && hs.peer_rank() != kRank,
          "a finished handshake names an impossible peer");
  }
  return 0;
}

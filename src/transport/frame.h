// The wire frame: a fixed 64-byte little-endian header, then name_len bytes of op name,
// then payload_len bytes of payload. decode_header validates every field before the
// receiver allocates or reads anything else.
//
// Layout (byte offset: field):
//   0 magic u32 ("TJ01" = 0x3130'4A54)   4 protocol u16   6 type u8   7 op_kind u8
//   8 cluster_version u32  12 src_rank u32  16 dtype u8  17 redop u8  18 name_len u16
//  20 root u32  24 op_version u64  32 count u64  40 chunk u32  44 stage u8  45 strategy u8
//  46 strategy_tag u16  48 offset u64  56 payload_len u64
// strategy and strategy_tag together carry 24 bits of the topology's digest.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/op_kind.h"
#include "common/status.h"

namespace taiji {

constexpr uint32_t kFrameMagic = 0x31304A54;
constexpr uint16_t kProtocolVersion = 1;
constexpr size_t kHeaderSize = 64;
constexpr uint64_t kShmDataPayload = 16;  // a ShmData payload: ring position and length

enum class MsgType : uint8_t {
  Hello = 1,   // first frame on a connection: name = job id, src_rank, cluster_version
  Ready = 2,   // receiver posted (name, op_version): bulk data may flow to it
  Data = 3,    // one chunk of one stage of one op
  Abort = 4,   // the op failed on the sender (payload: UTF-8 reason); chunk = -status
  Bye = 5,     // the sender finalized: nothing more comes on this connection
  Auth = 6,    // handshake: proof of the job secret (payload: HMAC-SHA256)
  Query = 7,   // "have you posted (name, op_version)?" (a stalled op's watchdog asks)
  Answer = 8,  // reply to a Query: chunk = 1 when posted (or done), 0 when not
  ShmOffer = 9,   // a shared-memory ring for this direction (payload: transport/shm_ring.h)
  ShmReply = 10,  // answer to a ShmOffer: chunk = 1 when mapped, 0 when declined
  ShmData = 11,   // a Data or ModelReply frame whose payload is in the ring (payload:
                  // where); the header is that frame's but for type and payload_len. It
                  // stands for a Data frame when op_kind names an op, for a ModelReply
                  // when op_kind is 0 (as every ModelReply's is); the receiver rebuilds
                  // that frame and validates it like one that came whole
  ShmBell = 12,   // frames wait in the shared-memory mailbox (no payload)
  Refuse = 13,    // handshake: why the acceptor closes (payload: one RefuseReason byte)
  // The model store (runtime/model_service.h), one-sided: the owner's caller takes no part.
  ModelRequest = 14,  // name = model, op_version = version (0: latest), count = the bytes
                      // the requester expects, chunk = request id; no payload
  ModelReply = 15,    // op_kind 0, chunk = request id, op_version = version served,
                      // count = its size; stage 0: payload = bytes
                      // [offset, offset + payload_len) of the model;
                      // stage 1: the request failed, root = -status, payload = UTF-8 reason
  // The device backend's sequencing (runtime/device_backend.h), name "taiji.device":
  // stage 0 announcements to rank 0, stage 1 an order (one batch) from rank 0, stage 2 the
  // device communicator's id from rank 0, stage 3 the sender's device communicator failed
  // (root = -status, payload = UTF-8 reason). Payloads: device/sequencer.h.
  Device = 16,
};
constexpr uint8_t kMaxMsgType = 16;

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint16_t protocol = kProtocolVersion;
  MsgType type = MsgType::Data;
  OpKind op_kind = OpKind::None;
  uint32_t cluster_version = 0;
  uint32_t src_rank = 0;
  uint8_t dtype = 0;
  uint8_t redop = 0;
  uint16_t name_len = 0;
  uint32_t root = 0;
  uint64_t op_version = 0;
  uint64_t count = 0;
  uint32_t chunk = 0;
  uint8_t stage = 0;
  uint8_t strategy = 0;
  uint16_t strategy_tag = 0;
  uint64_t offset = 0;
  uint64_t payload_len = 0;
};

struct FrameLimits {
  uint32_t world_size = 1;          // src_rank and root must be below it
  uint32_t cluster_version = 0;     // must match exactly
  uint16_t max_name_len = 256;
  uint64_t max_payload = 64ull << 20;
};

void encode_header(const FrameHeader& h, uint8_t out[kHeaderSize]);
// Parses and validates magic, protocol, type, op kind (0 in a ModelReply), dtype, redop
// (for Data frames, and ShmData frames that stand for one, of reducing kinds), name length (>= 1 except Hello may be 0; <= max), payload length (<= max;
// for Data a multiple of the dtype size), ranks and cluster version. The
// message of an error names the field and its value.
Status decode_header(const uint8_t in[kHeaderSize], const FrameLimits& limits, FrameHeader* out);

}  // namespace taiji

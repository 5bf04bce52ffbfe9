#include "transport/frame.h"

#include <cstdio>
#include <string>

#include "common/byte_order.h"
#include "common/dtype.h"

namespace taiji {

namespace {

Status bad(std::string message) { return {Code::Protocol, std::move(message)}; }

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", static_cast<unsigned>(v));
  return buf;
}

std::string num(uint64_t v) { return std::to_string(v); }

const char* type_name(MsgType t) {
  switch (t) {
    case MsgType::Hello: return "Hello";
    case MsgType::Ready: return "Ready";
    case MsgType::Data: return "Data";
    case MsgType::Abort: return "Abort";
    case MsgType::Bye: return "Bye";
    case MsgType::Auth: return "Auth";
    case MsgType::Query: return "Query";
    case MsgType::Answer: return "Answer";
    case MsgType::ShmOffer: return "ShmOffer";
    case MsgType::ShmReply: return "ShmReply";
    case MsgType::ShmData: return "ShmData";
    case MsgType::ShmBell: return "ShmBell";
    case MsgType::Refuse: return "Refuse";
    case MsgType::ModelRequest: return "ModelRequest";
    case MsgType::ModelReply: return "ModelReply";
    case MsgType::Device: return "Device";
  }
  return "?";
}

}  // namespace

void encode_header(const FrameHeader& h, uint8_t out[kHeaderSize]) {
  put32(out + 0, h.magic);
  put16(out + 4, h.protocol);
  out[6] = static_cast<uint8_t>(h.type);
  out[7] = static_cast<uint8_t>(h.op_kind);
  put32(out + 8, h.cluster_version);
  put32(out + 12, h.src_rank);
  out[16] = h.dtype;
  out[17] = h.redop;
  put16(out + 18, h.name_len);
  put32(out + 20, h.root);
  put64(out + 24, h.op_version);
  put64(out + 32, h.count);
  put32(out + 40, h.chunk);
  out[44] = h.stage;
  out[45] = h.strategy;
  put16(out + 46, h.strategy_tag);
  put64(out + 48, h.offset);
  put64(out + 56, h.payload_len);
}

Status decode_header(const uint8_t in[kHeaderSize], const FrameLimits& limits,
                     FrameHeader* out) {
  FrameHeader h;
  h.magic = get32(in + 0);
  h.protocol = get16(in + 4);
  const uint8_t type = in[6];
  const uint8_t op_kind = in[7];
  h.cluster_version = get32(in + 8);
  h.src_rank = get32(in + 12);
  h.dtype = in[16];
  h.redop = in[17];
  h.name_len = get16(in + 18);
  h.root = get32(in + 20);
  h.op_version = get64(in + 24);
  h.count = get64(in + 32);
  h.chunk = get32(in + 40);
  h.stage = in[44];
  h.strategy = in[45];
  h.strategy_tag = get16(in + 46);
  h.offset = get64(in + 48);
  h.payload_len = get64(in + 56);

  if (h.magic != kFrameMagic) return bad("bad magic " + hex32(h.magic));
  if (h.protocol != kProtocolVersion) {
    return bad("unsupported protocol " + num(h.protocol) + " (expected " +
               num(kProtocolVersion) + ")");
  }
  if (type < 1 || type > kMaxMsgType) return bad("bad type " + num(type));
  h.type = static_cast<MsgType>(type);
  if (op_kind > kMaxOpKind) return bad("bad op_kind " + num(op_kind));
  h.op_kind = static_cast<OpKind>(op_kind);
  // Hello and Bye belong to the connection, not to an op. A ShmData frame stands for a
  // Data frame when it names an op and for a ModelReply when it does not (frame.h).
  const bool per_op = h.type == MsgType::Ready || h.type == MsgType::Data ||
                      h.type == MsgType::Abort;
  if (per_op && h.op_kind == OpKind::None) {
    return bad(std::string("op_kind 0 in a ") + type_name(h.type) + " frame");
  }
  // Else a ModelReply through the ring would come back as a Data frame.
  if (h.type == MsgType::ModelReply && h.op_kind != OpKind::None) {
    return bad("op_kind " + num(op_kind) + " in a ModelReply frame (expected 0)");
  }
  if (h.src_rank >= limits.world_size) {
    return bad("src_rank " + num(h.src_rank) + " not below world_size " +
               num(limits.world_size));
  }
  if (h.cluster_version != limits.cluster_version) {
    return bad("cluster_version " + num(h.cluster_version) + " does not match " +
               num(limits.cluster_version) + " (a member of cluster version " + num(h.cluster_version) +
               " where this membership is version " + num(limits.cluster_version) +
               ": a stale or partitioned peer)");
  }
  if (h.name_len > limits.max_name_len) {
    return bad("name_len " + num(h.name_len) + " exceeds cap " + num(limits.max_name_len));
  }
  if (h.name_len == 0 && h.type != MsgType::Hello) {
    return bad(std::string("name_len 0 in a ") + type_name(h.type) + " frame");
  }
  if (h.payload_len > limits.max_payload) {
    return bad("payload_len " + num(h.payload_len) + " exceeds cap " + num(limits.max_payload));
  }
  if (h.type == MsgType::ShmData && h.payload_len != kShmDataPayload) {
    return bad("payload_len " + num(h.payload_len) + " in a ShmData frame (expected " +
               num(kShmDataPayload) + ")");
  }
  if (h.type == MsgType::ModelRequest && h.payload_len != 0) {
    return bad("payload_len " + num(h.payload_len) + " in a ModelRequest frame (expected 0)");
  }
  if (h.type == MsgType::ModelReply && h.stage > 1) return bad("bad stage " + num(h.stage) + " in a ModelReply frame");
  if (h.type == MsgType::Device && h.stage > 3) return bad("bad stage " + num(h.stage) + " in a Device frame");
  // A ShmData frame for a ModelReply is checked as one once rebuilt (shm_transport.cpp).
  if (h.type == MsgType::Data || (h.type == MsgType::ShmData && h.op_kind != OpKind::None)) {
    if (!valid_dtype(h.dtype)) return bad("bad dtype " + num(h.dtype));
    if (op_kind_reduces(h.op_kind) && !valid_redop(h.redop)) {
      return bad("bad redop " + num(h.redop));
    }
    if (h.root >= limits.world_size) {
      return bad("root " + num(h.root) + " not below world_size " + num(limits.world_size));
    }
    if (h.stage > static_cast<uint8_t>(Stage::Broadcast)) return bad("bad stage " + num(h.stage));
    const size_t elem = dtype_size(static_cast<DType>(h.dtype));
    if (h.payload_len % elem != 0) {
      return bad("payload_len " + num(h.payload_len) + " not a multiple of dtype size " +
                 num(elem) + " (" + std::string(dtype_name(static_cast<DType>(h.dtype))) +
                 ")");
    }
  }
  *out = h;
  return Status::ok();
}

}  // namespace taiji

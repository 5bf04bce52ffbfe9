// decode_header on any 64 bytes, under limits taken from the input.
//
// Input: the 64-byte header, then optionally an 18-byte limits trailer (little endian):
// world_size u32, cluster_version u32, max_name_len u16, max_payload u64. Without the
// trailer the limits admit the header's own ranks and cluster version, so a seed that is a
// plain valid frame decodes and mutations start from the accepting path.
//
// Every header that decodes must satisfy the documented contract, and encode_header must
// give back exactly the input bytes (each of the 64 bytes belongs to one field), which
// decode again to the same header; a rejection is a Protocol error with a message. Any
// difference aborts: it is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/dtype.h"
#include "transport/frame.h"

namespace {

using taiji::FrameHeader;
using taiji::FrameLimits;
using taiji::kHeaderSize;

constexpr size_t kTrailerSize = 18;

uint64_t get_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_frame: %s\n", what);
    std::abort();
  }
}

FrameLimits limits_for(const uint8_t* data, size_t size) {
  FrameLimits limits;
  if (size >= kHeaderSize + kTrailerSize) {
    const uint8_t* t = data + kHeaderSize;
    limits.world_size = static_cast<uint32_t>(get_le(t, 4));
    limits.cluster_version = static_cast<uint32_t>(get_le(t + 4, 4));
    limits.max_name_len = static_cast<uint16_t>(get_le(t + 8, 2));
    limits.max_payload = get_le(t + 10, 8);
    return limits;
  }
  const uint32_t src_rank = static_cast<uint32_t>(get_le(data + 12, 4));
  const uint32_t root = static_cast<uint32_t>(get_le(data + 20, 4));
  const uint32_t highest = src_rank > root ? src_rank : root;
  limits.world_size = highest == UINT32_MAX ? UINT32_MAX : highest + 1;
  limits.cluster_version = static_cast<uint32_t>(get_le(data + 8, 4));
  limits.max_name_len = UINT16_MAX;
  return limits;
}

bool same(const FrameHeader& a, const FrameHeader& b) {
  return a.magic == b.magic && a.protocol == b.protocol && a.type == b.type &&
         a.op_kind == b.op_kind && a.cluster_version == b.cluster_version &&
         a.src_rank == b.src_rank && a.dtype == b.dtype && a.redop == b.redop &&
         a.name_len == b.name_len && a.root == b.root && a.op_version == b.op_version &&
         a.count == b.count && a.chunk == b.chunk && a.stage == b.stage &&
         a.strategy == b.strategy && a.strategy_tag == b.strategy_tag &&
         a.offset == b.offset && a.payload_len == b.payload_len;
}

void check_contract(const FrameHeader& h, const FrameLimits& limits) {
  using taiji::MsgType;
  using taiji::OpKind;
  check(h.magic == taiji::kFrameMagic, "accepted a bad magic");
  check(h.protocol == taiji::kProtocolVersion, "accepted a bad protocol");
  const auto type = static_cast<uint8_t>(h.type);
  check(type >= 1 && type <= taiji::kMaxMsgType, "accepted a bad type");
  check(static_cast<uint8_t>(h.op_kind) <= taiji::kMaxOpKind, "accepted a bad op_kind");
  const bool per_op = h.type == MsgType::Ready || h.type == MsgType::Data ||
                      h.type == MsgType::Abort;
  check(!per_op || h.op_kind != OpKind::None, "accepted op_kind 0 in a per-op frame");
  // A ShmData frame without an op stands for a ModelReply: one with an op would not.
  check(h.type != MsgType::ModelReply || h.op_kind == OpKind::None,
        "accepted an op_kind in a ModelReply frame");
  check(h.src_rank < limits.world_size, "accepted src_rank >= world_size");
  check(h.cluster_version == limits.cluster_version, "accepted a foreign cluster_version");
  check(h.name_len <= limits.max_name_len, "accepted name_len over the cap");
  check(h.name_len >= 1 || h.type == MsgType::Hello, "accepted name_len 0 outside Hello");
  check(h.payload_len <= limits.max_payload, "accepted payload_len over the cap");
  if (h.type == MsgType::Data) {
    check(taiji::valid_dtype(h.dtype), "accepted a bad dtype in a Data frame");
    check(!taiji::op_kind_reduces(h.op_kind) || taiji::valid_redop(h.redop),
          "accepted a bad redop in a reducing Data frame");
    check(h.root < limits.world_size, "accepted root >= world_size in a Data frame");
    check(h.stage <= static_cast<uint8_t>(taiji::Stage::Broadcast), "accepted a bad stage");
    const size_t elem = taiji::dtype_size(static_cast<taiji::DType>(h.dtype));
    check(elem != 0 && h.payload_len % elem == 0,
          "accepted a Data payload that is not whole elements");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < kHeaderSize) return 0;
  const FrameLimits limits = limits_for(data, size);
  FrameHeader h;
  if (const taiji::Status st = decode_header(data, limits, &h); !st.is_ok()) {
    check(st.code() == taiji::Code::Protocol && !st.message().empty(),
          "a rejection is not a Protocol error with a message");
    return 0;
  }
  check_contract(h, limits);

  uint8_t encoded[kHeaderSize];
  encode_header(h, encoded);
  check(std::memcmp(encoded, data, kHeaderSize) == 0, "encode(decode(bytes)) != bytes");
  FrameHeader again;
  check(decode_header(encoded, limits, &again).is_ok(), "encode(h) does not decode");
  check(same(h, again), "decode(encode(h)) != h");
  return 0;
}

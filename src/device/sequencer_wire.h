// The sequencer's byte format, shared by the client and the coordinator (sequencer.cpp).
//
// Both directions: [format u8 = 1][record count u32][records]. The count makes a message
// that was cut at a record boundary a Protocol error rather than a shorter valid one.
// All integers little-endian. A spec is 15 bytes: kind u8, dtype u8, redop u8, count u64,
// root i32; it must be canonical (redop Sum for kinds that do not reduce, root 0 for kinds
// without one), so equal ops have equal bytes and the bytes can key the id cache.
//
// Rank -> coordinator records:
//   AnnounceFull  [1][name len u16][name][version u64][spec]
//   AnnounceId    [2][id u32][version u64]                       13 bytes
//   Withdraw      [3][name len u16][name][version u64]
// Coordinator -> every rank records:
//   RunDefine     [0x11][id u32][version u64][name len u16][name][spec]
//                 ids are dense: a definition carries the next id the reader does not know
//   RunId         [0x12][id u32][version u64]                    13 bytes
//   RunFull       [0x13][name len u16][name][version u64]        (the id cache is full)
//   Mismatch      [0x14][name len u16][name][version u64][why len u16][why]
//   Withdrawn     [0x15][name len u16][name][version u64][why len u16][why]
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/byte_order.h"
#include "device/sequencer.h"

namespace taiji::seq_wire {

constexpr uint8_t kFormat = 1;
constexpr size_t kHeaderBytes = 5;
constexpr size_t kSpecBytes = 15;
constexpr size_t kMaxName = 65535;
constexpr size_t kMaxWhy = 4096;
// Ids are never taken back (every rank would have to forget them at the same point of
// the order), so their number is capped; past it ops are announced and run by name.
constexpr uint32_t kMaxIds = 1u << 16;

enum Tag : uint8_t {
  AnnounceFull = 1,
  AnnounceId = 2,
  Withdraw = 3,
  RunDefine = 0x11,
  RunId = 0x12,
  RunFull = 0x13,
  Mismatch = 0x14,
  Withdrawn = 0x15,
};

// A bounds-checked cursor: a read past the end returns zeros and sets `bad` for good,
// so a parser checks once per record instead of once per field.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), size_(size) {}
  bool bad() const { return bad_; }
  bool at_end() const { return pos_ == size_; }
  uint8_t u8() { return take(1) ? p_[pos_ - 1] : 0; }
  uint16_t u16() { return take(2) ? get16(p_ + pos_ - 2) : 0; }
  uint32_t u32() { return take(4) ? get32(p_ + pos_ - 4) : 0; }
  uint64_t u64() { return take(8) ? get64(p_ + pos_ - 8) : 0; }
  // A u16 length, then that many bytes.
  std::string text() {
    const size_t n = u16();
    if (!take(n)) return {};
    return std::string(reinterpret_cast<const char*>(p_ + pos_ - n), n);
  }
  // A spec; sets `bad` when it is not a canonical one.
  DeviceOpSpec spec() {
    DeviceOpSpec s;
    const uint8_t kind = u8(), dtype = u8(), redop = u8();
    s.count = u64();
    s.root = static_cast<int32_t>(u32());
    if (kind == 0 || kind > kMaxOpKind || !valid_dtype(dtype) || !valid_redop(redop)) bad_ = true;
    s.kind = static_cast<OpKind>(kind);
    s.dtype = static_cast<DType>(dtype);
    s.redop = static_cast<RedOp>(redop);
    if (!bad_ && (s.redop != RedOp::Sum && !op_kind_reduces(s.kind))) bad_ = true;
    if (!bad_ && (op_kind_rooted(s.kind) ? s.root < 0 : s.root != 0)) bad_ = true;
    return s;
  }

 private:
  bool take(size_t n) {
    if (bad_ || size_ - pos_ < n) {
      bad_ = true;
      return false;
    }
    pos_ += n;
    return true;
  }
  const uint8_t* p_;
  size_t size_;
  size_t pos_ = 0;
  bool bad_ = false;
};

inline void put_u8(std::vector<uint8_t>& out, uint8_t v) { out.push_back(v); }
inline void put_u16(std::vector<uint8_t>& out, uint16_t v) {
  out.resize(out.size() + 2);
  put16(out.data() + out.size() - 2, v);
}
inline void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  out.resize(out.size() + 4);
  put32(out.data() + out.size() - 4, v);
}
inline void put_u64(std::vector<uint8_t>& out, uint64_t v) {
  out.resize(out.size() + 8);
  put64(out.data() + out.size() - 8, v);
}
// Callers keep `s` within its u16 length (kMaxName, kMaxWhy).
inline void put_text(std::vector<uint8_t>& out, const std::string& s) {
  put_u16(out, static_cast<uint16_t>(s.size()));
  out.insert(out.end(), s.begin(), s.end());
}
inline void put_spec(std::vector<uint8_t>& out, const DeviceOpSpec& s) {
  put_u8(out, static_cast<uint8_t>(s.kind));
  put_u8(out, static_cast<uint8_t>(s.dtype));
  put_u8(out, static_cast<uint8_t>(s.redop));
  put_u64(out, s.count);
  put_u32(out, static_cast<uint32_t>(s.root));
}

// The fields an op's kind ignores, set to their one canonical value.
inline DeviceOpSpec canonical(DeviceOpSpec s) {
  if (!op_kind_reduces(s.kind)) s.redop = RedOp::Sum;
  if (!op_kind_rooted(s.kind)) s.root = 0;
  return s;
}

// The id cache's key: the spec's bytes, then the name.
inline std::string def_key(const std::string& name, const DeviceOpSpec& spec) {
  std::vector<uint8_t> b;
  put_spec(b, spec);
  std::string k(b.begin(), b.end());
  return k + name;
}

// Starts a record in `msg` (beginning the message when it is empty) and counts it.
inline void begin_record(std::vector<uint8_t>& msg, uint8_t tag) {
  if (msg.size() < kHeaderBytes) {
    msg.assign(kHeaderBytes, 0);
    msg[0] = kFormat;
  }
  put32(msg.data() + 1, get32(msg.data() + 1) + 1);
  msg.push_back(tag);
}

}  // namespace taiji::seq_wire

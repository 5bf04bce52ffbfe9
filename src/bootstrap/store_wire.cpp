#include "bootstrap/store_wire.h"

#include "common/byte_order.h"

namespace taiji::store_wire {

namespace {

const uint8_t* bytes(const char* p) { return reinterpret_cast<const uint8_t*>(p); }

// A cursor over a request that may not have fully arrived yet.
struct Reader {
  std::string_view in;
  size_t pos = 0;

  bool has(size_t n) const { return in.size() - pos >= n; }
  uint8_t u8() { return static_cast<uint8_t>(in[pos++]); }
  uint32_t u32() {
    uint32_t v = read_u32(in.data() + pos);
    pos += 4;
    return v;
  }
  std::string text(size_t n) {
    std::string s(in.substr(pos, n));
    pos += n;
    return s;
  }
};

bool known_op(char op) {
  return op == 'S' || op == 'G' || op == 'A' || op == 'C' || op == 'D' || op == 'W';
}

// Reads a length field and the bytes it announces into *out.
Parse length_prefixed(Reader& r, const char* what, std::string* out, std::string* why) {
  if (!r.has(4)) return Parse::Incomplete;
  uint32_t len = r.u32();
  if (len > kRendezvousMaxValue) {
    *why = std::string(what) + " of " + std::to_string(len) + " bytes";
    return Parse::Bad;
  }
  if (!r.has(len)) return Parse::Incomplete;
  *out = r.text(len);
  return Parse::Done;
}

Parse flags(Reader& r, bool* absent, std::string* why) {
  if (!r.has(1)) return Parse::Incomplete;
  uint8_t f = r.u8();
  if ((f & ~kFlagAbsent) != 0) {
    *why = "unknown flags " + std::to_string(f);
    return Parse::Bad;
  }
  *absent = (f & kFlagAbsent) != 0;
  return Parse::Done;
}

}  // namespace

void append_u32(std::string& out, uint32_t v) {
  uint8_t b[4];
  put32(b, v);
  out.append(reinterpret_cast<const char*>(b), sizeof(b));
}

void append_i64(std::string& out, int64_t v) {
  uint8_t b[8];
  put64(b, static_cast<uint64_t>(v));
  out.append(reinterpret_cast<const char*>(b), sizeof(b));
}

uint32_t read_u32(const char* p) { return get32(bytes(p)); }
int64_t read_i64(const char* p) { return static_cast<int64_t>(get64(bytes(p))); }

Parse parse_request(std::string_view in, Request* req, size_t* consumed, std::string* why) {
  Reader r{in};
  if (!r.has(1)) return Parse::Incomplete;
  Request q;
  q.op = static_cast<char>(r.u8());
  if (!known_op(q.op)) {
    *why = "unknown op " + std::to_string(static_cast<uint8_t>(q.op));
    return Parse::Bad;
  }
  if (!r.has(4)) return Parse::Incomplete;
  uint32_t key_len = r.u32();
  if (key_len > kRendezvousMaxKey) {
    *why = "key of " + std::to_string(key_len) + " bytes";
    return Parse::Bad;
  }
  if (!r.has(key_len)) return Parse::Incomplete;
  q.key = r.text(key_len);
  Parse p = Parse::Done;
  switch (q.op) {
    case 'S':
      p = length_prefixed(r, ("value for key '" + q.key + "'").c_str(), &q.value, why);
      break;
    case 'G':
      if (!r.has(4)) return Parse::Incomplete;
      q.timeout_ms = r.u32();
      break;
    case 'A':
      if (!r.has(8)) return Parse::Incomplete;
      q.delta = read_i64(in.data() + r.pos);
      r.pos += 8;
      break;
    case 'C':
      p = flags(r, &q.absent, why);
      if (p == Parse::Done) p = length_prefixed(r, "expected value", &q.expected, why);
      if (p == Parse::Done) p = length_prefixed(r, "value", &q.value, why);
      break;
    case 'W':
      if (!r.has(4)) return Parse::Incomplete;
      q.timeout_ms = r.u32();
      p = flags(r, &q.absent, why);
      if (p == Parse::Done) p = length_prefixed(r, "known value", &q.expected, why);
      break;
    default:
      break;
  }
  if (p != Parse::Done) return p;
  if (q.absent && !q.expected.empty()) {
    *why = "a value given with the absent flag";
    return Parse::Bad;
  }
  *consumed = r.pos;
  *req = std::move(q);
  return Parse::Done;
}

std::string encode_request(const Request& req) {
  std::string out;
  out.reserve(16 + req.key.size() + req.value.size() + req.expected.size());
  out.push_back(req.op);
  append_u32(out, static_cast<uint32_t>(req.key.size()));
  out += req.key;
  const uint8_t f = req.absent ? kFlagAbsent : 0;
  switch (req.op) {
    case 'S':
      append_u32(out, static_cast<uint32_t>(req.value.size()));
      out += req.value;
      break;
    case 'G':
      append_u32(out, req.timeout_ms);
      break;
    case 'A':
      append_i64(out, req.delta);
      break;
    case 'C':
      out.push_back(static_cast<char>(f));
      append_u32(out, static_cast<uint32_t>(req.expected.size()));
      out += req.expected;
      append_u32(out, static_cast<uint32_t>(req.value.size()));
      out += req.value;
      break;
    case 'W':
      append_u32(out, req.timeout_ms);
      out.push_back(static_cast<char>(f));
      append_u32(out, static_cast<uint32_t>(req.expected.size()));
      out += req.expected;
      break;
    default:
      break;
  }
  return out;
}

std::string encode_reply(uint8_t status, std::string_view value) {
  std::string out;
  out.reserve(kReplyHeader + value.size());
  out.push_back(static_cast<char>(status));
  append_u32(out, static_cast<uint32_t>(value.size()));
  out.append(value);
  return out;
}

}  // namespace taiji::store_wire

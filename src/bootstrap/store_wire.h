// The rendezvous store's wire format, shared by its server and its client.
//
// All integers little-endian. A request is op u8, key_len u32, key, then by op:
//   'S' set      value_len u32, value
//   'G' get      timeout_ms u32                     (waits for the key to be present)
//   'A' add      delta i64
//   'C' cas      flags u8 (1: expect absent), expected_len u32, expected, value_len u32, value
//   'D' delete   -
//   'W' watch    timeout_ms u32, flags u8 (1: known absent), known_len u32, known
// A reply is status u8, value_len u32, value, where the value of an ok reply is
//   'S' empty; 'G' the value; 'A' the new value, i64; 'C' swapped u8, present u8, current;
//   'D' was-present u8; 'W' present u8, value.
// 'S' and 'G' are the two requests the store first had, with the same encoding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "bootstrap/store.h"

namespace taiji::store_wire {

inline constexpr uint8_t kStatusOk = 0;
inline constexpr uint8_t kStatusTimeout = 1;
// The request could not be parsed; the server closes the connection after this reply.
inline constexpr uint8_t kStatusBadRequest = 2;
// Well-formed but not possible on the key as it is (not a counter, overflow); the value
// says why.
inline constexpr uint8_t kStatusInvalid = 3;
// Past a bound of the server (keys, watchers); the value says which.
inline constexpr uint8_t kStatusLimit = 4;

inline constexpr uint8_t kFlagAbsent = 1;

inline constexpr size_t kReplyHeader = 5;
// The largest request there is: a compare-and-set with key and both values at their caps.
inline constexpr size_t kMaxRequest = 1 + 4 + kRendezvousMaxKey + 1 + 4 + kRendezvousMaxValue + 4 +
                                      kRendezvousMaxValue;

struct Request {
  char op = 0;
  std::string key;
  std::string value;      // 'S', 'C': the new value
  std::string expected;   // 'C': the expected value; 'W': the known one
  bool absent = false;    // 'C': expect absent; 'W': known absent
  uint32_t timeout_ms = 0;  // 'G', 'W'
  int64_t delta = 0;      // 'A'
};

enum class Parse { Incomplete, Bad, Done };

// Parses the request at the front of `in`: Done sets *req and *consumed; Bad sets *why (a
// length over its cap is Bad as soon as its field has arrived, before the bytes it promises).
Parse parse_request(std::string_view in, Request* req, size_t* consumed, std::string* why);

std::string encode_request(const Request& req);
std::string encode_reply(uint8_t status, std::string_view value);

void append_u32(std::string& out, uint32_t v);
void append_i64(std::string& out, int64_t v);
uint32_t read_u32(const char* p);
int64_t read_i64(const char* p);

}  // namespace taiji::store_wire

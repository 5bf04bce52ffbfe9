// Connections a peer refused before they became links, counted by reason, and the log
// lines they cause, bounded: anyone who can reach a listening port can open connections,
// so each reason logs its first few refusals per interval and then one line with the
// count of the rest. The transport counts and logs on the I/O thread; any thread reads the
// counters for a snapshot (relaxed atomics: totals only).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

namespace taiji {

enum class RefusalReason : uint8_t {
  TooManyPending,    // past TAIJI_MAX_PENDING_CONNECTIONS handshakes at once
  HandshakeTimeout,  // no complete handshake within TAIJI_HANDSHAKE_TIMEOUT_MS
  Malformed,         // a bad header, a frame out of place, another job or rank
  Auth,              // a wrong, missing or unexpected job secret
  Closed,            // the other side closed (or reset) during the handshake
  Other,
};
constexpr int kRefusalReasons = 6;

// The label value of taiji_refused_connections_total{reason=...}.
const char* refusal_label(RefusalReason r);

struct RefusalCounters {
  std::array<std::atomic<uint64_t>, kRefusalReasons> count{};
  void add(RefusalReason r) { count[static_cast<size_t>(r)].fetch_add(1, std::memory_order_relaxed); }
  uint64_t get(RefusalReason r) const { return count[static_cast<size_t>(r)].load(std::memory_order_relaxed); }
};

// Per reason: the first kBurst refusals of each interval are logged whole at warn; the
// others at debug only, and the first refusal or flush after the interval ends logs one
// summary line at warn for them (with the last one's text). One thread only.
class RefusalLog {
 public:
  static constexpr int kBurst = 5;
  explicit RefusalLog(uint64_t interval_ms = 10000) : interval_ms_(interval_ms) {}
  // Logs (warn) "refusing a connection: <why>", or counts it for the summary.
  void refused(RefusalReason reason, const std::string& why, uint64_t now_ms);
  // Logs the summaries of intervals that have ended; call periodically.
  void flush(uint64_t now_ms);

 private:
  struct PerReason {
    uint64_t interval_start = 0;
    bool started = false;
    int logged = 0;          // in this interval
    uint64_t suppressed = 0;  // in this interval, not logged
    std::string last;        // the last suppressed one's text
  };
  void summarize(RefusalReason reason, PerReason& p, uint64_t now_ms);
  uint64_t interval_ms_;
  std::array<PerReason, kRefusalReasons> per_{};
};

}  // namespace taiji

#include "monitor/refusals.h"

#include "monitor/log.h"

namespace taiji {

const char* refusal_label(RefusalReason r) {
  switch (r) {
    case RefusalReason::TooManyPending: return "too_many_pending";
    case RefusalReason::HandshakeTimeout: return "handshake_timeout";
    case RefusalReason::Malformed: return "malformed";
    case RefusalReason::Auth: return "auth";
    case RefusalReason::Closed: return "closed";
    case RefusalReason::Other: return "other";
  }
  return "other";
}

void RefusalLog::refused(RefusalReason reason, const std::string& why, uint64_t now_ms) {
  PerReason& p = per_[static_cast<size_t>(reason)];
  if (!p.started || now_ms >= p.interval_start + interval_ms_) {
    summarize(reason, p, now_ms);
    p.started = true;
    p.interval_start = now_ms;
    p.logged = 0;
  }
  if (p.logged < kBurst) {
    p.logged++;
    log().warn("refusing a connection: {}", why);
    return;
  }
  // Past the burst each one is still there for whoever looks closer (TAIJI_LOG_LEVEL=debug).
  log().debug("refusing a connection: {}", why);
  p.suppressed++;
  p.last = why;
}

void RefusalLog::flush(uint64_t now_ms) {
  for (int r = 0; r < kRefusalReasons; ++r) {
    PerReason& p = per_[static_cast<size_t>(r)];
    if (p.started && now_ms >= p.interval_start + interval_ms_) summarize(static_cast<RefusalReason>(r), p, now_ms);
  }
}

void RefusalLog::summarize(RefusalReason reason, PerReason& p, uint64_t now_ms) {
  if (p.suppressed > 0) {
    log().warn("refused {} more connections ({}) in the last {} ms without logging each; the last: {}",
               p.suppressed, refusal_label(reason), now_ms - p.interval_start, p.last);
  }
  p.suppressed = 0;
  p.last.clear();
  // A quiet reason starts its next interval with its next refusal.
  p.started = false;
}

}  // namespace taiji

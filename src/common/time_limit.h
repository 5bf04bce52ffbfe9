// The longest wait anything here measures against a clock. Past it a timeout means "no
// limit": adding more milliseconds to a clock in nanoseconds would overflow.
#pragma once

#include <algorithm>
#include <cstdint>

namespace taiji {

inline constexpr int64_t kMaxTimeoutMs = 365LL * 24 * 3600 * 1000;  // a year

inline int64_t clamp_timeout_ms(int64_t ms) { return std::clamp<int64_t>(ms, 0, kMaxTimeoutMs); }

}  // namespace taiji

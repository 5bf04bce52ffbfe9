#include "monitor/metric_names.h"

#include <array>
#include <cstddef>

namespace taiji {

const char* op_kind_label(uint8_t kind) {
  static constexpr std::array<const char*, kOpKindLabels> kNames = {
      "none", "allreduce", "broadcast", "barrier", "allgather",
      "reduce", "gather", "reduce_scatter", "consensus"};
  return kind < kNames.size() ? kNames[kind] : "none";
}

const char* status_label(int32_t code) {
  static constexpr std::array<const char*, 18> kErrors = {
      "ok", "invalid_argument", "no_memory", "timeout", "mismatch", "peer_lost",
      "duplicate", "stale_version", "protocol", "io", "config", "aborted", "finalized",
      "version", "internal", "unsupported", "bootstrap", "auth"};
  if (code == 1) return "in_progress";
  if (code <= 0 && -code < static_cast<int32_t>(kErrors.size())) return kErrors[static_cast<std::size_t>(-code)];
  return "unknown";
}

}  // namespace taiji

// Label text for op kinds and statuses, shared by the JSON and Prometheus writers. The
// monitor sits below the transport, so kinds arrive as the numeric OpKind value
// (transport/frame.h) and statuses as the numeric Code (common/status.h).
#pragma once

#include <cstdint>

namespace taiji {

constexpr int kOpKindLabels = 9;  // OpKind::None .. OpKind::Consensus
// "allreduce", "broadcast", ...; "none" for 0 and unknown values.
const char* op_kind_label(uint8_t kind);
// "ok", "timeout", "mismatch", ... (lower case Code names); "unknown" for other values.
const char* status_label(int32_t code);

}  // namespace taiji

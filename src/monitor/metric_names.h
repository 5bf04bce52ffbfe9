// Label text for op kinds and statuses, shared by the JSON and Prometheus writers, from
// the vocabulary's own lists (common/op_kind.h, common/status.h). Kinds arrive as the
// numeric OpKind value and statuses as the numeric Code, as the flight recorder keeps them.
#pragma once

#include <cstdint>

#include "common/op_kind.h"

namespace taiji {

constexpr int kOpKindLabels = kOpKindCount;  // one per kind, None included
// "allreduce", "broadcast", ...; "none" for 0 and unknown values.
const char* op_kind_label(uint8_t kind);
// "ok", "timeout", "mismatch", ... (lower case Code names); "unknown" for other values.
const char* status_label(int32_t code);

}  // namespace taiji

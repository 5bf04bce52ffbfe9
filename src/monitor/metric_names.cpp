#include "monitor/metric_names.h"

#include "common/op_kind.h"
#include "common/status.h"

namespace taiji {

const char* op_kind_label(uint8_t kind) {
  return kind <= kMaxOpKind ? op_kind_name(static_cast<OpKind>(kind)) : "none";
}

const char* status_label(int32_t code) {
  const char* label = code_label(code);
  return label != nullptr ? label : "unknown";
}

}  // namespace taiji

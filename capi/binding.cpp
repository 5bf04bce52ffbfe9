// What a language binding needs beyond the collectives: names and sizes of the enums, and
// the process's log as callbacks.
#include <taiji/taiji.h>

#include <string>

#include "common/dtype.h"
#include "monitor/log.h"

static_assert(TAIJI_LOG_TRACE == static_cast<int>(spdlog::level::trace));
static_assert(TAIJI_LOG_CRITICAL == static_cast<int>(spdlog::level::critical));

extern "C" {

size_t taiji_dtype_size(taiji_dtype_t dtype) {
  const auto v = static_cast<uint32_t>(dtype);
  return taiji::valid_dtype(v) ? taiji::dtype_size(static_cast<taiji::DType>(v)) : 0;
}

const char* taiji_dtype_name(taiji_dtype_t dtype) {
  const auto v = static_cast<uint32_t>(dtype);
  // The names are string literals: their views are NUL-terminated.
  return taiji::valid_dtype(v) ? taiji::dtype_name(static_cast<taiji::DType>(v)).data() : "unknown";
}

const char* taiji_reduce_op_name(taiji_reduce_op_t op) {
  const auto v = static_cast<uint32_t>(op);
  return taiji::valid_redop(v) ? taiji::redop_name(static_cast<taiji::RedOp>(v)).data() : "unknown";
}

taiji_status_t taiji_set_log_callback(taiji_log_callback_t callback, taiji_log_level_t level,
                                      void* user_data) {
  if (level < TAIJI_LOG_TRACE || level > TAIJI_LOG_CRITICAL) return TAIJI_ERR_INVALID_ARGUMENT;
  try {
    taiji::LogSink sink;
    if (callback != nullptr) {
      sink = [callback, user_data](int l, std::string_view message) {
        const std::string text(message);  // NUL-terminated for the callee
        callback(static_cast<taiji_log_level_t>(l), text.c_str(), user_data);
      };
    }
    taiji::set_log_sink(std::move(sink));
    taiji::set_application_log_level(static_cast<spdlog::level::level_enum>(level));
    return TAIJI_OK;
  } catch (const std::bad_alloc&) {
    return TAIJI_ERR_NO_MEMORY;
  } catch (...) {
    return TAIJI_ERR_INTERNAL;
  }
}

}  // extern "C"

// The library's private spdlog logger ("taiji"), never the default logger, so an
// application's own spdlog set-up is left alone. Level from TAIJI_LOG_LEVEL.
#pragma once

#include <spdlog/spdlog.h>

#include <functional>
#include <string_view>

namespace taiji {

spdlog::logger& log();
// trace, debug, info, warn, error, critical, off. Unknown names leave the level unchanged
// and return false.
bool set_log_level(std::string_view level);

// Where lines go instead of stderr: (spdlog level, the message without time or level).
// Called with the sink's lock held, one line at a time. An empty sink restores stderr; once
// set_log_sink returns, the previous sink is not running and will not run again.
using LogSink = std::function<void(int level, std::string_view message)>;
void set_log_sink(LogSink sink);

}  // namespace taiji

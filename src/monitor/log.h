// The library's private spdlog logger ("taiji"), never the default logger, so an
// application's own spdlog set-up is left alone. Level from TAIJI_LOG_LEVEL.
#pragma once

#include <spdlog/spdlog.h>

#include <functional>
#include <string_view>

namespace taiji {

spdlog::logger& log();
// trace, debug, info, warn, error, critical, off, from a peer's configuration. Unknown
// names leave the level unchanged and return false. Once the application has chosen a
// level (set_application_log_level) this changes nothing: the log is the process's, and a
// peer created later (a split's child, a torch group) must not undo the application's choice.
bool set_log_level(std::string_view level);
// The level the application chose (taiji_set_log_callback); it stays until the next call.
void set_application_log_level(spdlog::level::level_enum level);

// Where lines go instead of stderr: (spdlog level, the message without time or level).
// Called with the sink's lock held, one line at a time. An empty sink restores stderr; once
// set_log_sink returns, the previous sink is not running and will not run again.
using LogSink = std::function<void(int level, std::string_view message)>;
void set_log_sink(LogSink sink);

}  // namespace taiji

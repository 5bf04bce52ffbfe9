// The library's private spdlog logger ("taiji"), never the default logger, so an
// application's own spdlog set-up is left alone. Level from TAIJI_LOG_LEVEL.
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

namespace taiji {

spdlog::logger& log();
// trace, debug, info, warn, error, critical, off. Unknown names leave the level unchanged
// and return false.
bool set_log_level(std::string_view level);

}  // namespace taiji

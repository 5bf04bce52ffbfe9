#include "monitor/log.h"

#include <spdlog/sinks/stdout_sinks.h>

#include <cstdlib>
#include <memory>

namespace taiji {

namespace {

std::shared_ptr<spdlog::logger> make_logger() {
  // Registered nowhere: spdlog's registry is process-global and may belong to the app.
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>("taiji", sink);
  logger->set_pattern("[taiji %H:%M:%S.%e %^%l%$] %v");
  logger->set_level(spdlog::level::warn);
  if (const char* env = std::getenv("TAIJI_LOG_LEVEL")) {
    auto level = spdlog::level::from_str(env);
    if (level != spdlog::level::off || std::string_view(env) == "off") logger->set_level(level);
  }
  return logger;
}

}  // namespace

spdlog::logger& log() {
  static std::shared_ptr<spdlog::logger> logger = make_logger();
  return *logger;
}

bool set_log_level(std::string_view level) {
  auto parsed = spdlog::level::from_str(std::string(level));
  if (parsed == spdlog::level::off && level != "off") return false;
  log().set_level(parsed);
  return true;
}

}  // namespace taiji

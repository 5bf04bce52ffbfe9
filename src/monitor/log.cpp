#include "monitor/log.h"

#include <spdlog/sinks/base_sink.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <utility>

namespace taiji {

namespace {

// Writes to stderr, or hands each line to the sink set by set_log_sink. One sink for the
// logger's whole life: swapping the target under the sink's own lock (which every line
// holds while it is written) means that once set_log_sink returns, the old target is
// neither running nor about to run.
class SwitchableSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  void set_target(LogSink target) {
    std::lock_guard<std::mutex> lock(mutex_);
    target_ = std::move(target);
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (target_) {
      target_(static_cast<int>(msg.level), std::string_view(msg.payload.data(), msg.payload.size()));
      return;
    }
    spdlog::memory_buf_t line;
    formatter_->format(msg, line);
    std::fwrite(line.data(), 1, line.size(), stderr);
  }
  void flush_() override { std::fflush(stderr); }

 private:
  LogSink target_;
};

struct Logger {
  std::shared_ptr<SwitchableSink> sink = std::make_shared<SwitchableSink>();
  std::shared_ptr<spdlog::logger> logger = std::make_shared<spdlog::logger>("taiji", sink);
};

Logger& instance() {
  // Registered nowhere: spdlog's registry is process-global and may belong to the app.
  static Logger* logger = [] {
    auto* l = new Logger;  // never freed: peers may log while static destructors run
    l->logger->set_pattern("[taiji %H:%M:%S.%e %^%l%$] %v");
    l->logger->set_level(spdlog::level::warn);
    if (const char* env = std::getenv("TAIJI_LOG_LEVEL")) {
      auto level = spdlog::level::from_str(env);
      if (level != spdlog::level::off || std::string_view(env) == "off") l->logger->set_level(level);
    }
    return l;
  }();
  return *logger;
}

// Set once the application chose the level; peers' configurations then leave it alone.
std::atomic<bool> application_level{false};

}  // namespace

spdlog::logger& log() { return *instance().logger; }

bool set_log_level(std::string_view level) {
  auto parsed = spdlog::level::from_str(std::string(level));
  if (parsed == spdlog::level::off && level != "off") return false;
  if (!application_level.load(std::memory_order_acquire)) log().set_level(parsed);
  return true;
}

void set_application_log_level(spdlog::level::level_enum level) {
  application_level.store(true, std::memory_order_release);
  log().set_level(level);
}

void set_log_sink(LogSink sink) { instance().sink->set_target(std::move(sink)); }

}  // namespace taiji

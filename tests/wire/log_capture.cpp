#include "log_capture.h"

#include <spdlog/sinks/base_sink.h>

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "monitor/log.h"

namespace wire {

namespace {
constexpr std::string_view kRefusing = "refusing a connection: ";
constexpr std::string_view kRefusalSummary = "refused ";
}  // namespace

class LogCapture::Sink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::vector<LogLine> take(size_t at_least, int64_t timeout_ms) {
    std::unique_lock<std::mutex> lock(mutex_);
    // Summaries of refusals come on the library's own schedule: they do not count.
    grew_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                   [&] { return counted_ >= at_least; });
    std::vector<LogLine> out;
    out.swap(lines_);
    counted_ = 0;
    return out;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    const std::string_view text(msg.payload.data(), msg.payload.size());
    if (msg.level < spdlog::level::warn && text.rfind(kRefusing, 0) != 0) return;
    if (text.rfind(kRefusalSummary, 0) != 0) counted_++;
    lines_.push_back({msg.level, std::string(msg.payload.data(), msg.payload.size())});
    grew_.notify_all();
  }
  void flush_() override {}

 private:
  std::vector<LogLine> lines_;  // guarded by base_sink's mutex_
  size_t counted_ = 0;          // of lines_, those that are not summaries
  std::condition_variable grew_;
};

LogCapture::LogCapture() : sink_(std::make_shared<Sink>()) {
  auto& sinks = taiji::log().sinks();
  saved_ = sinks;
  sinks.assign(1, sink_);
  saved_level_ = taiji::log().level();
  taiji::log().set_level(spdlog::level::debug);
}

LogCapture::~LogCapture() {
  taiji::log().set_level(saved_level_);
  taiji::log().sinks() = saved_;
}

std::vector<LogLine> LogCapture::take() { return sink_->take(0, 0); }

std::vector<LogLine> LogCapture::take_at_least(size_t n, int64_t timeout_ms) {
  return sink_->take(n, timeout_ms);
}

namespace {

std::string level_name(spdlog::level::level_enum level) {
  auto sv = spdlog::level::to_string_view(level);
  return std::string(sv.data(), sv.size());
}

}  // namespace

std::string expect_lines(const std::vector<LogLine>& lines, size_t count,
                         spdlog::level::level_enum level, const std::string& text) {
  std::string wrong;
  size_t shown = 0;
  size_t good = 0;
  for (const LogLine& l : lines) {
    if (l.level == level && l.text == text) {
      good++;
    } else if (shown++ < 3) {
      wrong += "\n  unexpected [" + level_name(l.level) +
               "] " + l.text;
    }
  }
  if (good == count && good == lines.size()) return {};
  return "expected " + std::to_string(count) + " x [" +
         level_name(level) + "] '" + text + "', got " +
         std::to_string(good) + " of them among " + std::to_string(lines.size()) + " lines" + wrong;
}

std::string expect_refusals(const std::vector<LogLine>& lines, size_t count, const std::string& why) {
  const std::string text = std::string(kRefusing) + why;
  std::string wrong;
  size_t shown = 0;
  size_t good = 0;
  size_t summaries = 0;
  for (const LogLine& l : lines) {
    const bool refusal_level = l.level == spdlog::level::warn || l.level == spdlog::level::debug;
    if (refusal_level && l.text == text) {
      good++;
    } else if (l.level == spdlog::level::warn && l.text.rfind(kRefusalSummary, 0) == 0) {
      summaries++;
    } else if (shown++ < 3) {
      wrong += "\n  unexpected [" + level_name(l.level) + "] " + l.text;
    }
  }
  if (good == count && good + summaries == lines.size()) return {};
  return "expected " + std::to_string(count) + " x '" + text + "', got " + std::to_string(good) +
         " of them among " + std::to_string(lines.size()) + " lines" + wrong;
}

size_t count_containing(const std::vector<LogLine>& lines, const std::string& needle) {
  size_t n = 0;
  for (const LogLine& l : lines) n += l.text.find(needle) != std::string::npos;
  return n;
}

}  // namespace wire

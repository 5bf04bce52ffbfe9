// Records what the library logs (every peer in the process shares the logger): lines at
// warn and above, and refused connections at any level (past a few per interval the
// library logs each at debug only). While it lives it replaces the logger's sinks and
// lowers its level to debug, so thousands of expected refusals do not flood stderr;
// construct it before any peer starts and destroy it after they all stopped.
#pragma once

#include <spdlog/common.h>
#include <spdlog/sinks/sink.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace wire {

struct LogLine {
  spdlog::level::level_enum level;
  std::string text;
};

class LogCapture {
 public:
  LogCapture();
  ~LogCapture();
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  // Lines logged since the previous take().
  std::vector<LogLine> take();
  // Waits until at least n lines are there (or timeout_ms passed), then takes them all.
  // The runtime may log a refusal just after closing the socket, so a closed socket
  // does not mean its line is already written.
  std::vector<LogLine> take_at_least(size_t n, int64_t timeout_ms);

  class Sink;

 private:
  std::shared_ptr<Sink> sink_;
  std::vector<spdlog::sink_ptr> saved_;
  spdlog::level::level_enum saved_level_;
};

// Empty when `lines` are exactly `count` lines at `level`, each equal to `text`; else a
// description of the difference (the first few unexpected lines).
std::string expect_lines(const std::vector<LogLine>& lines, size_t count,
                         spdlog::level::level_enum level, const std::string& text);
// Empty when `lines` hold exactly `count` refusals "refusing a connection: <why>" (at warn
// or, past the log's burst, at debug) and otherwise only the log's summaries of
// refusals; else a description of the difference.
std::string expect_refusals(const std::vector<LogLine>& lines, size_t count, const std::string& why);
// Lines containing `needle`.
size_t count_containing(const std::vector<LogLine>& lines, const std::string& needle);

}  // namespace wire

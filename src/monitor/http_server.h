// A tiny HTTP/1.1 server for the Prometheus endpoint: one thread, poll(), one request per
// connection (answered, then closed). GET (or HEAD) /metrics gets the text of `render`
// as text/plain; version=0.0.4; another path 404, another method 405, anything that is
// not an HTTP request line 400, a header block over 8 KiB 431. A client has 5 s from
// connecting to send its request and take the answer, and at most 32 are served at once,
// so slow or idle clients cannot pile up.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"

namespace taiji {

class MetricsServer {
 public:
  using Render = std::function<std::string()>;
  // Binds host:port (port 0: a free one) and serves on its own thread.
  static Result<std::unique_ptr<MetricsServer>> start(const std::string& host, uint16_t port,
                                                      Render render);
  ~MetricsServer();  // stops and joins
  // "host:port" as bound (the real port when 0 was asked).
  const std::string& address() const;

  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  struct Impl;

 private:
  explicit MetricsServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// TAIJI_METRICS_ADDR: "port", ":port", "host:port" or "[v6]:port"; the host defaults to
// 127.0.0.1 (loopback: metrics are not served to the network unless asked). Port 0
// picks a free one. Returns "" when valid, else why not.
std::string parse_metrics_address(const std::string& text, std::string* host, uint16_t* port);

}  // namespace taiji

#include "monitor/http_server.h"

#include <algorithm>
#include <chrono>
#include <string_view>

#include "common/socket_server.h"
#include "monitor/log.h"

namespace taiji {

namespace {

constexpr size_t kMaxHeaderBytes = 8192;
constexpr auto kClientDeadline = std::chrono::seconds(5);
constexpr size_t kMaxClients = 32;

std::string response(int code, const char* reason, std::string_view type, std::string_view body,
                     bool head) {
  std::string out = "HTTP/1.1 " + std::to_string(code) + " " + reason + "\r\n";
  out += "Content-Type: ";
  out += type;
  out += "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n";
  if (code == 405) out += "Allow: GET, HEAD\r\n";
  out += "\r\n";
  if (!head) out += body;
  return out;
}

std::string error_response(int code, const char* reason) {
  return response(code, reason, "text/plain; charset=utf-8", std::string(reason) + "\n", false);
}

}  // namespace

// One request per connection: answered once the header block is complete (or can no
// longer be), then closed when the answer is sent.
struct MetricsServer::Impl final : SocketServer::Service {
  std::string address;
  Render render;
  std::unique_ptr<SocketServer> server;  // last: stops before the rest goes

  void input(SocketServer::Connection& c, SocketServer::Connections&) override {
    const size_t end = c.in.find("\r\n\r\n");
    if (end == std::string::npos) {
      if (c.in.size() > kMaxHeaderBytes) {
        c.out = error_response(431, "Request Header Fields Too Large");
        c.close_when_sent = true;
      }
      return;
    }
    c.close_when_sent = true;
    std::string_view line(c.in.data(), c.in.find("\r\n"));
    const size_t sp1 = line.find(' ');
    const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
    if (sp2 == std::string_view::npos || line.substr(sp2 + 1).rfind("HTTP/1.", 0) != 0 ||
        line.find(' ', sp2 + 1) != std::string_view::npos) {
      c.out = error_response(400, "Bad Request");
      return;
    }
    const std::string_view method = line.substr(0, sp1);
    std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
    target = target.substr(0, target.find('?'));
    if (method != "GET" && method != "HEAD") {
      c.out = error_response(405, "Method Not Allowed");
    } else if (target != "/metrics") {
      c.out = error_response(404, "Not Found");
    } else {
      c.out = response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", render(), method == "HEAD");
    }
  }

  SocketServer::Clock::time_point tick(SocketServer::Connections& all) override {
    const auto now = SocketServer::Clock::now();
    auto next = SocketServer::Clock::time_point::max();
    for (auto& [fd, c] : all) {
      if (c->opened + kClientDeadline <= now) {
        c->dead = true;
      } else {
        next = std::min(next, c->opened + kClientDeadline);
      }
    }
    return next;
  }

  // A failed accept only pauses the server (it was logged nowhere before either); a
  // scrape that fails then is retried by the scraper.
  void failed(const std::string& what, bool fatal) override {
    if (fatal) log().error("metrics endpoint: {}", what);
  }
};

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MetricsServer::~MetricsServer() = default;

const std::string& MetricsServer::address() const { return impl_->address; }

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(const std::string& host, uint16_t port,
                                                            Render render) {
  auto impl = std::make_unique<Impl>();
  impl->render = std::move(render);
  SocketServer::Options options;
  options.name = "metrics endpoint";
  options.error_code = Code::Io;
  options.max_connections = kMaxClients;
  options.refuse_excess = true;
  // Room past the header limit to take in the bytes of a request that ran over: closing
  // with them unread would reset the connection and lose the 431.
  options.input_cap = kMaxHeaderBytes + 4096;
  options.backlog = 64;
  auto server = SocketServer::start(host, port, std::move(options), *impl);
  if (!server.is_ok()) return server.status();
  impl->server = std::move(server.value());
  const bool v6 = host.find(':') != std::string::npos;
  impl->address = (v6 ? "[" + host + "]" : host) + ":" + std::to_string(impl->server->port());
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl)));
}

std::string parse_metrics_address(const std::string& text, std::string* host, uint16_t* port) {
  std::string h = "127.0.0.1";
  std::string p = text;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find("]:");
    if (close == std::string::npos) return "an IPv6 host must be [addr]:port";
    h = text.substr(1, close - 1);
    p = text.substr(close + 2);
  } else if (const size_t colon = text.rfind(':'); colon != std::string::npos) {
    if (text.find(':') != colon) return "an IPv6 host must be [addr]:port";
    if (colon > 0) h = text.substr(0, colon);
    p = text.substr(colon + 1);
  }
  if (h.empty()) return "empty host";
  if (p.empty() || p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos) {
    return "port '" + p + "' is not a number in 0..65535";
  }
  const unsigned long v = std::stoul(p);
  if (v > 65535) return "port '" + p + "' is not a number in 0..65535";
  *host = h;
  *port = static_cast<uint16_t>(v);
  return "";
}

}  // namespace taiji

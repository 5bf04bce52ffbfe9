// The metrics endpoint's HTTP server and the monitoring configuration, without peers.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <string>
#include <thread>

#include "../support/descriptor_limit.h"
#include "monitor/http_server.h"
#include "runtime/config.h"

using taiji::MetricsServer;

namespace {

int connect_to(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

// Reads until the server closes, at most timeout_ms; "<timeout>" if it did not.
std::string read_all(int fd, int timeout_ms) {
  std::string out;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) return "<timeout>";
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    char buf[4096];
    ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

std::string http_exchange(uint16_t port, const std::string& request) {
  int fd = connect_to(port);
  REQUIRE(write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size()));
  std::string reply = read_all(fd, 10000);
  close(fd);
  return reply;
}

uint16_t port_of(const MetricsServer& s) {
  const std::string& a = s.address();
  return static_cast<uint16_t>(std::stoi(a.substr(a.rfind(':') + 1)));
}

taiji::Result<taiji::Config> resolve(std::map<std::string, std::string> env) {
  return taiji::resolve_config({}, [env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

}  // namespace

TEST_CASE("GET /metrics returns the rendered text; other requests get errors", "[http]") {
  std::atomic<int> renders{0};  // bumped on the server's thread
  auto server = MetricsServer::start("127.0.0.1", 0, [&] {
    renders++;
    return std::string("taiji_x{rank=\"0\"} 1\n");
  });
  REQUIRE(server.is_ok());
  const uint16_t port = port_of(*server.value());
  CHECK(port != 0);
  CHECK(server.value()->address() == "127.0.0.1:" + std::to_string(port));

  std::string ok = http_exchange(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK(ok.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(ok.find("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n") != std::string::npos);
  CHECK(ok.find("Content-Length: 20\r\n") != std::string::npos);
  CHECK(ok.substr(ok.size() - 20) == "taiji_x{rank=\"0\"} 1\n");
  std::string head = http_exchange(port, "HEAD /metrics?x=1 HTTP/1.0\r\n\r\n");
  CHECK(head.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(head.substr(head.size() - 4) == "\r\n\r\n");
  CHECK(http_exchange(port, "GET / HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 404 ", 0) == 0);
  CHECK(http_exchange(port, "POST /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 405 ", 0) == 0);
  CHECK(http_exchange(port, "hello\r\n\r\n").rfind("HTTP/1.1 400 ", 0) == 0);
  CHECK(http_exchange(port, "GET /metrics SPDY/3\r\n\r\n").rfind("HTTP/1.1 400 ", 0) == 0);
  CHECK(http_exchange(port, "GET /metrics HTTP/1.1\r\nX: " + std::string(9000, 'a')).rfind("HTTP/1.1 431 ", 0) == 0);
  CHECK(renders == 2);
}

TEST_CASE("a client that sends nothing is dropped after its deadline", "[http]") {
  auto server = MetricsServer::start("127.0.0.1", 0, [] { return std::string("x 1\n"); });
  REQUIRE(server.is_ok());
  const uint16_t port = port_of(*server.value());
  int idle = connect_to(port);
  // Others are served meanwhile.
  CHECK(http_exchange(port, "GET /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 200", 0) == 0);
  auto start = std::chrono::steady_clock::now();
  CHECK(read_all(idle, 20000) == "");
  CHECK(std::chrono::steady_clock::now() - start >= std::chrono::seconds(3));
  close(idle);
}

TEST_CASE("out of descriptors, the server waits for them instead of spinning", "[http]") {
  auto server = MetricsServer::start("127.0.0.1", 0, [] { return std::string("x 1\n"); });
  REQUIRE(server.is_ok());
  const uint16_t port = port_of(*server.value());
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  // The server's accept fails (EMFILE) and its listener stays readable while the limit holds.
  const auto client = taiji_test::starve_server(fd, port, "GET /metrics HTTP/1.1\r\n\r\n",
                                                std::chrono::milliseconds(500));
  REQUIRE(client.limited);
  REQUIRE(client.connected);
  REQUIRE(client.sent);
  // A server polling its listener in a loop burns the whole half second.
  CHECK(client.cpu < 0.1);
  // Descriptors are back: the waiting client is served.
  CHECK(read_all(fd, 10000).rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  close(fd);
}

TEST_CASE("two servers in one process serve on their own ports", "[http]") {
  auto a = MetricsServer::start("127.0.0.1", 0, [] { return std::string("a 1\n"); });
  auto b = MetricsServer::start("127.0.0.1", 0, [] { return std::string("b 2\n"); });
  REQUIRE(a.is_ok());
  REQUIRE(b.is_ok());
  CHECK(port_of(*a.value()) != port_of(*b.value()));
  std::string ra = http_exchange(port_of(*a.value()), "GET /metrics HTTP/1.1\r\n\r\n");
  std::string rb = http_exchange(port_of(*b.value()), "GET /metrics HTTP/1.1\r\n\r\n");
  CHECK(ra.substr(ra.size() - 4) == "a 1\n");
  CHECK(rb.substr(rb.size() - 4) == "b 2\n");
  auto taken = MetricsServer::start("127.0.0.1", port_of(*a.value()), [] { return std::string(); });
  CHECK(taken.status().code() == taiji::Code::Io);
}

TEST_CASE("metrics addresses: port, :port, host:port, [v6]:port", "[config]") {
  std::string host;
  uint16_t port = 1;
  CHECK(taiji::parse_metrics_address("9400", &host, &port) == "");
  CHECK((host == "127.0.0.1" && port == 9400));
  CHECK(taiji::parse_metrics_address(":0", &host, &port) == "");
  CHECK((host == "127.0.0.1" && port == 0));
  CHECK(taiji::parse_metrics_address("0.0.0.0:80", &host, &port) == "");
  CHECK((host == "0.0.0.0" && port == 80));
  CHECK(taiji::parse_metrics_address("[::1]:81", &host, &port) == "");
  CHECK((host == "::1" && port == 81));
  CHECK(taiji::parse_metrics_address("h:65536", &host, &port) != "");
  CHECK(taiji::parse_metrics_address("h:", &host, &port) != "");
  CHECK(taiji::parse_metrics_address("::1:80", &host, &port) != "");
  CHECK(taiji::parse_metrics_address("h:8x", &host, &port) != "");
}

TEST_CASE("monitoring variables: defaults, values and errors", "[config]") {
  auto c = resolve({});
  REQUIRE(c.is_ok());
  CHECK(c.value().metrics == 1);
  CHECK(c.value().metrics_addr.empty());
  CHECK(c.value().flight_recorder_size == 256);
  CHECK(c.value().flight_recorder_dir == "/tmp");
  c = resolve({{"TAIJI_METRICS", "0"}, {"TAIJI_METRICS_ADDR", ":0"}, {"TAIJI_FLIGHT_RECORDER_SIZE", "0"},
               {"TMPDIR", "/var/tmp"}});
  REQUIRE(c.is_ok());
  CHECK(c.value().metrics == 0);
  CHECK(c.value().metrics_addr == ":0");
  CHECK(c.value().flight_recorder_size == 0);
  CHECK(c.value().flight_recorder_dir == "/var/tmp");
  CHECK(resolve({{"TAIJI_FLIGHT_RECORDER_DIR", "/x"}}).value().flight_recorder_dir == "/x");
  auto bad = resolve({{"TAIJI_METRICS", "yes"}});
  CHECK(bad.status().message() == "TAIJI_METRICS='yes' must be 0 or 1");
  bad = resolve({{"TAIJI_METRICS_ADDR", "host:port"}});
  CHECK(bad.status().code() == taiji::Code::Config);
  CHECK(bad.status().message().find("TAIJI_METRICS_ADDR='host:port'") != std::string::npos);
  bad = resolve({{"TAIJI_FLIGHT_RECORDER_SIZE", "2000000"}});
  CHECK(bad.status().message().find("TAIJI_FLIGHT_RECORDER_SIZE='2000000' is out of range") != std::string::npos);
}

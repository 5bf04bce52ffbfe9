#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "../support/descriptor_limit.h"
#include "../support/loopback_client.h"
#include "bootstrap/rendezvous.h"
#include "monitor/log.h"

using namespace taiji;
using Clock = std::chrono::steady_clock;

namespace {

int64_t ms_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

std::unique_ptr<RendezvousServer> start_server(const std::string& host = "127.0.0.1",
                                               uint16_t port = 0) {
  auto r = RendezvousServer::start(host, port);
  INFO(r.status().message());
  REQUIRE(r.is_ok());
  return std::move(r.value());
}

std::string addr(const RendezvousServer& s) { return "127.0.0.1:" + std::to_string(s.port()); }

std::unique_ptr<RendezvousClient> connect_to(const std::string& address,
                                             int64_t timeout_ms = 5000) {
  auto r = RendezvousClient::connect(address, timeout_ms);
  INFO(r.status().message());
  REQUIRE(r.is_ok());
  return std::move(r.value());
}

// A port that nothing listens on right now (it was free a moment ago).
uint16_t free_port() {
  auto s = start_server();
  return s->port();
}

std::string u32le(uint32_t v) {
  std::string s;
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return s;
}

// Bounds every blocking receive on fd: a reply cut short fails the test after timeout_ms
// instead of hanging it.
void bound_receives(int fd, int timeout_ms) {
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  REQUIRE(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0);
}

void check_round_trip(RendezvousClient& c, const std::string& key, const std::string& value) {
  REQUIRE(c.set(key, value, 5000).is_ok());
  auto got = c.get(key, 2000);
  INFO(got.status().message());
  REQUIRE(got.is_ok());
  CHECK(got.value() == value);
}

}  // namespace

TEST_CASE("rendezvous set then get returns the value", "[rendezvous]") {
  auto server = start_server();
  CHECK(server->port() != 0);
  auto c = connect_to(addr(*server));
  check_round_trip(*c, "a", "1");
  check_round_trip(*c, "empty", "");
  check_round_trip(*c, std::string(1024, 'k'), std::string(64 * 1024, 'v'));
  // A later set replaces the value.
  check_round_trip(*c, "a", "2");

  auto other = connect_to(addr(*server));
  auto got = other->get("a", 1000);
  REQUIRE(got.is_ok());
  CHECK(got.value() == "2");
}

TEST_CASE("rendezvous accepts hostnames", "[rendezvous]") {
  auto server = start_server("localhost", 0);
  auto c = connect_to("localhost:" + std::to_string(server->port()));
  check_round_trip(*c, "host", "name");
  // Peers are usually handed 127.0.0.1 even when the store was started as "localhost".
  auto v4 = connect_to("127.0.0.1:" + std::to_string(server->port()));
  check_round_trip(*v4, "host", "v4");
}

TEST_CASE("rendezvous get blocks until another client sets the key", "[rendezvous]") {
  auto server = start_server();
  auto reader = connect_to(addr(*server));
  auto writer = connect_to(addr(*server));
  auto t0 = Clock::now();
  auto setter = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    return writer->set("late", "value", 5000).is_ok();
  });
  auto got = reader->get("late", 10000);
  auto elapsed = ms_since(t0);
  REQUIRE(setter.get());
  INFO(got.status().message());
  REQUIRE(got.is_ok());
  CHECK(got.value() == "value");
  CHECK(elapsed >= 100);
  CHECK(elapsed < 5000);
}

TEST_CASE("rendezvous get of a missing key times out", "[rendezvous]") {
  auto server = start_server();
  auto c = connect_to(addr(*server));
  auto t0 = Clock::now();
  auto got = c->get("never", 200);
  auto elapsed = ms_since(t0);
  REQUIRE_FALSE(got.is_ok());
  CHECK(got.status().code() == Code::Timeout);
  CHECK(got.status().message().find("never") != std::string::npos);
  CHECK(elapsed >= 150);
  CHECK(elapsed < 3000);

  // A zero timeout answers at once.
  got = c->get("never", 0);
  CHECK(got.status().code() == Code::Timeout);

  // The connection stays usable after a timeout.
  check_round_trip(*c, "after", "timeout");
}

TEST_CASE("rendezvous serves many clients at once", "[rendezvous]") {
  auto server = start_server();
  constexpr int kClients = 16;
  std::vector<std::future<std::string>> results;
  for (int i = 0; i < kClients; ++i) {
    results.push_back(std::async(std::launch::async, [&, i]() -> std::string {
      auto cr = RendezvousClient::connect(addr(*server), 5000);
      if (!cr.is_ok()) return "connect: " + cr.status().message();
      auto& c = *cr.value();
      // Readers of later ranks start before those ranks publish.
      for (int j = 0; j < i; ++j) {
        auto got = c.get("rank/" + std::to_string(j), 10000);
        if (!got.is_ok()) return "early get: " + got.status().message();
      }
      Status s = c.set("rank/" + std::to_string(i), "addr-" + std::to_string(i), 5000);
      if (!s.is_ok()) return "set: " + s.message();
      for (int j = 0; j < kClients; ++j) {
        auto got = c.get("rank/" + std::to_string(j), 10000);
        if (!got.is_ok()) return "get: " + got.status().message();
        if (got.value() != "addr-" + std::to_string(j)) return "wrong value " + got.value();
      }
      return "";
    }));
  }
  for (auto& r : results) {
    REQUIRE(r.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
    CHECK(r.get() == "");
  }
}

TEST_CASE("rendezvous survives misbehaving clients", "[rendezvous]") {
  auto server = start_server();
  auto good = connect_to(addr(*server));
  auto waiter = connect_to(addr(*server));
  // A get parked across all the abuse below must still be answered.
  auto parked = std::async(std::launch::async, [&] { return waiter->get("final", 10000); });

  LoopbackClient silent(server->port());  // connects and sends nothing

  LoopbackClient half(server->port());  // half a request, then stays
  half.send_bytes(std::string("S") + u32le(10) + "abc");

  {
    LoopbackClient gone(server->port());  // disconnects mid-request
    gone.send_bytes(std::string("G") + u32le(5) + "ke");
  }
  {
    LoopbackClient gone_parked(server->port());  // disconnects while its get is parked
    gone_parked.send_bytes(std::string("G") + u32le(4) + "nope" + u32le(60000));
  }
  check_round_trip(*good, "k1", "v1");

  LoopbackClient garbage(server->port());
  garbage.send_bytes("hello, this is not the protocol\n");
  CHECK(garbage.closed_by_server(5000));

  LoopbackClient long_key(server->port());
  long_key.send_bytes(std::string("G") + u32le(1025));
  CHECK(long_key.closed_by_server(5000));

  LoopbackClient huge_key(server->port());
  huge_key.send_bytes(std::string("S") + u32le(0xffffffffu));
  CHECK(huge_key.closed_by_server(5000));

  LoopbackClient long_value(server->port());
  long_value.send_bytes(std::string("S") + u32le(1) + "k" + u32le(64 * 1024 + 1));
  CHECK(long_value.closed_by_server(5000));

  check_round_trip(*good, "k2", "v2");
  // The well-formed neighbours were left alone.
  CHECK_FALSE(silent.closed_by_server(50));
  CHECK_FALSE(half.closed_by_server(50));

  // The half request can be completed later.
  half.send_bytes(std::string("defghij") + u32le(1) + "x");
  char reply[5];
  pollfd p{half.fd, POLLIN, 0};
  REQUIRE(poll(&p, 1, 5000) == 1);
  bound_receives(half.fd, 10000);
  REQUIRE(recv(half.fd, reply, sizeof(reply), MSG_WAITALL) == 5);
  CHECK(reply[0] == 0);
  auto got = good->get("abcdefghij", 1000);
  REQUIRE(got.is_ok());
  CHECK(got.value() == "x");

  REQUIRE(good->set("final", "done", 5000).is_ok());
  REQUIRE(parked.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  auto final_value = parked.get();
  INFO(final_value.status().message());
  REQUIRE(final_value.is_ok());
  CHECK(final_value.value() == "done");
}

TEST_CASE("rendezvous client rejects oversized keys and values", "[rendezvous]") {
  auto server = start_server();
  auto c = connect_to(addr(*server));
  CHECK(c->set(std::string(1025, 'k'), "v", 5000).code() == Code::InvalidArgument);
  CHECK(c->set("k", std::string(64 * 1024 + 1, 'v'), 5000).code() == Code::InvalidArgument);
  CHECK(c->get(std::string(1025, 'k'), 10).status().code() == Code::InvalidArgument);
  check_round_trip(*c, "still", "fine");
}

TEST_CASE("rendezvous client retries until the server starts", "[rendezvous]") {
  uint16_t port = free_port();
  std::string address = "127.0.0.1:" + std::to_string(port);
  auto t0 = Clock::now();
  auto client = std::async(std::launch::async,
                           [&] { return RendezvousClient::connect(address, 10000); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto server = start_server("127.0.0.1", port);
  REQUIRE(client.wait_for(std::chrono::seconds(15)) == std::future_status::ready);
  auto cr = client.get();
  INFO(cr.status().message());
  REQUIRE(cr.is_ok());
  CHECK(ms_since(t0) >= 250);
  check_round_trip(*cr.value(), "late", "server");
}

TEST_CASE("rendezvous connect to a closed port fails within its deadline", "[rendezvous]") {
  uint16_t port = free_port();
  std::string address = "127.0.0.1:" + std::to_string(port);
  auto t0 = Clock::now();
  auto cr = RendezvousClient::connect(address, 300);
  auto elapsed = ms_since(t0);
  REQUIRE_FALSE(cr.is_ok());
  CHECK(cr.status().code() == Code::Bootstrap);
  CHECK(cr.status().message().find(address) != std::string::npos);
  CHECK(elapsed >= 250);
  CHECK(elapsed < 3000);

  auto bad = RendezvousClient::connect("no-port-here", 100);
  CHECK(bad.status().code() == Code::Bootstrap);
  bad = RendezvousClient::connect("127.0.0.1:0", 100);
  CHECK(bad.status().code() == Code::Bootstrap);
}

TEST_CASE("rendezvous server shutdown fails waiting clients promptly", "[rendezvous]") {
  auto server = start_server();
  auto c = connect_to(addr(*server));
  auto t0 = Clock::now();
  auto waiting = std::async(std::launch::async, [&] { return c->get("never", 20000); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  server.reset();
  REQUIRE(waiting.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  auto got = waiting.get();
  REQUIRE_FALSE(got.is_ok());
  CHECK(got.status().code() == Code::Bootstrap);
  CHECK(ms_since(t0) < 5000);
  // The broken connection reports itself instead of hanging.
  CHECK(c->set("k", "v", 5000).code() == Code::Bootstrap);
}

TEST_CASE("rendezvous server refuses an address in use", "[rendezvous]") {
  auto server = start_server();
  auto second = RendezvousServer::start("127.0.0.1", server->port());
  REQUIRE_FALSE(second.is_ok());
  CHECK(second.status().code() == Code::Bootstrap);
  CHECK(second.status().message().find(std::to_string(server->port())) != std::string::npos);
}

TEST_CASE("rendezvous store holds at most 64 MiB; past that a set is refused, gets still work",
          "[rendezvous]") {
  auto server = start_server();
  auto c = connect_to(addr(*server));
  const std::string value(kRendezvousMaxValue, 'v');
  int stored = 0;
  Status refused;
  for (int i = 0; i < 2000; ++i) {  // 2000 x 64 KiB would be 125 MiB
    Status s = c->set("big/" + std::to_string(i), value, 5000);
    if (!s.is_ok()) {
      refused = s;
      break;
    }
    ++stored;
  }
  CHECK(stored > 900);
  CHECK(stored < 1024);
  CHECK(refused.code() == Code::Bootstrap);
  CHECK_THAT(refused.message(), Catch::Contains("rejected as a bad request"));
  // Overwriting a key with a value no larger fits; the store itself still answers.
  auto other = connect_to(addr(*server));
  REQUIRE(other->set("big/0", "small", 5000).is_ok());
  auto got = other->get("big/1", 1000);
  REQUIRE(got.is_ok());
  CHECK(got.value() == value);
}

TEST_CASE("rendezvous set gives up at its own deadline when the server never answers", "[rendezvous]") {
  // A listener that accepts nothing: the connection completes in the kernel's backlog, the
  // request is buffered, and no reply ever comes.
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0);
  REQUIRE(listen(fd, 4) == 0);
  socklen_t len = sizeof(sa);
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0);
  auto c = connect_to("127.0.0.1:" + std::to_string(ntohs(sa.sin_port)));
  auto t0 = Clock::now();
  Status s = c->set("k", "v", 300);
  const int64_t elapsed = ms_since(t0);
  CHECK(s.code() == Code::Bootstrap);
  CHECK(elapsed >= 250);
  CHECK(elapsed < 5000);
  close(fd);
}

TEST_CASE("rendezvous out of descriptors waits for them instead of spinning", "[rendezvous]") {
  // With no descriptor free, UndefinedBehaviorSanitizer's vptr check (it probes memory
  // through a pipe) fails for any type it has not seen yet: nothing under the limit may
  // format a log line (the server warns of each failed accept) or assert.
  struct QuietLog {
    spdlog::level::level_enum saved = taiji::log().level();
    QuietLog() { taiji::log().set_level(spdlog::level::off); }
    ~QuietLog() { taiji::log().set_level(saved); }
  } quiet;
  auto server = start_server();
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  // The server's accept fails (EMFILE) while the limit holds.
  const auto client = taiji_test::starve_server(fd, server->port(), "S" + u32le(1) + "k" + u32le(1) + "v",
                                                std::chrono::milliseconds(500));
  REQUIRE(client.limited);
  REQUIRE(client.connected);
  REQUIRE(client.sent);
  // A server polling its listener in a loop burns the whole half second.
  CHECK(client.cpu < 0.1);
  // Descriptors are back: the waiting client's set is answered, and the value is there.
  pollfd p{fd, POLLIN, 0};
  REQUIRE(poll(&p, 1, 10000) == 1);
  char reply[5];
  bound_receives(fd, 10000);
  REQUIRE(recv(fd, reply, sizeof reply, MSG_WAITALL) == 5);
  CHECK(reply[0] == 0);
  close(fd);
  auto got = connect_to(addr(*server))->get("k", 2000);
  REQUIRE(got.is_ok());
  CHECK(got.value() == "v");
}

namespace {

std::unique_ptr<RendezvousServer> start_limited(RendezvousLimits limits) {
  auto r = RendezvousServer::start("127.0.0.1", 0, limits);
  INFO(r.status().message());
  REQUIRE(r.is_ok());
  return std::move(r.value());
}

}  // namespace

TEST_CASE("rendezvous serves at most max_clients at once; later ones wait, and lose nothing",
          "[rendezvous]") {
  RendezvousLimits limits;
  limits.max_clients = 2;
  auto server = start_limited(limits);
  // The backlog is served in order: these two take both places.
  LoopbackClient a(server->port());
  LoopbackClient b(server->port());
  LoopbackClient waiting(server->port());
  waiting.send_bytes("S" + u32le(1) + "k" + u32le(1) + "v");
  pollfd p{waiting.fd, POLLIN, 0};
  CHECK(poll(&p, 1, 300) == 0);  // not answered while both places are taken
  // Places free: the waiting connection is accepted first and its set is done.
  a.close_now();
  b.close_now();
  REQUIRE(poll(&p, 1, 10000) == 1);
  char reply[5];
  bound_receives(waiting.fd, 10000);
  REQUIRE(recv(waiting.fd, reply, sizeof reply, MSG_WAITALL) == 5);
  CHECK(reply[0] == 0);
  auto next = connect_to(addr(*server));
  auto got = next->get("k", 5000);
  INFO(got.status().message());
  REQUIRE(got.is_ok());
  CHECK(got.value() == "v");
  check_round_trip(*next, "k2", "v2");
}

TEST_CASE("rendezvous closes a client that completes no request within the idle limit",
          "[rendezvous]") {
  RendezvousLimits limits;
  limits.max_clients = 2;
  limits.idle_ms = 500;
  auto server = start_limited(limits);
  // Half a request, then nothing: its place is not held past the idle limit.
  LoopbackClient half(server->port());
  half.send_bytes("S" + u32le(1));
  LoopbackClient silent(server->port());
  auto t0 = Clock::now();
  CHECK(half.closed_by_server(10000));
  CHECK(silent.closed_by_server(10000));
  CHECK(ms_since(t0) >= 400);
  // Their places went to a client that was waiting for one.
  auto c = connect_to(addr(*server));
  check_round_trip(*c, "k", "v");
}

TEST_CASE("rendezvous idle limit spares clients that keep asking and clients parked on a get",
          "[rendezvous]") {
  RendezvousLimits limits;
  limits.idle_ms = 1000;
  auto server = start_limited(limits);
  auto c = connect_to(addr(*server));
  // Each gap is shorter than the limit, all of them together longer.
  for (int i = 0; i < 3; ++i) {
    REQUIRE(c->set("k" + std::to_string(i), "v", 5000).is_ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
  }
  // A get parked longer than the limit ends in its own timeout, not a closed connection.
  auto t0 = Clock::now();
  auto missing = c->get("missing", 1500);
  CHECK(missing.status().code() == Code::Timeout);
  CHECK(ms_since(t0) >= 1400);
  check_round_trip(*c, "k", "v");
}

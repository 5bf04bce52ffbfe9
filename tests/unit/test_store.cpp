// The embedded store's own edges over real sockets on loopback: what its client refuses
// before sending, malformed requests, the server's bounds, the wire format. The Store
// contract itself, on both backends, is in test_store_contract.cpp.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <optional>
#include <string>
#include <thread>

#include "../support/loopback_client.h"
#include "bootstrap/rendezvous.h"
#include "bootstrap/store_wire.h"

using namespace taiji;

namespace {

std::unique_ptr<RendezvousServer> start_server(RendezvousLimits limits = {}) {
  auto r = RendezvousServer::start("127.0.0.1", 0, limits);
  INFO(r.status().message());
  REQUIRE(r.is_ok());
  return std::move(r.value());
}

std::unique_ptr<RendezvousClient> connect_to(const RendezvousServer& s) {
  auto r = RendezvousClient::connect("127.0.0.1:" + std::to_string(s.port()), 5000);
  INFO(r.status().message());
  REQUIRE(r.is_ok());
  return std::move(r.value());
}

std::string u32le(uint32_t v) {
  std::string s;
  store_wire::append_u32(s, v);
  return s;
}

const std::string kBadReply = store_wire::encode_reply(store_wire::kStatusBadRequest, {});

}  // namespace

TEST_CASE("store client refuses oversized keys and values before sending", "[store]") {
  auto server = start_server();
  auto c = connect_to(*server);
  const std::string long_key(kRendezvousMaxKey + 1, 'k');
  const std::string long_value(kRendezvousMaxValue + 1, 'v');
  CHECK(c->add(long_key, 1, 1000).status().code() == Code::InvalidArgument);
  CHECK(c->compare_and_set(long_key, std::nullopt, "v", 1000).status().code() ==
        Code::InvalidArgument);
  CHECK(c->compare_and_set("k", long_value, "v", 1000).status().code() == Code::InvalidArgument);
  CHECK(c->compare_and_set("k", std::nullopt, long_value, 1000).status().code() ==
        Code::InvalidArgument);
  CHECK(c->remove(long_key, 1000).status().code() == Code::InvalidArgument);
  CHECK(c->watch(long_key, std::nullopt, 1000).status().code() == Code::InvalidArgument);
  CHECK(c->watch("k", long_value, 1000).status().code() == Code::InvalidArgument);
  CHECK(c->add("k", 1, 1000).value() == 1);
}

TEST_CASE("store server closes a malformed request's connection and nothing else", "[store]") {
  auto server = start_server();
  auto good = connect_to(*server);
  REQUIRE(good->set("k", "abc", 2000).is_ok());
  LoopbackClient truncated(server->port());
  truncated.send_bytes("C" + u32le(1) + "k" + std::string(1, '\0') + u32le(3) + "ab");

  struct Case {
    const char* what;
    std::string bytes;
  };
  const Case cases[] = {
      {"unknown request type", "X" + u32le(1) + "k"},
      {"oversized key", "A" + u32le(kRendezvousMaxKey + 1)},
      {"oversized expected value", "C" + u32le(1) + "k" + std::string(1, '\0') +
                                       u32le(kRendezvousMaxValue + 1)},
      {"oversized new value", "C" + u32le(1) + "k" + std::string(1, '\0') + u32le(0) +
                                  u32le(kRendezvousMaxValue + 1)},
      {"oversized known value", "W" + u32le(1) + "k" + u32le(100) + std::string(1, '\0') +
                                    u32le(kRendezvousMaxValue + 1)},
      {"unknown flags", "C" + u32le(1) + "k" + std::string(1, '\x02')},
      {"absent with a value", "W" + u32le(1) + "k" + u32le(100) + std::string(1, '\x01') +
                                  u32le(1) + "x"},
  };
  for (const Case& bad : cases) {
    INFO(bad.what);
    LoopbackClient s(server->port());
    s.send_bytes(bad.bytes);
    auto got = s.until_closed(5000);
    REQUIRE(got.has_value());
    CHECK(*got == kBadReply);
  }
  // The truncated request was left alone, and completes when the rest arrives.
  REQUIRE_FALSE(truncated.until_closed(50).has_value());
  truncated.send_bytes("c" + u32le(1) + "z");
  pollfd p{truncated.fd, POLLIN, 0};
  REQUIRE(poll(&p, 1, 5000) == 1);
  timeval tv{5, 0};
  REQUIRE(setsockopt(truncated.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0);
  char reply[8];
  REQUIRE(recv(truncated.fd, reply, sizeof(reply), MSG_WAITALL) == 8);
  CHECK(reply[0] == store_wire::kStatusOk);
  CHECK(store_wire::read_u32(reply + 1) == 3);  // swapped, present, "z"
  CHECK(good->get("k", 1000).value() == "z");
}

TEST_CASE("store bounds its keys and its watchers", "[store]") {
  RendezvousLimits limits;
  limits.max_keys = 2;
  limits.max_watchers = 2;
  auto server = start_server(limits);
  auto c = connect_to(*server);
  REQUIRE(c->set("a", "1", 2000).is_ok());
  REQUIRE(c->add("b", 1, 2000).is_ok());
  auto add = c->add("c", 1, 2000);
  CHECK(add.status().code() == Code::Bootstrap);
  CHECK_THAT(add.status().message(), Catch::Contains("2 keys"));
  CHECK(c->compare_and_set("c", std::nullopt, "x", 2000).status().code() == Code::Bootstrap);
  // Refusals keep the connection; keys already there still change.
  CHECK(c->add("b", 1, 2000).value() == 2);
  CHECK(c->compare_and_set("a", std::string("1"), "2", 2000).value().swapped);
  // A set of a new key past the bound is treated as a full store's set: the connection goes.
  auto setter = connect_to(*server);
  Status set = setter->set("c", "x", 2000);
  CHECK(set.code() == Code::Bootstrap);
  CHECK_THAT(set.message(), Catch::Contains("rejected as a bad request"));
  // Deleting frees a place.
  REQUIRE(c->remove("a", 2000).value());
  CHECK(c->add("c", 5, 2000).value() == 5);

  auto w1 = connect_to(*server);
  auto w2 = connect_to(*server);
  auto p1 = std::async(std::launch::async, [&] { return w1->watch("b", std::string("2"), 10000); });
  auto p2 = std::async(std::launch::async, [&] { return w2->watch("b", std::string("2"), 10000); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto third = c->watch("b", std::string("2"), 10000);
  CHECK(third.status().code() == Code::Bootstrap);
  CHECK_THAT(third.status().message(), Catch::Contains("2 watches"));
  // A change answers every parked watch; then there is room for more.
  REQUIRE(c->add("b", 1, 2000).value() == 3);
  for (auto* p : {&p1, &p2}) {
    REQUIRE(p->wait_for(std::chrono::seconds(10)) == std::future_status::ready);
    CHECK(p->get().value() == std::optional<std::string>("3"));
  }
  CHECK(c->watch("b", std::string("2"), 1000).value() == std::optional<std::string>("3"));
}

TEST_CASE("store wire: every request parses back, and every prefix is incomplete", "[store]") {
  using namespace store_wire;
  Request set{'S', "key", "value", "", false, 0, 0};
  Request get{'G', "key", "", "", false, 1234, 0};
  Request add{'A', "n", "", "", false, 0, -5};
  Request cas{'C', "k", "new", "old", false, 0, 0};
  Request cas_absent{'C', "k", "new", "", true, 0, 0};
  Request del{'D', "k", "", "", false, 0, 0};
  Request watch{'W', "k", "", "known", false, 77, 0};
  for (const Request& req : {set, get, add, cas, cas_absent, del, watch}) {
    const std::string bytes = encode_request(req);
    INFO(req.op);
    for (size_t n = 0; n < bytes.size(); ++n) {
      Request out;
      size_t used = 0;
      std::string why;
      CHECK(parse_request(std::string_view(bytes).substr(0, n), &out, &used, &why) ==
            Parse::Incomplete);
    }
    Request out;
    size_t used = 0;
    std::string why;
    REQUIRE(parse_request(bytes + "trailing", &out, &used, &why) == Parse::Done);
    CHECK(used == bytes.size());
    CHECK(out.op == req.op);
    CHECK(out.key == req.key);
    CHECK(out.value == req.value);
    CHECK(out.expected == req.expected);
    CHECK(out.absent == req.absent);
    CHECK(out.timeout_ms == req.timeout_ms);
    CHECK(out.delta == req.delta);
  }
  // The set and get encodings are the ones the store always had.
  CHECK(encode_request(set) == "S" + u32le(3) + "key" + u32le(5) + "value");
  CHECK(encode_request(get) == "G" + u32le(3) + "key" + u32le(1234));
}

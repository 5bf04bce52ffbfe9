// What is etcd's own in the Store backend over a real etcd (tests/support/store_backends.h
// starts it): prefixes keep jobs apart, bad addresses, an etcd that is not there, and the
// address parsing of open_store. The Store contract on both backends is in
// test_store_contract.cpp.

#include <catch2/catch.hpp>
#include <chrono>
#include <string>

#include "bootstrap/rendezvous.h"
#include "bootstrap/store_open.h"
#include "../support/store_backends.h"

using namespace taiji;
using Clock = std::chrono::steady_clock;

namespace {

std::unique_ptr<Store> open(const std::string& prefix) {
  auto s = open_store(taiji_test::etcd_address(prefix), 5000);
  INFO(s.status().message());
  REQUIRE(s.is_ok());
  return std::move(s.value());
}

int64_t ms_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

}  // namespace

TEST_CASE("etcd store: prefixes keep jobs apart; a negative timeout is refused", "[etcd]") {
  auto s = open("watch");
  auto other = open("watch-other");
  REQUIRE(s->set("k", "a", 2000).is_ok());
  CHECK(other->watch("k", std::nullopt, 200).status().code() == Code::Timeout);
  CHECK(other->get("k", 0).status().code() == Code::Timeout);
  CHECK_FALSE(other->remove("k", 2000).value());
  CHECK(s->get("k", 2000).value() == "a");
  CHECK(s->watch("k", std::nullopt, -1).status().code() == Code::InvalidArgument);
}

TEST_CASE("etcd store: bad input and an etcd that is not there", "[etcd]") {
  auto s = open("bad");
  CHECK(s->set(std::string(kRendezvousMaxKey + 1, 'k'), "v", 2000).code() == Code::InvalidArgument);
  CHECK(s->set("k", std::string(kRendezvousMaxValue + 1, 'v'), 2000).code() == Code::InvalidArgument);
  for (const char* address : {"etcd://", "etcd://host", "etcd://host:0/p", "etcd://host:99999/p",
                              "etcd://:2379/p", "etcd://host:23x9/p", "zk://host:1/p", "nocolon"}) {
    auto r = open_store(address, 1000);
    INFO(address << ": " << r.status().message());
    CHECK(r.status().code() == Code::InvalidArgument);
    CHECK_THAT(r.status().message(), Catch::Contains(address));
  }
  const int closed = taiji_test::unused_port();
  const auto t0 = Clock::now();
  auto none = open_store("etcd://127.0.0.1:" + std::to_string(closed) + "/x", 500);
  CHECK(none.status().code() == Code::Bootstrap);
  CHECK_THAT(none.status().message(), Catch::Contains("127.0.0.1:" + std::to_string(closed)));
  CHECK(ms_since(t0) < 3000);
}

TEST_CASE("open_store gives the embedded store for host:port", "[etcd]") {
  auto server = RendezvousServer::start("127.0.0.1", 0);
  REQUIRE(server.is_ok());
  auto s = open_store("127.0.0.1:" + std::to_string(server.value()->port()), 2000);
  REQUIRE(s.is_ok());
  REQUIRE(s.value()->set("k", "v", 2000).is_ok());
  CHECK(s.value()->get("k", 2000).value() == "v");
}
